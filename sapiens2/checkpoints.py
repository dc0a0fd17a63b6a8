"""Every checkpoint read and every key check: find the file (file, folder or Hugging Face repo), read it safely,
infer the arch, build the model on the ``meta`` device and load it strictly, straight into its device and dtype.

Only ``.safetensors`` files, or ``.pth``/``.pt``/``.bin`` through ``torch.load(weights_only=True)``: never arbitrary
unpickling. Loading is strict: a mismatch raises one error listing missing, unexpected and mis-shaped keys and the
arch the file's shapes suggest (the official loader's ``strict=False`` silently keeps random weights). Tensors are
read one at a time and placed on the target device in the target dtype as they are read, so a bf16 model bound for a
GPU never exists in float32 on the host. ``sapiens2.models`` (pure networks) never imports this module.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import socket
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
import torch
from torch import nn

from .labels import METADATA_KEY, LabelSet, label_set_from_json, names_of
from .models.backbone import Sapiens2
from .models.heads import OUTPUT_LAYERS, infer_head_config
from .models.task_model import TaskModel, build_model, check_task
from .models.zoo import ARCH_FIELDS, ARCHS, Arch, get_arch
from .tasks import PRETRAIN, TASKS
from .transformers_format import convert_if_transformers

logger = logging.getLogger(__name__)

WEIGHT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin")


class CheckpointNotFoundError(FileNotFoundError):
    """A checkpoint could not be found locally or downloaded."""


class MissingFilesError(CheckpointNotFoundError):
    """Several files a run needs cannot be found: ``problems`` holds one line per file, each with its remedy
    (``messages.report_error`` prints one error line each)."""

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


class CheckpointMismatchError(ValueError):
    """A checkpoint's keys or shapes do not fit the model."""


# --------------------------------------------------------------------------------------------------- finding files


def _online_reachable(timeout: float = 3.0) -> bool:
    """Quick check that the Hugging Face endpoint answers (huggingface_hub itself retries for ~25 s when offline)."""
    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


def find_download(repo_id: str, filename: str, *, local_hint: str | None = None) -> Path | None:
    """Where ``download`` would get ``filename`` from Hugging Face repo ``repo_id``, downloading nothing: its path
    in the local cache, or None when it can be downloaded now. A run asks this of every file it needs before it
    downloads any, so that all the missing ones are named at once.

    Raises:
        CheckpointNotFoundError: not cached, and offline (``HF_HUB_OFFLINE=1`` or no connection): one message
            naming the repo, the file and how to pass a local path instead (``local_hint``, see ``download``).
    """
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    try:
        return Path(hf_hub_download(repo_id, filename, local_files_only=True))
    except (LocalEntryNotFoundError, EntryNotFoundError, FileNotFoundError):
        pass
    if constants.HF_HUB_OFFLINE or not _online_reachable():
        why = "HF_HUB_OFFLINE=1 is set" if constants.HF_HUB_OFFLINE else f"{constants.ENDPOINT} is not reachable"
        raise CheckpointNotFoundError(
            f"Cannot download '{filename}' from Hugging Face repo '{repo_id}': {why} and the file is not in the "
            f"local cache ({constants.HF_HUB_CACHE}). {_download_remedy(repo_id, filename, local_hint)}"
        )
    return None


def _download_remedy(repo_id: str, filename: str, local_hint: str | None) -> str:
    local_hint = (local_hint or "load_backbone('/path/to/{filename}')").replace("{filename}", filename)
    return (
        f"Download it on a machine with internet access (hf download {repo_id} {filename}) "
        f"and pass the local path instead, e.g. {local_hint}."
    )


def download(repo_id: str, filename: str, *, local_hint: str | None = None) -> Path:
    """Return the local path of ``filename`` from Hugging Face repo ``repo_id``, downloading it into the HF cache.

    A cached file is used without touching the network. Offline (``HF_HUB_OFFLINE=1`` or no connection), fails at
    once with one message naming the repo, the file and how to pass a local path instead (``local_hint``: the call
    or option to show in the user's interface, ``{filename}`` standing for the file name, e.g.
    ``"load_backbone('/path/to/{filename}')"`` (the default) or ``"--model seg=/path/to/{filename}"``).

    Raises:
        CheckpointNotFoundError: not cached and not downloadable, or the repo/file does not exist.
    """
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError

    cached = find_download(repo_id, filename, local_hint=local_hint)
    if cached is not None:
        return cached
    try:
        return Path(hf_hub_download(repo_id, filename))
    except (HfHubHTTPError, OSError) as error:
        how = _download_remedy(repo_id, filename, local_hint)
        raise CheckpointNotFoundError(
            f"Cannot download '{filename}' from Hugging Face repo '{repo_id}': {error}. The Sapiens2 weights are "
            f"gated under Meta's license: accept it on the repo page and log in (hf auth login), or {how[0].lower()}"
            f"{how[1:]}"
        ) from error


