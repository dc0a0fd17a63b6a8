"""``ServeOptions``: everything one service needs (``sapiens2 serve`` parses its flags into one), its checks, and
its form as a Ray Serve config file (``serve run`` / ``serve deploy``)."""

from __future__ import annotations

import dataclasses
import errno
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..predict.options import OptionText, check_input_size, python_option
from ..tasks import TASKS, check_task

__all__ = ["IMPORT_PATH", "ServeOptions", "config_file_text", "replica_devices"]

IMPORT_PATH = "sapiens2.serve.app:build"
"""The application builder a Ray Serve config file names (``import_path``); its ``args`` are ``ServeOptions``."""

_DTYPES = ("fp32", "bf16", "fp16")
KEYPOINT_FORMATS = ("sapiens308", "coco17", "coco_wholebody133", "openpose25")


@dataclass(frozen=True, kw_only=True)
class ServeOptions:
    """What the service loads and how it serves; the ``sapiens2 serve`` flag is in brackets.

    Model fields are named as in ``PredictOptions``, so models are found and loaded exactly as ``predict`` does
    (``predict.batch.make_predictors``), with the same pre/post-processing.

    Args:
        tasks: the tasks served, ``POST /v1/{task}`` for each [``--task pose,seg``].
        model, models, dtype, input_size, mode, compile, quantize, detector, flip_test: as ``PredictOptions``
            [``--model``, ``--dtype`` ...]. ``device`` is not one: replicas are placed by ``devices``.
        batch_size: person crops per forward pass (pose) [``--batch-size``].
        devices: one model replica per device: ``all`` (every GPU, else one CPU replica), ``0,1``, ``cuda:0``,
            ``cpu`` or ``cpu:N`` (N CPU replicas); None: ``all`` [``--devices``].
        threads: torch threads per CPU replica; None: the cores divided among the CPU replicas [``--threads``].
        host: the address to listen on; 127.0.0.1 (default) is this machine only, 0.0.0.0 the network [``--host``].
        port: the HTTP port [``--port``].
        max_batch: images of one task run together in one ``Predictor`` batch, from any requests [``--max-batch``].
        max_wait_ms: how long a batch waits to fill before it runs [``--max-wait-ms``].
        max_queue: requests inside the service at once (waiting or running); more are answered 503 with
            ``Retry-After`` at once, so memory stays bounded [``--max-queue``].
        max_megapixels: refuse larger images, judged from the header before decoding [``--max-megapixels``].
        max_upload_mb: refuse larger request bodies, from ``Content-Length`` before reading [``--max-upload-mb``].
        token: a bearer token every ``/v1`` and ``/metrics`` request must carry; None: no authentication
            [``--token``, or ``$SAPIENS2_SERVE_TOKEN``].
        allow_urls: URL prefixes the service may fetch an image from (``{"url": ...}`` bodies); empty: no fetching
            at all, so the service cannot be made to reach anything [``--allow-url``, repeatable].
        keypoint_format: the pose keypoint set when a request names none [``--keypoint-format``].
        request_timeout_s: a request still unanswered after this is answered 504 [``--request-timeout``].
        drain_s: on shutdown, how long in-flight requests may take to finish [``--drain``].
    """

    tasks: Sequence[str] = ("pose", "seg")
    model: str | os.PathLike = "1b"
    models: Mapping[str, str | os.PathLike] = field(default_factory=dict)
    dtype: str = "fp32"
    input_size: tuple[int, int] | None = None
    batch_size: int = 8
    mode: str | None = None
    compile: bool = False
    quantize: str | None = None
    detector: str | os.PathLike = "rtmdet"
    flip_test: bool = True
    devices: str | None = None
    threads: int | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    max_batch: int = 8
    max_wait_ms: float = 10.0
    max_queue: int = 64
    max_megapixels: float = 40.0
    max_upload_mb: float = 50.0
    token: str | None = None
    allow_urls: Sequence[str] = ()
    keypoint_format: str = "sapiens308"
    request_timeout_s: float = 120.0
    drain_s: float = 30.0

    def __post_init__(self) -> None:  # frozen: normalise once, here (also what a YAML file's lists become)
        set_field = object.__setattr__
        set_field(self, "tasks", (self.tasks,) if isinstance(self.tasks, str) else tuple(self.tasks))
        set_field(self, "models", {k: os.fspath(v) for k, v in dict(self.models).items()})
        set_field(self, "model", os.fspath(self.model))
        set_field(self, "detector", os.fspath(self.detector))
        allow = (self.allow_urls,) if isinstance(self.allow_urls, str) else tuple(self.allow_urls)
        set_field(self, "allow_urls", allow)
        if self.input_size is not None:
            set_field(self, "input_size", tuple(int(v) for v in self.input_size))

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], where: str = "args") -> ServeOptions:
        """Options from plain data (a config file's ``args``): unknown keys are refused with the known ones."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"{where}: unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (YAML/JSON-ready) that ``from_dict`` reads back; the token is left out (see ``token``)."""
        data = dataclasses.asdict(self)
        data.pop("token")
        for key, value in data.items():
            if isinstance(value, tuple):
                data[key] = list(value)
        return data

    def check(self, option: OptionText = python_option) -> None:
        """Refuse options that cannot work, before anything starts; ``option`` names them in the caller's words.

        Raises:
            ValueError: an unknown task, dtype, device list, input size, detector file, port, limit or URL prefix.
        """
        if not self.tasks:
            raise ValueError(f"{option('tasks', '')}: name at least one task of {', '.join(TASKS)}")
        for task in self.models:
            try:
                check_task(task)
            except ValueError as error:
                raise ValueError(f"{option('models', {task: self.models[task]})}: {error}") from None
        for task in self.tasks:
            try:
                check_task(task)
            except ValueError as error:
                raise ValueError(f"{option('tasks', ','.join(self.tasks))}: {error}") from None
        if self.dtype not in _DTYPES:
            raise ValueError(f"{option('dtype', self.dtype)}: choose one of {', '.join(_DTYPES)}")
        try:
            replica_devices(self.devices)
        except ValueError as error:
            raise ValueError(f"{option('devices', self.devices)}: {error}") from None
        check_input_size(self.input_size, option=option)
        if self.detector not in ("rtmdet", "none") and not Path(self.detector).expanduser().is_file():
            raise ValueError(
                f"{option('detector', self.detector)}: no such file; give a local rtmdet_m.pth, rtmdet (downloaded "
                "once) or none (the whole image as one person)"
            )
        if self.keypoint_format not in KEYPOINT_FORMATS:
            choices = ", ".join(KEYPOINT_FORMATS)
            raise ValueError(f"{option('keypoint_format', self.keypoint_format)}: choose one of {choices}")
        if not 1 <= int(self.port) <= 65535:
            raise ValueError(f"{option('port', self.port)}: a port is 1 to 65535")
        for name in ("batch_size", "max_batch", "max_queue"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{option(name, getattr(self, name))}: must be >= 1")
        if self.threads is not None and int(self.threads) < 1:
            raise ValueError(f"{option('threads', self.threads)}: must be >= 1")
        for name in ("max_megapixels", "max_upload_mb", "request_timeout_s"):
            if not float(getattr(self, name)) > 0:
                raise ValueError(f"{option(name, getattr(self, name))}: must be > 0")
        for name in ("max_wait_ms", "drain_s"):
            if not float(getattr(self, name)) >= 0:
                raise ValueError(f"{option(name, getattr(self, name))}: must be >= 0")
        for prefix in self.allow_urls:
            parts = urlsplit(prefix)
            if parts.scheme not in ("http", "https") or not parts.hostname or not parts.path.endswith("/"):
                raise ValueError(
                    f"{option('allow_urls', prefix)}: give a URL prefix with scheme, host and a path ending in /, "
                    "e.g. https://images.example.com/public/"
                )

    def check_listen(self, option: OptionText = python_option) -> None:
        """Refuse a ``host:port`` this machine cannot listen on now, tried with a bind as the HTTP server will do it,
        before anything starts (Ray Serve would fail only after ~30 s, without naming the port, or share it with the
        other program: its socket takes SO_REUSEPORT).

        Raises:
            ValueError: the port is in use, or the host is not an address of this machine.
        """
        address = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
        with socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server: TIME_WAIT is no conflict
            try:
                probe.bind((self.host, int(self.port)))
            except OSError as error:
                if error.errno == errno.EADDRINUSE:
                    raise ValueError(f"{option('port', self.port)}: {address} is in use by another program; stop it, "
                                     f"or choose a free port with {option('port')}") from None  # fmt: skip
                raise ValueError(f"{option('host', self.host)}: cannot listen on {address}: {error.strerror}; give an "
                                 "address of this machine (127.0.0.1, or 0.0.0.0 for every one)") from None  # fmt: skip

    def source(self, task: str) -> str:
        return os.fspath(self.models.get(task, self.model))


def replica_devices(devices: str | None) -> list[str]:
    """``devices`` text -> one device per model replica: ``cuda`` (Ray gives each GPU replica its own GPU) or
    ``cpu``. ``all``/None: one per GPU of this machine, else one CPU replica; ``cpu:N``: N CPU replicas.

    Raises:
        ValueError: malformed text, or more GPUs than this machine has (the message omits the option name).
    """
    import torch

    text = (devices or "all").strip().lower()
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if text == "all":
        return ["cuda"] * gpus or ["cpu"]
    if text.startswith("cpu"):
        count = text.partition(":")[2] or "1"
        if not count.isdigit() or int(count) < 1:
            raise ValueError(f"{text!r}: give cpu:N with N >= 1 CPU replicas, e.g. cpu:2")
        return ["cpu"] * int(count)
    parts = [part.strip() for part in text.split(",") if part.strip()]
    for part in parts:
        index = part.partition(":")[2] if part.startswith("cuda") else part
        if not (index or "0").isdigit():
            raise ValueError(f"{part!r}: not a device; use all, a list of GPU numbers (0,1), cuda:N or cpu:N")
    if len(parts) > gpus:
        raise ValueError(f"{len(parts)} GPU replica(s) asked for, this machine has {gpus} GPU(s)")
    return ["cuda"] * len(parts)


def config_file_text(options: ServeOptions, name: str = "sapiens2") -> str:
    """A Ray Serve config file for ``options`` (``serve run FILE`` locally, ``serve deploy FILE`` on a cluster):
    the HTTP address and one application built by ``IMPORT_PATH`` from the options as ``args``."""
    import yaml

    config = {
        "http_options": {"host": options.host, "port": int(options.port)},
        "applications": [{"name": name, "route_prefix": "/", "import_path": IMPORT_PATH, "args": options.to_dict()}],
    }
    return yaml.safe_dump(config, sort_keys=False)
