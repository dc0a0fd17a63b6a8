"""``DemoOptions``: everything one demo app needs (``sapiens2 demo`` parses its flags into one)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..metadata import SAMPLE_IMAGE
from ..predict.options import OptionText, check_device, check_input_size, python_option
from ..tasks import TASKS, check_task

__all__ = ["DemoOptions", "SAMPLE_IMAGES"]

SAMPLE_IMAGES = (SAMPLE_IMAGE, SAMPLE_IMAGE.parent / "camera.jpg")
"""The photos the page offers at first start (packaged; free licences in ``sapiens2/assets/README.md``)."""

_DTYPES = ("fp32", "bf16", "fp16")


@dataclass(frozen=True, kw_only=True)
class DemoOptions:
    """What the demo loads and how it serves; the ``sapiens2 demo`` flag is in brackets.

    Model fields are named as in ``PredictOptions``, so models are found and loaded exactly as ``predict`` does.

    Args:
        model: size (0.4b, 0.8b, 1b, 5b), repo id, file or folder for every task not in ``models`` [``--model``].
        models: task -> model source for single tasks [``--model pose=PATH``].
        device: cpu, cuda, cuda:1 ...; None: CUDA if available [``--device``].
        dtype: inference precision, fp32, bf16 or fp16 [``--dtype``].
        input_size: network input (H, W) in pixels, multiples of 16; None: the model's own
            [``--input-size H W``].
        batch_size: person crops per forward pass (pose) [``--batch-size``].
        mode, compile, quantize: the network's mode, ``torch.compile`` and low-precision blocks, as ``Predictor``
            takes them [``--mode``, ``--compile``, ``--quantize``].
        threads: torch's CPU threads; None: one per core this process may use (``Predictor``'s ``threads``)
            [``--threads``].
        detector: "rtmdet" (downloaded once), a local rtmdet_m.pth, or "none" (the whole image as one person)
            [``--detector``].
        flip_test: average with the horizontally flipped crop (pose) [off: ``--no-flip-test``].
        host: the address to serve on; 127.0.0.1 keeps the page on this machine, 0.0.0.0 opens it to the
            network [``--host``].
        port: the port; None: Gradio's (7860, or the next free one) [``--port``].
        share: also open a public https://*.gradio.live link through Gradio's free share service; off by default,
            so nothing leaves the machine [``--share``; ``--share-free`` says "off" explicitly].
        tasks: the tasks ticked when the page opens.
        samples: the sample photos offered on the page.
        max_megapixels: larger images are refused with a message (decoding and the full-size results of one
            image take about 100 bytes per pixel) [``--max-megapixels``].
        max_file_mb: larger uploads are refused [``--max-file-mb``].
        queue_size: requests waiting beyond this are turned away (each sees its place in the queue) [``--queue-size``].
        max_video_frames: the video tab processes at most this many frames of a clip [``--max-video-frames``].
        max_kept_results: pages whose last results the server keeps in memory, for the seg class toggles and the
            keypoint-set choice; the least recently used go first [``--max-kept-results``].
        max_kept_mb: megabytes of those results kept at most (a 12-megapixel photo's take ~180 MB; the newest is
            always kept) [``--max-kept-mb``].
    """

    model: str | os.PathLike = "1b"
    models: Mapping[str, str | os.PathLike] = field(default_factory=dict)
    device: str | None = None
    dtype: str = "fp32"
    input_size: tuple[int, int] | None = None
    batch_size: int = 4
    mode: str | None = None
    compile: bool = False
    quantize: str | None = None
    threads: int | None = None
    detector: str | os.PathLike = "rtmdet"
    flip_test: bool = True
    host: str = "127.0.0.1"
    port: int | None = None
    share: bool = False
    tasks: Sequence[str] = ("pose", "seg")
    samples: Sequence[str | os.PathLike] = SAMPLE_IMAGES
    max_megapixels: float = 40.0
    max_file_mb: float = 50.0
    queue_size: int = 16
    max_video_frames: int = 150
    max_kept_results: int = 16
    max_kept_mb: float = 1024.0

    def __post_init__(self) -> None:  # frozen: normalise once, here
        set_field = object.__setattr__
        set_field(self, "models", dict(self.models))
        if self.input_size is not None:
            set_field(self, "input_size", tuple(int(v) for v in self.input_size))
        set_field(self, "tasks", (self.tasks,) if isinstance(self.tasks, str) else tuple(self.tasks))
        set_field(self, "samples", tuple(Path(p) for p in self.samples))

    def check(self, option: OptionText = python_option) -> None:
        """Refuse options that cannot work, before anything loads; ``option`` names them in the caller's words.

        Raises:
            ValueError: an unknown task, a model or detector file that does not exist, a bad dtype, device, input
                size, port or limit.
        """
        for task in self.models:
            if task not in TASKS:
                try:
                    check_task(task)
                except ValueError as error:
                    raise ValueError(f"{option('models', {task: self.models[task]})}: {error}") from None
        for task in self.tasks:
            if task not in TASKS:
                try:
                    check_task(task)
                except ValueError as error:
                    raise ValueError(f"{option('tasks', ','.join(self.tasks))}: {error}") from None
        if self.dtype not in _DTYPES:
            raise ValueError(f"{option('dtype', self.dtype)}: choose one of {', '.join(_DTYPES)}")
        check_device(self.device, option)
        check_input_size(self.input_size, option=option)
        detector = os.fspath(self.detector)
        if detector not in ("rtmdet", "none") and not Path(detector).expanduser().is_file():
            raise ValueError(
                f"{option('detector', detector)}: no such file; give a local rtmdet_m.pth, rtmdet (downloaded once) "
                "or none (the whole image as one person)"
            )
        self._check_model_files(option)
        if self.batch_size < 1:
            raise ValueError(f"{option('batch_size', self.batch_size)}: must be >= 1")
        if self.port is not None and not 1 <= self.port <= 65535:
            raise ValueError(f"{option('port', self.port)}: a port is 1 to 65535")
        for name in ("max_megapixels", "max_file_mb", "queue_size", "max_video_frames", "max_kept_results",
                     "max_kept_mb"):  # fmt: skip
            if not getattr(self, name) > 0:
                raise ValueError(f"{option(name, getattr(self, name))}: must be > 0")
        missing = [str(path) for path in self.samples if not path.is_file()]
        if missing:
            raise ValueError(f"{option('samples')}: no such file: {', '.join(missing)}")

    def _check_model_files(self, option: OptionText) -> None:
        """A model file that does not exist is refused now, not on the page's first request (nothing downloads)."""
        from ..checkpoints import CheckpointNotFoundError, locate_checkpoint

        given = [(option("model", self.model), self.model, "pretrain")]  # for every task: an existing path is fine
        given += [(option("models", {task: source}), source, task) for task, source in self.models.items()]
        for flag, source, task in given:
            if isinstance(source, (str, os.PathLike)) and not Path(source).expanduser().exists():
                try:
                    locate_checkpoint(source, task)
                except CheckpointNotFoundError as error:
                    raise ValueError(f"{flag}: {error}") from None

    def source(self, task: str) -> str:
        """The model source of ``task``, as the page shows it."""
        return os.fspath(self.models.get(task, self.model))