def _zoo_entry(name: str, task: str) -> tuple[Arch, str] | None:
    """Map a repo id (``facebook/sapiens2-seg-1b``) or a short size (``1b``) to (arch, task)."""
    for arch in ARCHS.values():
        for released in arch.released_tasks:
            if name == arch.repo_id(released):
                return arch, released
    try:
        arch = get_arch(name)
    except ValueError:
        return None
    return arch, task


def resolve_checkpoint(
    source: str | os.PathLike, task: str = PRETRAIN, filename: str | None = None, *, local_hint: str | None = None
) -> Path:
    """Find the weight file for ``source``.

    Args:
        source: a local weight file; a folder holding one (the official file name is preferred); a Hugging Face
            repo id such as ``facebook/sapiens2-pretrain-1b``; or an arch name/size (``"sapiens2_1b"``, ``"1b"``),
            meaning the released file of that size for ``task``.
        task: ``"pretrain"`` or a task name; picks the file for arch names.
        filename: the file inside a folder or repo, when it is not the official name.
        local_hint: how to pass a local file instead, in the caller's interface (see ``download``).

    Raises:
        CheckpointNotFoundError: nothing found, or a folder with several candidate files.
    """
    found = locate_checkpoint(source, task, filename, local_hint=local_hint)
    return found if isinstance(found, Path) else download(*found, local_hint=local_hint)


def locate_checkpoint(
    source: str | os.PathLike, task: str = PRETRAIN, filename: str | None = None, *, local_hint: str | None = None
) -> Path | tuple[str, str]:
    """Where ``resolve_checkpoint`` finds ``source``'s file, downloading nothing: the local file, or the (repo id,
    file name) to download. A source that can never be found (a path that does not exist, no released weights)
    raises CheckpointNotFoundError at once, before anything is loaded or downloaded."""
    path = Path(source).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        return _pick_file_in_dir(path, task, filename)
    text = str(source)
    entry = _zoo_entry(text, task)
    if entry is not None:
        arch, entry_task = entry
        if entry_task not in arch.released_tasks:
            how = "Pass the path of your own checkpoint instead"
            if not arch.released:
                how = "It is a student arch of sapiens2 distill: pass the model file a distillation run wrote"
            if local_hint:
                how += ", e.g. " + local_hint.replace("{filename}", f"my_{entry_task}.safetensors")
            released = ", ".join(arch.released_tasks) or "none"
            raise CheckpointNotFoundError(
                f"No released '{entry_task}' weights for {arch.name} (released: {released}). {how}."
            )
        return arch.repo_id(entry_task), filename or arch.filename(entry_task)
    if text.count("/") == 1 and not text.startswith((".", "/", "~")) and not path.suffix:
        if filename is None:
            raise CheckpointNotFoundError(
                f"'{text}' is not a repo of the model zoo, so the file name is unknown: pass filename=..."
            )
        return text, filename
    raise CheckpointNotFoundError(
        f"Checkpoint '{text}' not found: not a file, a folder, a known repo id (e.g. {ARCHS['sapiens2_1b'].repo_id()}) "
        f"or an arch name ({', '.join(ARCHS)})."
    )


def _pick_file_in_dir(folder: Path, task: str, filename: str | None) -> Path:
    if filename is not None:
        if (folder / filename).is_file():
            return folder / filename
        raise CheckpointNotFoundError(f"'{filename}' not found in folder {folder}")
    candidates = sorted(p for p in folder.iterdir() if p.suffix in WEIGHT_SUFFIXES and p.is_file())
    official = [p for p in candidates if p.name in {a.filename(task) for a in ARCHS.values()}]
    if len(official) == 1:
        return official[0]
    safetensors = [p for p in candidates if p.suffix == ".safetensors"]
    for group in (safetensors, candidates):
        if len(group) == 1:
            return group[0]
    if not candidates:
        raise CheckpointNotFoundError(f"No weight file ({', '.join(WEIGHT_SUFFIXES)}) in folder {folder}")
    names = ", ".join(p.name for p in candidates)
    raise CheckpointNotFoundError(f"Several weight files in {folder} ({names}): pass the file itself")


# ------------------------------------------------------------------------------------------------- reading files

# Only numpy scalars/dtypes, which hold plain numbers, are allowed beyond torch's default safe set; they are what a
# re-saved mmengine `meta` may contain (DETECTOR.md §1.2). Pickles name them under numpy 1.x or 2.x module paths.
_NUMPY_SCALAR = (np._core if hasattr(np, "_core") else np.core).multiarray.scalar
_NUMPY_SAFE_GLOBALS = [
    (_NUMPY_SCALAR, "numpy.core.multiarray.scalar"),
    (_NUMPY_SCALAR, "numpy._core.multiarray.scalar"),
    np.dtype,
    *[type(np.dtype(code)) for code in "?bBhHiIlLqQefdg"],
]
# Tensors that keep their stored dtype whatever dtype the model is loaded in: the RoPE periods (cast to the RoPE
# dtype by ``load_into``, as the official model's bf16 buffer does).
KEEP_DTYPE = ("periods",)
_SAFETENSORS_FLOATS = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


