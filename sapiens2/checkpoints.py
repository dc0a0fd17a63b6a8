"""Checkpoint files: find them (file, folder or Hugging Face repo), read them safely, infer the arch, load strictly.

Only ``.safetensors`` files, or ``.pth``/``.pt``/``.bin`` through ``torch.load(weights_only=True)``: never arbitrary
unpickling. Loading is strict: a mismatch raises one error listing missing, unexpected and mis-shaped keys and the
arch the file's shapes suggest (the official loader's ``strict=False`` silently keeps random weights).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlparse

import torch
from torch import nn

from .models.zoo import ARCH_FIELDS, ARCHS, PRETRAIN, TASKS, Arch, get_arch

logger = logging.getLogger(__name__)

WEIGHT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin")


class CheckpointNotFoundError(FileNotFoundError):
    """A checkpoint could not be found locally or downloaded."""


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


def download(repo_id: str, filename: str, *, local_hint: str | None = None) -> Path:
    """Return the local path of ``filename`` from Hugging Face repo ``repo_id``, downloading it into the HF cache.

    A cached file is used without touching the network. Offline (``HF_HUB_OFFLINE=1`` or no connection), fails at
    once with one message naming the repo, the file and how to pass a local path instead (``local_hint``: the call
    or option to show in the user's interface, ``{filename}`` standing for the file name, e.g.
    ``"load_backbone('/path/to/{filename}')"`` (the default) or ``"--model seg=/path/to/{filename}"``).

    Raises:
        CheckpointNotFoundError: not cached and not downloadable, or the repo/file does not exist.
    """
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(hf_hub_download(repo_id, filename, local_files_only=True))
    except (LocalEntryNotFoundError, EntryNotFoundError, FileNotFoundError):
        pass
    local_hint = (local_hint or "load_backbone('/path/to/{filename}')").replace("{filename}", filename)
    how = (
        f"Download it on a machine with internet access (hf download {repo_id} {filename}) "
        f"and pass the local path instead, e.g. {local_hint}."
    )
    if constants.HF_HUB_OFFLINE or not _online_reachable():
        why = "HF_HUB_OFFLINE=1 is set" if constants.HF_HUB_OFFLINE else f"{constants.ENDPOINT} is not reachable"
        raise CheckpointNotFoundError(
            f"Cannot download '{filename}' from Hugging Face repo '{repo_id}': {why} and the file is not in the "
            f"local cache ({constants.HF_HUB_CACHE}). {how}"
        )
    try:
        return Path(hf_hub_download(repo_id, filename))
    except (HfHubHTTPError, OSError) as error:
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
    path = Path(source).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        return _pick_file_in_dir(path, task, filename)
    text = str(source)
    entry = _zoo_entry(text, task)
    if entry is not None:
        arch, entry_task = entry
        if entry_task != PRETRAIN and entry_task not in arch.released_tasks:
            how = "Pass the path of your own checkpoint instead"
            if local_hint:
                how += ", e.g. " + local_hint.replace("{filename}", f"my_{entry_task}.safetensors")
            raise CheckpointNotFoundError(
                f"No released '{entry_task}' weights for {arch.name} (released: {', '.join(arch.released_tasks)}). "
                f"{how}."
            )
        return download(arch.repo_id(entry_task), filename or arch.filename(entry_task), local_hint=local_hint)
    if text.count("/") == 1 and not text.startswith((".", "/", "~")) and not path.suffix:
        if filename is None:
            raise CheckpointNotFoundError(
                f"'{text}' is not a repo of the model zoo, so the file name is unknown: pass filename=..."
            )
        return download(text, filename, local_hint=local_hint)
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


def read_state_dict(path: str | os.PathLike, rope_dtype: str | torch.dtype = "bf16") -> dict[str, torch.Tensor]:
    """Read a state dict onto the CPU: safetensors, or a torch file through ``torch.load(weights_only=True)``.

    A torch file holding ``{"state_dict": ...}`` or ``{"model": ...}`` is unwrapped. A file of a Hugging Face
    transformers Sapiens2 folder comes back in the official layout, with the RoPE periods transformers does not
    store computed in ``rope_dtype`` (``transformers_format.convert_if_transformers``).

    Raises:
        CheckpointNotFoundError: the file does not exist.
        ValueError: the file is not a readable weight file (named in the message).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointNotFoundError(f"Checkpoint file not found: {path}")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            data = load_file(str(path), device="cpu")
        else:
            data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # safetensors and pickle raise many types for a corrupt file
        raise ValueError(f"Cannot read checkpoint {path}: {type(error).__name__}: {error}") from error
    for wrapper in ("state_dict", "model"):
        if isinstance(data, Mapping) and isinstance(data.get(wrapper), Mapping):
            data = data[wrapper]
    if not isinstance(data, Mapping) or not all(isinstance(v, torch.Tensor) for v in data.values()):
        raise ValueError(f"Checkpoint {path} does not hold a state dict of tensors")
    from .transformers_format import convert_if_transformers

    return convert_if_transformers(path, dict(data), rope_dtype)


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


