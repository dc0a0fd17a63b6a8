"""A small client for ``sapiens2 serve``: ``Client(url).predict("seg", "photo.jpg")`` returns the result object
``Predictor("seg")("photo.jpg")`` returns (the Python standard library only: no Ray, no web framework)."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .codec import decode_result

__all__ = ["Client", "ServeError"]


class ServeError(RuntimeError):
    """An error answer of the service: ``status`` (HTTP), ``message`` (its one line), ``retry_after`` (seconds, for
    503s)."""

    def __init__(self, status: int, message: str, retry_after: float | None = None) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status, self.message, self.retry_after = status, message, retry_after


def _encode(image: Any) -> tuple[bytes, str]:
    """(encoded bytes, name) of a path, encoded bytes, or an (H, W, 3) uint8 RGB array (sent as a lossless PNG)."""
    if isinstance(image, (str, os.PathLike)):
        return Path(image).read_bytes(), Path(image).name
    if isinstance(image, (bytes, bytearray, memoryview)):
        return bytes(image), "image"
    if isinstance(image, np.ndarray):
        import cv2

        from ..data.io import to_rgb_array

        ok, data = cv2.imencode(".png", cv2.cvtColor(to_rgb_array(image), cv2.COLOR_RGB2BGR))
        if not ok:
            raise ValueError("could not encode the array as PNG")
        return data.tobytes(), "image.png"
    raise TypeError(f"image must be a path, encoded bytes or an HxWx3 uint8 RGB array, not {type(image).__name__}")


class Client:
    """Call a ``sapiens2 serve`` service.

    Args:
        url: the service, e.g. ``http://127.0.0.1:8000``.
        token: the bearer token, if the service has one (default ``$SAPIENS2_SERVE_TOKEN``).
        timeout: seconds to wait for an answer.
        retries: how many times a 503 (service full, replica restarting) is retried, after its ``Retry-After``.

    Example:
        >>> client = Client("http://127.0.0.1:8000")
        >>> seg = client.predict("seg", "photo.jpg")  # SegResult, as Predictor("seg")("photo.jpg")
        >>> both = client.predict(["pose", "seg"], "photo.jpg")  # {"pose": PoseResult, "seg": SegResult}
    """

    def __init__(self, url: str, token: str | None = None, timeout: float = 120.0, retries: int = 0) -> None:
        self.url = url.rstrip("/")
        self.token = token if token is not None else os.environ.get("SAPIENS2_SERVE_TOKEN")
        self.timeout = timeout
        self.retries = retries

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> Any:
        """One HTTP request; the decoded JSON answer (text for ``/metrics``). Raises ``ServeError`` for errors."""
        headers = dict(headers or {})
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        for attempt in range(self.retries + 1):
            request = urllib.request.Request(self.url + path, data=body, headers=headers, method=method)
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    data = response.read()
                    kind = response.headers.get("content-type", "")
                return json.loads(data) if kind.startswith("application/json") else data.decode()
            except urllib.error.HTTPError as error:
                text = error.read().decode(errors="replace")
                try:
                    message = json.loads(text).get("error", text)
                except (ValueError, AttributeError):
                    message = text
                retry_after = error.headers.get("Retry-After")
                retry_after = float(retry_after) if retry_after and retry_after.replace(".", "").isdigit() else None
                if error.code == 503 and attempt < self.retries:
                    time.sleep(retry_after or 1.0)
                    continue
                raise ServeError(error.code, message, retry_after) from None
        raise AssertionError("unreachable")

    def predict_raw(self, tasks: str | Sequence[str], image: Any, *, format: str | None = None,
                    keypoint_format: str | None = None) -> dict:  # fmt: skip
        """The service's JSON answer for ``tasks`` on ``image`` (see ``sapiens2.serve.codec``)."""
        names = [tasks] if isinstance(tasks, str) else list(tasks)
        data, name = _encode(image)
        query = "&".join(f"{key}={value}" for key, value in (("format", format), ("keypoint_format", keypoint_format))
                         if value is not None)  # fmt: skip
        path = f"/v1/{','.join(names)}" + (f"?{query}" if query else "")
        headers = {"Content-Type": "application/octet-stream", "X-Filename": name}
        return self.request("POST", path, data, headers)

    def predict(self, tasks: str | Sequence[str], image: Any, *, format: str | None = None,
                keypoint_format: str | None = None) -> Any:  # fmt: skip
        """``Predictor``'s result object for one task (a str), or ``{task: result}`` for a list of tasks.

        Args:
            tasks: ``"seg"`` or ``["pose", "seg"]`` (the image is sent and decoded once for all of them).
            image: a file path, encoded image bytes, or an (H, W, 3) uint8 RGB array (sent as PNG).
            format: default the exact arrays (seg as PNG class ids, the others ``npy``); ``npy``, seg's ``rle``;
                ``png`` pictures and ``exr`` files of the other tasks come back as ``{name: bytes}``.
            keypoint_format: the pose keypoint set (default the service's).
        """
        answer = self.predict_raw(tasks, image, format=format, keypoint_format=keypoint_format)
        path = os.fspath(image) if isinstance(image, (str, os.PathLike)) else None
        results = {task: decode_result(data, path) for task, data in answer["results"].items()}
        return results[tasks] if isinstance(tasks, str) else results

    def healthy(self) -> bool:
        try:
            return self.request("GET", "/healthz").get("status") == "ok"
        except (ServeError, OSError):
            return False

    def ready(self) -> bool:
        try:
            return self.request("GET", "/readyz").get("status") == "ready"
        except (ServeError, OSError):
            return False

    def metrics(self) -> str:
        """The Prometheus text of ``/metrics``."""
        return self.request("GET", "/metrics")