_AGAIN = "copy or download it again"


def _looks_like_text(head: bytes) -> bool:
    return bool(head) and all(32 <= byte < 127 or byte in b"\t\r\n" for byte in head[:64])


def _torch_file_problem(path: Path) -> str | None:
    """Why ``path`` cannot be a ``torch.save`` file, from its first and last bytes; None when it may be one.

    ``torch.save`` writes a zip archive (whose end-of-central-directory record closes the file) or, in its legacy
    format, a pickle (protocol 2+: first byte 0x80). torch's own errors for anything else are about its internals.
    """
    size = path.stat().st_size
    if size == 0:
        return f"the file is empty (0 bytes); {_AGAIN}"
    with open(path, "rb") as handle:
        head = handle.read(64)
        handle.seek(max(0, size - (1 << 16) - 22))
        tail = handle.read()
    if head.startswith(b"PK\x03\x04"):
        if b"PK\x05\x06" not in tail:
            return f"truncated: the end of its zip archive is missing ({size} bytes; the copy was cut short?); {_AGAIN}"
        return None
    if head[:1] == b"\x80":
        return None
    if _looks_like_text(head):
        return f"not a PyTorch checkpoint but a text file (it starts {head[:40].decode()!r}); {_AGAIN}"
    return f"not a PyTorch checkpoint (neither a zip archive nor a pickle: corrupt, or another format); {_AGAIN}"


def _safetensors_problem(path: Path) -> str | None:
    """Why ``path`` cannot be a safetensors file, from its header (8-byte length, JSON, tensor offsets); None when
    it may be one."""
    import json

    size = path.stat().st_size
    if size == 0:
        return f"the file is empty (0 bytes); {_AGAIN}"
    with open(path, "rb") as handle:
        head = handle.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else -1
        text = handle.read(length) if 0 < length <= min(size - 8, 100 << 20) else handle.read(32)
    if not text.startswith(b"{"):
        if _looks_like_text(head + text[:32]):
            return f"not a safetensors file but a text file (it starts {(head + text)[:40].decode()!r}); {_AGAIN}"
        return f"not a safetensors file (its header is unreadable: corrupt, or another format); {_AGAIN}"
    try:
        header = json.loads(text)
        end = max((entry["data_offsets"][1] for k, entry in header.items() if k != "__metadata__"), default=0)
    except (ValueError, TypeError, KeyError, IndexError, UnicodeDecodeError):
        return f"not a safetensors file (its header is not valid: corrupt); {_AGAIN}"
    if 8 + length + end > size:
        return f"truncated: its header lists {8 + length + end} bytes, the file has {size}; {_AGAIN}"
    return None


def read_torch_file(path: str | os.PathLike, *, mmap: bool = False) -> Any:
    """``torch.load(path, weights_only=True)`` onto the CPU: the package's one place that unpickles.

    A first refusal is retried once with numpy scalar types allow-listed (plain numbers, as in an mmengine ``meta``);
    anything else stays refused.

    Raises:
        CheckpointNotFoundError: no such file.
        ValueError: the file cannot be read that way (named in the message, with how to re-save it).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointNotFoundError(f"Checkpoint file not found: {path}")
    problem = _torch_file_problem(path)
    if problem is not None:
        raise ValueError(f"Cannot read checkpoint {path}: {problem}")
    try:
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
        except pickle.UnpicklingError:
            if not hasattr(torch.serialization, "safe_globals"):  # torch < 2.5 has no scoped allow-list
                raise
            with torch.serialization.safe_globals(_NUMPY_SAFE_GLOBALS):
                loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
            logger.info("%s: loaded with numpy scalar types allow-listed for weights_only unpickling", path)
            return loaded
    except pickle.UnpicklingError as error:
        raise ValueError(
            f"Cannot read checkpoint {path} with torch.load(weights_only=True): {error}. Unsafe unpickling is never "
            "used: re-save only its state dict (a dict of tensors) with torch.save, or as .safetensors."
        ) from error
    except Exception as error:  # pickle and zip readers raise many types for a corrupt file
        raise ValueError(f"Cannot read checkpoint {path}: {type(error).__name__}: {error}") from error


def _as_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    """None or ``"auto"``: keep the file's dtype; a torch dtype or its name (``"bfloat16"``)."""
    if dtype is None or dtype == "auto":
        return None
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype must be a torch dtype, its name or 'auto', got {dtype!r}")
    return dtype


def _placer(device: torch.device | str, dtype: torch.dtype | str | None) -> Callable[[str, torch.Tensor], torch.Tensor]:
    """(key, tensor) -> the tensor on ``device``, floating tensors in ``dtype`` (``KEEP_DTYPE`` ones keep theirs)."""
    device, dtype = torch.device(device), _as_dtype(dtype)

    def place(key: str, tensor: torch.Tensor) -> torch.Tensor:
        if dtype is not None and tensor.is_floating_point() and not key.endswith(KEEP_DTYPE):
            return tensor.to(device=device, dtype=dtype)
        return tensor.to(device)

    return place