# ---------------------------------------------------------------------------------------------------- loading


def check_keys(model: nn.Module, state_dict: Mapping[str, torch.Tensor], suggested: str | None = None) -> None:
    """Raise one CheckpointMismatchError listing missing, unexpected and mis-shaped keys; do nothing if all fit."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in state_dict]
    unexpected = [k for k in state_dict if k not in expected]
    misshaped = [
        f"{k}: file {tuple(state_dict[k].shape)} vs model {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state_dict and tuple(state_dict[k].shape) != tuple(v.shape)
    ]
    if not (missing or unexpected or misshaped):
        return
    lines = ["Checkpoint does not fit the model:"]
    for title, items in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", misshaped)):
        if items:
            shown = ", ".join(items[:12]) + (f", ... ({len(items) - 12} more)" if len(items) > 12 else "")
            lines.append(f"  {len(items)} {title} keys: {shown}")
    if suggested:
        lines.append(f"  The file's shapes suggest: {suggested}")
    raise CheckpointMismatchError("\n".join(lines))


def convert_dtypes(
    state_dict: Mapping[str, torch.Tensor], dtype: torch.dtype | str | None, keep: tuple[str, ...] = ("periods",)
) -> dict[str, torch.Tensor]:
    """Cast floating tensors to ``dtype`` (``"auto"``/None keeps the file's); RoPE ``periods`` keep theirs."""
    if dtype in (None, "auto"):
        return dict(state_dict)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    return {k: v.to(dtype) if v.is_floating_point() and not k.endswith(keep) else v for k, v in state_dict.items()}


def load_into(model: nn.Module, state_dict: Mapping[str, torch.Tensor], suggested: str | None = None) -> nn.Module:
    """Strictly load into a model built on the meta device (or a real one) and fix the RoPE periods dtype."""
    check_keys(model, state_dict, suggested)
    rope_dtypes = {n: m.dtype for n, m in model.named_modules() if hasattr(m, "periods") and hasattr(m, "dtype")}
    # The official model casts the stored periods into its bf16 buffer; do the same before assigning.
    state_dict = {
        k: v.to(rope_dtypes[k.rsplit(".", 1)[0]]) if k.rsplit(".", 1)[0] in rope_dtypes else v
        for k, v in state_dict.items()
    }
    model.load_state_dict(state_dict, strict=True, assign=True)
    return model


def load_backbone(
    source: str | os.PathLike,
    arch: str | dict | Arch | None = None,
    *,
    dtype: torch.dtype | str | None = torch.float32,
    device: torch.device | str = "cpu",
    filename: str | None = None,
    **kwargs,
):
    """Load a Sapiens2 backbone from a pretrain checkpoint.

    Args:
        source: a ``.safetensors``/``.pth`` file, a folder, a Hugging Face repo id (``facebook/sapiens2-pretrain-1b``)
            or an arch name/size (``"1b"``: the released pretrain file of that size).
        arch: the arch; inferred from the tensor shapes when None.
        dtype: parameter dtype; bf16/fp16 files load into float32 by default, ``"auto"`` keeps the file's dtype.
        device: where the model ends up.
        filename: file inside a folder or repo, when not the official name.
        **kwargs: forwarded to ``Sapiens2`` (``out_type``, ``out_indices``, ``img_size``, ``rope_dtype``...).

    Returns:
        The backbone in eval mode.

    Example:
        >>> model = load_backbone("sapiens2_0.4b_pretrain.safetensors", out_type="featmap")
        >>> features = model(images)[0]  # (B, 1024, H/16, W/16)
    """
    from .models.backbone import Sapiens2

    path = resolve_checkpoint(source, PRETRAIN, filename)
    state_dict = read_state_dict(path, kwargs.get("rope_dtype", "bf16"))
    inferred = infer_arch(state_dict)
    chosen = get_arch(arch) if arch is not None else inferred
    kwargs.setdefault("use_tokenizer", inferred.use_tokenizer)
    model = Sapiens2(chosen, device="meta", **kwargs)
    try:
        load_into(model, convert_dtypes(state_dict, dtype), describe_arch(inferred))
    except CheckpointMismatchError as error:
        raise CheckpointMismatchError(f"{path}: {error}") from None
    logger.info("loaded %s from %s", describe_arch(chosen), path)
    return model.to(device).eval()


__all__ = [
    "TASKS",
    "CheckpointMismatchError",
    "CheckpointNotFoundError",
    "check_keys",
    "convert_dtypes",
    "download",
    "infer_arch",
    "load_backbone",
    "load_into",
    "read_state_dict",
    "resolve_checkpoint",
]
