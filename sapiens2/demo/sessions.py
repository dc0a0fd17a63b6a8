"""What the demo server keeps between requests, bounded: each page's last results (for the seg class toggles and the
keypoint-set choice) in memory, and each request's files on disk (for download), under one private temporary folder
that goes when the server stops.

A page holds only a key (``gr.State``); the arrays live here, at most ``max_count`` results and ``max_bytes`` bytes
together, the least recently used dropped first. A 12-megapixel photo's full-size results take ~180 MB, so without
a bound a busy server's memory grows by that much per visitor for as long as the session lives.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import threading
import uuid
import weakref
from collections import OrderedDict, deque
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["RequestFolders", "ResultStore", "array_bytes"]


def array_bytes(value: Any, _depth: int = 0) -> int:
    """Bytes of the numpy arrays and torch tensors inside ``value`` (dataclasses, dicts, lists and tuples followed;
    a dataclass field marked ``metadata={"shared": True}`` is not: it belongs to the model, e.g. its label set)."""
    if _depth > 8:
        return 0
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if hasattr(value, "element_size") and hasattr(value, "nelement"):  # a torch.Tensor, without importing torch
        return int(value.element_size() * value.nelement())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = [f for f in dataclasses.fields(value) if not f.metadata.get("shared")]
        return sum(array_bytes(getattr(value, f.name), _depth + 1) for f in fields)
    if isinstance(value, dict):
        return sum(array_bytes(item, _depth + 1) for item in value.values())
    if isinstance(value, list | tuple):
        return sum(array_bytes(item, _depth + 1) for item in value)
    return 0


class ResultStore:
    """Key -> a request's results, at most ``max_count`` of them and ``max_bytes`` together (least recently used
    dropped first; the newest is always kept, whatever its size). Thread-safe.

    Args:
        max_count: results kept at most.
        max_bytes: bytes of arrays kept at most (``array_bytes``).
    """

    def __init__(self, max_count: int, max_bytes: int) -> None:
        self.max_count = max_count
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, value: Any, replaces: str | None = None) -> str:
        """Keep ``value`` (dropping ``replaces``, the page's previous key) and return its new key."""
        key = uuid.uuid4().hex
        size = array_bytes(value)
        with self._lock:
            if replaces is not None:
                self._items.pop(replaces, None)
            self._items[key] = (value, size)
            while len(self._items) > 1 and (len(self._items) > self.max_count or self._total() > self.max_bytes):
                self._items.popitem(last=False)
        return key

    def get(self, key: str | None) -> Any:
        """The value of ``key`` (now the most recently used), or None when it was dropped or never kept."""
        with self._lock:
            if key not in self._items:
                return None
            self._items.move_to_end(key)
            return self._items[key][0]

    def drop(self, key: str | None) -> None:
        """Forget ``key`` (a page closed or its session expired)."""
        with self._lock:
            self._items.pop(key, None)

    def _total(self) -> int:
        return sum(size for _, size in self._items.values())

    def __len__(self) -> int:
        return len(self._items)

    @property
    def nbytes(self) -> int:
        """Bytes of arrays kept now."""
        with self._lock:
            return self._total()


def _folder_bytes(folder: Path) -> int:
    total = 0
    for root, _, names in os.walk(folder):
        for name in names:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


class RequestFolders:
    """One folder per request under a private temporary root; only the newest ``keep`` folders and ``max_bytes`` of
    files survive (the newest always). ``close()`` removes the root; so does the interpreter's exit.

    Args:
        keep: folders kept at most.
        max_bytes: bytes of files kept at most.
        parent: where the root is made (default the system's temporary folder).
    """

    def __init__(self, keep: int = 64, max_bytes: int = 4 << 30, parent: str | os.PathLike | None = None) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="sapiens2-demo-", dir=parent))
        self._folders: deque[Path] = deque()
        self._keep = keep
        self._max_bytes = max_bytes
        self._lock = threading.Lock()
        self._remove = weakref.finalize(self, shutil.rmtree, self.root, ignore_errors=True)  # at exit too

    def new(self) -> Path:
        """A fresh empty folder; the oldest ones go when there are too many or they hold too much."""
        folder = self.root / uuid.uuid4().hex
        folder.mkdir(parents=True)
        with self._lock:
            self._folders.append(folder)
            while len(self._folders) > self._keep:
                shutil.rmtree(self._folders.popleft(), ignore_errors=True)
            sizes = [_folder_bytes(path) for path in self._folders]
            while len(self._folders) > 1 and sum(sizes) > self._max_bytes:
                shutil.rmtree(self._folders.popleft(), ignore_errors=True)
                sizes.pop(0)
        return folder

    def close(self) -> None:
        """Remove the root and every request's files."""
        self._remove()