def _open_safetensors(path: Path, device: torch.device, dtype: torch.dtype | None) -> Any:
    """A reader that memory-maps the file when every tensor is kept as stored (CPU, no cast: no copy, the weights
    are the page cache's), else reads with pread(2) into fresh tensors, so that no file-backed pages stay mapped
    beside the cast or moved copies."""
    from safetensors import safe_open

    handle = safe_open(str(path), framework="pt", device="cpu")
    stored = {handle.get_slice(key).get_dtype() for key in handle.keys() if not key.endswith(KEEP_DTYPE)}
    casts = dtype is not None and any(_SAFETENSORS_FLOATS.get(name, dtype) != dtype for name in stored)
    if device.type == "cpu" and not casts:
        return handle
    try:
        return safe_open(str(path), framework="pt", device="cpu", backend="pread")
    except TypeError:  # safetensors < 0.8 has only its mmap reader
        return handle


def read_tensors(
    path: str | os.PathLike, *, device: torch.device | str = "cpu", dtype: torch.dtype | str | None = None
) -> dict[str, torch.Tensor]:
    """Read the tensors of a weight file as stored: safetensors, or a torch file through ``read_torch_file``.

    A torch file holding ``{"state_dict": ...}`` or ``{"model": ...}`` is unwrapped (other top-level entries, such
    as mmengine's ``meta``, are ignored). Each tensor is moved to ``device`` and, if floating, cast to ``dtype``
    (None or ``"auto"`` keeps the file's; RoPE ``periods`` always keep theirs) as soon as it is read, so the host
    holds at most one tensor beyond what it keeps (a torch file: the file's tensors, released one by one).

    Raises:
        CheckpointNotFoundError: the file does not exist.
        ValueError: the file is not a readable weight file (named in the message).
    """
    path, place = Path(path), _placer(device, dtype)
    device, dtype = torch.device(device), _as_dtype(dtype)
    if not path.is_file():
        raise CheckpointNotFoundError(f"Checkpoint file not found: {path}")
    if path.suffix != ".safetensors":
        data = read_torch_file(path)
        for wrapper in ("state_dict", "model"):
            if isinstance(data, Mapping) and isinstance(data.get(wrapper), Mapping):
                data = data[wrapper]
        if not isinstance(data, Mapping) or not all(isinstance(v, torch.Tensor) for v in data.values()):
            raise ValueError(f"Checkpoint {path} does not hold a state dict of tensors")
        data = data if isinstance(data, MutableMapping) else dict(data)
        return {key: place(key, data.pop(key)) for key in list(data)}  # pop: each CPU tensor freed once placed
    problem = _safetensors_problem(path)
    if problem is not None:
        raise ValueError(f"Cannot read checkpoint {path}: {problem}")
    try:
        handle = _open_safetensors(path, device, dtype)
    except Exception as error:  # safetensors raises its own error type for a corrupt header
        raise ValueError(f"Cannot read checkpoint {path}: {type(error).__name__}: {error}") from error
    tensors = {}
    with handle:
        for key in handle.keys():
            try:
                tensor = handle.get_tensor(key)
            except Exception as error:
                raise ValueError(f"Cannot read checkpoint {path}: {type(error).__name__}: {error}") from error
            tensors[key] = place(key, tensor)
    return tensors


def read_state_dict(
    path: str | os.PathLike,
    rope_dtype: str | torch.dtype = "bf16",
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | str | None = None,
) -> dict[str, torch.Tensor]:
    """Read a Sapiens2 state dict in the official key layout (``read_tensors``, then transformers names converted).

    A file of a Hugging Face transformers Sapiens2 folder comes back in the official layout, with the RoPE periods
    transformers does not store computed in ``rope_dtype`` (``transformers_format.convert_if_transformers``).
    ``device``/``dtype``: where and in which dtype the tensors are placed while reading (see ``read_tensors``).

    Raises:
        CheckpointNotFoundError: the file does not exist.
        ValueError: the file is not a readable weight file (named in the message).
    """
    state_dict = convert_if_transformers(path, read_tensors(path, device=device, dtype=dtype), rope_dtype)
    # The RoPE periods a transformers folder lacks are computed on the CPU; everything else is already in place.
    return {key: tensor.to(device) for key, tensor in state_dict.items()}


# ------------------------------------------------------------------------------------------- arch from the shapes


def infer_arch(state_dict: Mapping[str, torch.Tensor], prefix: str = "") -> Arch:
    """Read the backbone arch off the tensor shapes: a zoo entry when the numbers match one, else a custom Arch.

    Raises:
        CheckpointMismatchError: the tensors are not a Sapiens2 backbone.
    """
    try:
        dim = state_dict[f"{prefix}cls_token"].shape[-1]
        head_dim = state_dict[f"{prefix}blocks.0.attn.q_norm.weight"].shape[0]
        ffn = state_dict[f"{prefix}blocks.0.ffn.w3.weight"].shape[1]
    except KeyError as error:
        raise CheckpointMismatchError(
            f"Not a Sapiens2 backbone: key {error} missing (keys start with {sorted(state_dict)[:3]}...)"
        ) from None
    layers = _count_indexed(state_dict, f"{prefix}blocks.")
    tokenizer_layers = _count_indexed(state_dict, f"{prefix}tokenizer.blocks.")
    values = {
        "embed_dims": dim,
        "num_layers": layers,
        "num_heads": dim // head_dim,
        "feedforward_channels": ffn,
        "num_tokenizer_layers": tokenizer_layers,
    }
    use_tokenizer = tokenizer_layers > 0
    for arch in ARCHS.values():
        if arch.use_tokenizer == use_tokenizer and all(
            getattr(arch, k) == v for k, v in values.items() if k != "num_tokenizer_layers" or use_tokenizer
        ):
            return arch
    return dataclasses.replace(get_arch(values), use_tokenizer=use_tokenizer)


def _count_indexed(state_dict: Mapping[str, torch.Tensor], prefix: str) -> int:
    indices = {int(k[len(prefix) :].split(".", 1)[0]) for k in state_dict if k.startswith(prefix)}
    return max(indices) + 1 if indices else 0


def describe_arch(arch: Arch) -> str:
    if arch.name in ARCHS:
        return arch.name
    return "custom arch " + ", ".join(f"{k}={getattr(arch, k)}" for k in ARCH_FIELDS)


def detect_task(state_dict: Mapping[str, torch.Tensor]) -> str | None:
    """The task of a task checkpoint, from the name of its final head layer (None for a bare backbone)."""
    for task, layer in OUTPUT_LAYERS.items():
        if f"decode_head.{layer}.weight" in state_dict:
            return task
    return None


def split_task_state(state_dict: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(backbone, head) tensors of a task checkpoint, ``backbone.``/``decode_head.`` removed; a bare backbone is
    ``(state_dict, {})``."""
    if not any(key.startswith("backbone.") for key in state_dict):
        return dict(state_dict), {}
    backbone = {k.removeprefix("backbone."): v for k, v in state_dict.items() if k.startswith("backbone.")}
    head = {k.removeprefix("decode_head."): v for k, v in state_dict.items() if k.startswith("decode_head.")}
    return backbone, head


# ----------------------------------------------------------------------------------------------- strict loading


def check_keys(
    model: nn.Module,
    state_dict: Mapping[str, torch.Tensor],
    suggested: str | None = None,
    *,
    what: str = "the model",
    notes: Iterable[str] = (),
) -> None:
    """Raise one CheckpointMismatchError listing missing, unexpected and mis-shaped keys; do nothing if all fit.

    Args:
        model: the model the tensors are for (shapes only: a ``meta`` model is fine).
        state_dict: the file's tensors.
        suggested: what the file's shapes suggest (an arch), shown in the message.
        what: the model's name in the message.
        notes: further lines of the message (hints, the fix), shown only on a mismatch.
    """
    expected = model.state_dict()
    missing = [k for k in expected if k not in state_dict]
    unexpected = [k for k in state_dict if k not in expected]
    misshaped = [
        f"{k}: file {tuple(state_dict[k].shape)} vs model {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state_dict and tuple(state_dict[k].shape) != tuple(v.shape)
    ]
    # Weights stored as integers or booleans (a wrong conversion) cannot become parameters, and copying them into
    # float ones would silently round: refused by name, like a wrong shape.
    mistyped = [
        f"{k}: file {str(state_dict[k].dtype).removeprefix('torch.')} vs model "
        f"{'floating point' if v.is_floating_point() else str(v.dtype).removeprefix('torch.')}"
        for k, v in expected.items()
        if k in state_dict and state_dict[k].is_floating_point() != v.is_floating_point()
    ]
    if not (missing or unexpected or misshaped or mistyped):
        return
    lines = [f"Checkpoint does not match {what}:"]
    groups = (("missing", missing), ("unexpected", unexpected), ("mis-shaped", misshaped), ("wrong-dtype", mistyped))
    for title, items in groups:
        if items:
            shown = ", ".join(items[:12]) + (f", ... ({len(items) - 12} more)" if len(items) > 12 else "")
            lines.append(f"  {len(items)} {title} keys: {shown}")
    if suggested:
        lines.append(f"  The file's shapes suggest: {suggested}")
    lines += [f"  {note}" for note in notes if note]
    raise CheckpointMismatchError("\n".join(lines))


def load_into(
    model: nn.Module,
    state_dict: MutableMapping[str, torch.Tensor],
    suggested: str | None = None,
    *,
    assign: bool = True,
    what: str = "the model",
    notes: Iterable[str] = (),
    optional: tuple[str, ...] = (),
) -> nn.Module:
    """Check the keys (``check_keys``), then load ``state_dict`` into ``model`` strictly.

    Args:
        model: with ``assign=True`` a model built on the ``meta`` device: it takes the tensors themselves, on their
            device and in their dtype (place them while reading, ``read_state_dict(device=..., dtype=...)``); RoPE
            periods are first cast to each RoPE module's dtype, as the official model's bf16 buffer casts them. With
            ``assign=False`` the tensors are copied into the model's own (their device and dtype kept).
        state_dict: the tensors; completed in place with the ``optional`` ones.
        suggested, what, notes: for the error message (see ``check_keys``).
        optional: key suffixes that may be absent (BatchNorm's ``num_batches_tracked`` counters, training
            bookkeeping): an absent one starts at zero, as in a freshly built module.

    Raises:
        CheckpointMismatchError: the keys or shapes do not fit.
    """
    if optional:
        expected = model.state_dict()
        device = next(iter(state_dict.values())).device if state_dict else torch.device("cpu")
        for key, tensor in expected.items():
            if key.endswith(optional) and key not in state_dict:
                state_dict[key] = torch.zeros(tensor.shape, dtype=tensor.dtype, device=device)
    check_keys(model, state_dict, suggested, what=what, notes=notes)
    if assign:
        for name, module in model.named_modules():
            if hasattr(module, "periods") and hasattr(module, "dtype") and f"{name}.periods" in state_dict:
                key = f"{name}.periods"
                state_dict[key] = state_dict[key].to(module.dtype)
    model.load_state_dict(state_dict, strict=True, assign=assign)
    # Anything the state dict does not hold (a non-persistent buffer) would still be a meta tensor: refuse it here
    # rather than fail at the first forward.
    left = [name for name, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
    if left:
        raise RuntimeError(f"{type(model).__name__} has tensors no checkpoint key fills: {', '.join(left[:8])}")
    return model


def _load_named(path: Path, model: nn.Module, state_dict: MutableMapping[str, torch.Tensor], suggested: str) -> None:
    try:
        load_into(model, state_dict, suggested)
    except CheckpointMismatchError as error:
        raise CheckpointMismatchError(f"{path}: {error}") from None
    warn_if_not_finite(model, path)


def warn_if_not_finite(model: nn.Module, source: str | os.PathLike, sample: int = 1 << 16) -> list[str]:
    """Log a warning when a loaded model's weights hold NaN or infinite values (a model exported from a diverged
    training run predicts garbage without any error); returns the names of those tensors.

    Only the first ``sample`` values of each tensor are looked at, so the check costs little at any model size; a
    diverged run leaves NaN throughout, and any tensor holding one makes the outputs NaN anyway.
    """
    tensors = [(n, t) for n, t in (*model.named_parameters(), *model.named_buffers()) if t.is_floating_point()]
    bad = [name for name, tensor in tensors if not torch.isfinite(tensor.detach().reshape(-1)[:sample]).all()]
    if bad:
        logger.warning(
            "%s: %d of %d weight tensors hold NaN or infinite values (%s%s): its outputs will be NaN or garbage; "
            "was it exported from a training run that diverged?",
            source,
            len(bad),
            len(tensors),
            ", ".join(bad[:3]),
            ", ..." if len(bad) > 3 else "",
        )
    return bad


# ------------------------------------------------------------------------------------------------ public loaders


def load_backbone(
    source: str | os.PathLike,
    arch: str | dict | Arch | None = None,
    *,
    dtype: torch.dtype | str | None = torch.float32,
    device: torch.device | str = "cpu",
    filename: str | None = None,
    **kwargs,
) -> Sapiens2:
    """Load a Sapiens2 backbone from a pretrain checkpoint.

    The backbone is built on the ``meta`` device and takes the file's tensors, read straight onto ``device`` in
    ``dtype``: no random init, no float32 copy of a bf16 file on the host when loading to a GPU in bf16.

    Args:
        source: a ``.safetensors``/``.pth`` file, a folder, a Hugging Face repo id (``facebook/sapiens2-pretrain-1b``)
            or an arch name/size (``"1b"``: the released pretrain file of that size).
        arch: the arch; inferred from the tensor shapes when None.
        dtype: parameter dtype; bf16/fp16 files load into float32 by default, ``"auto"`` keeps the file's dtype.
        device: where the model is materialised.
        filename: file inside a folder or repo, when not the official name.
        **kwargs: forwarded to ``Sapiens2`` (``out_type``, ``out_indices``, ``img_size``, ``rope_dtype``...).

    Returns:
        The backbone in eval mode.

    Example:
        >>> model = load_backbone("sapiens2_0.4b_pretrain.safetensors", out_type="featmap")
        >>> features = model(images)[0]  # (B, 1024, H/16, W/16)
    """
    path = resolve_checkpoint(source, PRETRAIN, filename)
    state_dict = read_state_dict(path, kwargs.get("rope_dtype", "bf16"), device=device, dtype=dtype)
    inferred = infer_arch(state_dict)
    chosen = get_arch(arch) if arch is not None else inferred
    kwargs.setdefault("use_tokenizer", inferred.use_tokenizer)
    model = Sapiens2(chosen, device="meta", **kwargs)
    _load_named(path, model, state_dict, describe_arch(inferred))
    logger.info("loaded %s from %s", describe_arch(chosen), path)
    return model.eval()


def load_model(
    task: str,
    source: str | os.PathLike,
    *,
    dtype: torch.dtype | str | None = torch.float32,
    device: torch.device | str = "cpu",
    filename: str | None = None,
    rope_dtype: str = "bf16",
) -> TaskModel:
    """Load a task model from a checkpoint; arch and head widths are read off the tensor shapes.

    Built on the ``meta`` device, it takes the file's tensors read straight onto ``device`` in ``dtype``.

    Args:
        task: the task the checkpoint was trained for.
        source: a file, a folder, a Hugging Face repo id (``facebook/sapiens2-seg-1b``) or a size (``"1b"``).
        dtype: parameter dtype (float32 by default; ``"auto"`` keeps the file's).
        device: where the model is materialised.
        filename: the file inside a folder or repo, when not the official name.
        rope_dtype: ``"bf16"`` (official numerics) or ``"fp32"``.

    Returns:
        The model in eval mode.

    Raises:
        CheckpointNotFoundError, CheckpointMismatchError, ValueError: with the file and the problem named.

    Example:
        >>> model = load_model("seg", "facebook/sapiens2-seg-1b", device="cuda", dtype=torch.bfloat16)
        >>> logits = model(images)  # (B, 29, H, W)
    """
    check_task(task)
    path = resolve_checkpoint(source, task, filename)
    state_dict = read_state_dict(path, rope_dtype, device=device, dtype=dtype)
    found = detect_task(state_dict)
    if found is None:
        raise CheckpointMismatchError(
            f"{path} is not a task checkpoint (no decode_head.* layers; a pretrain backbone?). Use load_backbone() "
            f"for it, or build_model('{task}', arch) and load it into .backbone for fine-tuning."
        )
    if found != task:
        raise CheckpointMismatchError(f"{path} holds a '{found}' model, not '{task}'")
    arch = infer_arch(state_dict, prefix="backbone.")
    head_config = infer_head_config(task, split_task_state(state_dict)[1])
    size = {"input_size": trained} if (trained := file_input_size(path)) else {}  # the model's own input size
    model = build_model(task, arch, rope_dtype=rope_dtype, device="meta", **size, **head_config)
    _load_named(path, model, state_dict, describe_arch(arch))
    model.labels = file_label_set(path, task, head_config)  # the names every command uses (labels.labels_of)
    logger.info("loaded %s %s from %s", task, describe_arch(arch), path)
    return model.eval()


def file_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The string metadata of a ``.safetensors`` file (``{}`` for other files or none)."""
    if Path(path).suffix != ".safetensors":
        return {}
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), "pt") as handle:
            return dict(handle.metadata() or {})
    except (OSError, ValueError, SafetensorError):  # not readable as safetensors: no metadata to give
        return {}


def file_input_size(path: str | os.PathLike) -> tuple[int, int] | None:
    """The input size a weight file says its model was trained at (``input_size: "HxW"`` in the safetensors
    metadata that ``sapiens2 export`` writes for a training run); None when it says none."""
    height, sep, width = file_metadata(path).get("input_size", "").partition("x")
    try:
        return (int(height), int(width)) if sep and int(height) > 0 and int(width) > 0 else None
    except ValueError:
        return None


def file_label_set(path: str | os.PathLike, task: str, head_config: Mapping[str, Any]) -> LabelSet | None:
    """The label set a model file carries (``labels.METADATA_KEY`` in its safetensors metadata, written by
    ``sapiens2 export`` for a run with its own keypoints or classes); None when it carries none.

    Raises:
        CheckpointMismatchError: the set is unreadable, or its size is not the head's number of outputs.
    """
    text = file_metadata(path).get(METADATA_KEY)
    if text is None:
        return None
    try:
        labels = label_set_from_json(text, f"{path}: metadata '{METADATA_KEY}'")
    except ValueError as error:
        raise CheckpointMismatchError(str(error)) from None
    part = labels.for_task(task)
    outputs = head_config.get("out_channels" if task == "pose" else "num_classes")
    if part is not None and outputs is not None and len(names_of(part)) != outputs:
        raise CheckpointMismatchError(
            f"{path}: its label set names {len(names_of(part))} {'keypoints' if task == 'pose' else 'classes'}, "
            f"its head has {outputs} outputs"
        )
    return labels


def source_label_set(source: str | os.PathLike, task: str) -> LabelSet | None:
    """The label set of ``task``'s model at ``source``, known before it loads, reading only a file's header (no
    tensor, no download, no network): a local or already downloaded ``.safetensors`` file's carried set
    (``file_label_set``), else the released set or numbered names by its head's number of outputs
    (``labels.outputs_label_set``, as ``labels_of`` names a loaded model); the released set for a released model
    still to download. None when it cannot be known without loading: an exported network, a ``.pth`` file, a source
    that is not found, or a file whose set does not fit its head (loading it then says why).

    Example:
        >>> source_label_set("my_seg.safetensors", "seg").classes.class_names
        ('background', 'shirt', 'trousers', 'left_sleeve', 'right_sleeve')
    """
    from .labels import default_label_set, outputs_label_set

    try:
        found = locate_checkpoint(source, task)
    except (CheckpointNotFoundError, ValueError, OSError):
        return None
    if isinstance(found, tuple):  # not downloaded yet: only the zoo's released models are found this way
        return default_label_set(task) if _zoo_entry(str(source), task) is not None else None
    if found.suffix != ".safetensors":
        return None
    from safetensors import SafetensorError, safe_open

    key = f"decode_head.{OUTPUT_LAYERS.get(task)}.weight"
    try:
        with safe_open(str(found), "pt") as handle:
            outputs = handle.get_slice(key).get_shape()[0] if key in handle.keys() else None
        carried = file_label_set(found, task, {"out_channels" if task == "pose" else "num_classes": outputs})
    except (CheckpointMismatchError, OSError, ValueError, SafetensorError):  # the load says what is wrong
        return None
    if carried is not None and carried.for_task(task) is not None:
        return carried
    return outputs_label_set(task, outputs)


def task_checkpoint_spec(state_dict: Mapping[str, torch.Tensor], task: str) -> tuple[Arch, dict[str, Any]]:
    """(backbone arch, head kwargs) that a checkpoint implies for a ``task`` model: the head kwargs are read off a
    checkpoint of ``task`` itself, empty for a bare backbone or another task's checkpoint.

    Raises:
        CheckpointMismatchError: the tensors hold no Sapiens2 backbone.
    """
    backbone, head = split_task_state(state_dict)
    return infer_arch(backbone), infer_head_config(task, head) if detect_task(state_dict) == task else {}


def init_task_model(
    model: TaskModel,
    state_dict: Mapping[str, torch.Tensor],
    *,
    output_rows: Sequence[tuple[int, int]] | None = None,
) -> bool:
    """Copy a checkpoint's weights into a built task model (its own tensors, dtype and device kept), strictly.

    A checkpoint of ``model.task`` fills the whole model; a bare backbone, or another task's checkpoint, fills
    ``model.backbone`` and the head keeps its weights.

    Args:
        model: the built model.
        state_dict: the checkpoint's tensors.
        output_rows: a head for another label set (``sapiens2.labels``): (model channel, file channel) pairs of
            the outputs the two sets share. The head's final layer then takes only those rows (its other outputs
            keep their fresh weights); everything else loads strictly.

    Returns:
        True when the head was loaded too.

    Raises:
        CheckpointMismatchError: keys or shapes do not fit (with the arch the file's shapes suggest).
    """
    backbone, head = split_task_state(state_dict)
    suggested = describe_arch(infer_arch(backbone))
    if detect_task(state_dict) == model.task:
        full = {f"backbone.{k}": v for k, v in backbone.items()} | {f"decode_head.{k}": v for k, v in head.items()}
        if output_rows is not None:
            full = _with_output_rows(model, full, output_rows)
        load_into(model, full, suggested, assign=False)
        return True
    load_into(model.backbone, backbone, suggested, assign=False)
    return False


def _with_output_rows(
    model: TaskModel, state: dict[str, torch.Tensor], rows: Sequence[tuple[int, int]]
) -> dict[str, torch.Tensor]:
    """``state`` with its final head layer replaced by the model's own, the listed (model, file) rows copied in."""
    state = dict(state)
    for suffix in ("weight", "bias"):
        key = f"decode_head.{OUTPUT_LAYERS[model.task]}.{suffix}"
        own = model.state_dict()[key].detach().clone()
        if key in state and rows:
            source = state[key]
            if tuple(source.shape[1:]) != tuple(own.shape[1:]):
                raise CheckpointMismatchError(
                    f"{key}: file {tuple(source.shape)} vs model {tuple(own.shape)}: the trunks differ"
                )
            new, old = (torch.tensor(ids, dtype=torch.long) for ids in zip(*rows, strict=True))
            own[new] = source[old].to(own.dtype)
        state[key] = own
    return state


__all__ = [
    "KEEP_DTYPE",
    "TASKS",
    "CheckpointMismatchError",
    "CheckpointNotFoundError",
    "MissingFilesError",
    "check_keys",
    "describe_arch",
    "detect_task",
    "download",
    "file_label_set",
    "source_label_set",
    "file_metadata",
    "find_download",
    "infer_arch",
    "init_task_model",
    "load_backbone",
    "load_into",
    "load_model",
    "locate_checkpoint",
    "read_state_dict",
    "read_tensors",
    "read_torch_file",
    "resolve_checkpoint",
    "split_task_state",
    "task_checkpoint_spec",
    "warn_if_not_finite",
]
