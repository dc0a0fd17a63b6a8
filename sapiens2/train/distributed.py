"""One process or many under ``torchrun``: process-group setup, seeding, DDP / FSDP2 wrapping, full (unsharded)
state dicts for checkpoints, metric pooling, main-process-only writing and a resumable distributed batch sampler.

Run ``torchrun --nproc-per-node N -m sapiens2 train cfg.yaml``: ``setup`` reads ``RANK``, ``LOCAL_RANK`` and
``WORLD_SIZE``, and joins a ``gloo`` (CPU) or ``nccl`` (CUDA) group. Without those variables everything runs in
this one process and the collective helpers are no-ops.
"""

from __future__ import annotations

import csv
import logging
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn

logger = logging.getLogger(__name__)

__all__ = [
    "Context",
    "ResumableBatchSampler",
    "RunRecorder",
    "all_gather_objects",
    "barrier",
    "full_state_dicts",
    "get_rng_states",
    "load_full_state_dicts",
    "mean_across_processes",
    "merge_metric_states",
    "metric_state",
    "pool_metric",
    "seed_everything",
    "set_rng_states",
    "setup",
    "teardown",
    "wrap_model",
]


@dataclass(frozen=True)
class Context:
    """Where this process sits: ``rank`` of ``world_size`` processes, ``local_rank`` on its node, its device."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")
    owns_group: bool = False  # True when ``setup`` created the process group (and ``teardown`` must destroy it)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


def setup(device: str | None = None) -> Context:
    """Read the torchrun environment, join the process group and pick this process's device.

    Args:
        device: ``"cuda"``, ``"cpu"``, ``"cuda:1"`` ...; None: CUDA when available. Under torchrun a bare
            ``"cuda"`` becomes ``cuda:<LOCAL_RANK>``.

    Returns:
        The process ``Context``. An already initialised default group (e.g. made by a test) is reused.

    Raises:
        ValueError: not a device, or CUDA was asked for but is not available.
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        chosen = torch.device(device)
    except (RuntimeError, ValueError):
        raise ValueError(f"device {device!r} is not a device; use cpu, cuda or cuda:N") from None
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for but CUDA is not available; set device: cpu")
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    owns_group = False
    if dist.is_available() and dist.is_initialized():
        world_size, rank = dist.get_world_size(), dist.get_rank()
    elif world_size > 1:
        backend = "nccl" if chosen.type == "cuda" else "gloo"
        if chosen.type == "cuda":
            chosen = torch.device("cuda", local_rank if chosen.index is None else chosen.index)
            torch.cuda.set_device(chosen)
        dist.init_process_group(backend, device_id=chosen if chosen.type == "cuda" else None)
        owns_group = True
        if rank == 0:
            logger.info("joined a %s process group of %d processes", backend, world_size)
    if chosen.type == "cuda" and chosen.index is None:
        chosen = torch.device("cuda", local_rank if world_size > 1 else torch.cuda.current_device())
    if chosen.type == "cuda":
        torch.cuda.set_device(chosen)
        # TF32 matmuls for the fp32 parts, as the official configs (DENSE.md §6).
        torch.set_float32_matmul_precision("high")
    return Context(rank=rank, local_rank=local_rank, world_size=world_size, device=chosen, owns_group=owns_group)


def teardown(context: Context) -> None:
    """Leave the process group if ``setup`` created it."""
    if context.owns_group and dist.is_initialized():
        dist.destroy_process_group()


def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, NumPy's global RNG and torch (CPU and every CUDA device)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def get_rng_states() -> dict[str, Any]:
    """This process's RNG states as tensors and plain numbers (loadable with ``torch.load(weights_only=True)``)."""
    kind, keys, position, has_gauss, cached = np.random.get_state()
    states: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "position": int(position),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    """Restore what ``get_rng_states`` returned."""
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    saved = states["numpy"]
    np.random.set_state(
        (
            saved["kind"],
            saved["keys"].numpy().astype(np.uint32),
            saved["position"],
            saved["has_gauss"],
            saved["cached_gaussian"],
        )
    )
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


# ---------------------------------------------------------------------------------------------------------------------
# Wrapping and state dicts
# ---------------------------------------------------------------------------------------------------------------------


def wrap_model(
    model: nn.Module,
    context: Context,
    strategy: str = "ddp",
    *,
    blocks: list[nn.Module] | None = None,
    bf16_params: bool = False,
) -> nn.Module:
    """Wrap ``model`` for data-parallel training; a no-op in a single process.

    Args:
        model: the model, already on ``context.device`` and with its initial weights (identical on every rank).
        strategy: ``"ddp"``: ``DistributedDataParallel`` (broadcasts rank 0's weights, averages gradients);
            ``"fsdp"``: FSDP2 ``fully_shard`` on each of ``blocks`` then on the root, in place (names unchanged).
        blocks: the modules FSDP2 shards one by one (the backbone blocks).
        bf16_params: FSDP2 only: compute with bf16 parameters and reduce gradients in bf16 (fp32 master shards).

    Returns:
        The module to call in the training loop (for FSDP2 the same object as ``model``).
    """
    if not context.is_distributed:
        return model
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [context.device.index] if context.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids)
    if strategy == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16) if bf16_params else None
        kwargs = {"mp_policy": policy} if policy is not None else {}
        for block in blocks or []:
            fully_shard(block, **kwargs)
        fully_shard(model, **kwargs)
        return model
    raise ValueError(f"unknown distributed strategy {strategy!r}; choose 'ddp' or 'fsdp'")


def full_state_dicts(
    module: nn.Module, optimizer: torch.optim.Optimizer, context: Context
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Full, unsharded model and optimiser state dicts on the CPU, keyed by parameter names (``backbone.*``).

    Every process must call it (FSDP2 all-gathers the shards); with several processes only rank 0 receives the
    tensors, the others get empty dicts. DDP's ``module.`` prefix is removed.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_state_dict(module, optimizer, options=options)


def load_full_state_dicts(
    module: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    model_state: dict[str, torch.Tensor],
    optimizer_state: dict[str, Any] | None,
) -> None:
    """Load full state dicts (as ``full_state_dicts`` returns them) into a plain, DDP or FSDP2 model; every process
    passes the complete dicts and keeps its own shard."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_state_dict

    options = StateDictOptions(full_state_dict=True, strict=True)
    if optimizer is None:
        set_model_state_dict(module, model_state, options=options)
    else:
        set_state_dict(
            module, optimizer, model_state_dict=model_state, optim_state_dict=optimizer_state, options=options
        )


# ---------------------------------------------------------------------------------------------------------------------
# Collectives (no-ops in one process)
# ---------------------------------------------------------------------------------------------------------------------


def barrier(context: Context) -> None:
    if context.is_distributed:
        dist.barrier()


def mean_across_processes(tensor: torch.Tensor, context: Context) -> torch.Tensor:
    """The element-wise mean of ``tensor`` over all processes (a copy; the input is unchanged)."""
    if not context.is_distributed:
        return tensor
    result = tensor.clone()
    dist.all_reduce(result, op=dist.ReduceOp.SUM)
    return result / context.world_size


def all_gather_objects(value: Any, context: Context) -> list[Any]:
    """Every process's ``value`` (picklable), in rank order."""
    if not context.is_distributed:
        return [value]
    gathered: list[Any] = [None] * context.world_size
    dist.all_gather_object(gathered, value)
    return gathered


def metric_state(metric: Any) -> dict[str, Any]:
    """A metric's accumulators, on the CPU, for gathering on the main process."""
    return {k: v.cpu() if isinstance(v, Tensor) else v for k, v in vars(metric).items()}


def merge_metric_states(metric: Any, states: list[dict[str, Any]]) -> None:
    """Pool gathered accumulators: tensors (counts and sums) add up; other values come from the first process
    that has one (``eval.metrics`` keeps only additive tensor statistics)."""
    for name in states[0]:
        values = [state[name] for state in states if state[name] is not None]
        if not values:
            continue
        if isinstance(values[0], Tensor):
            total = values[0].clone()
            for value in values[1:]:
                total += value
            setattr(metric, name, total)
        else:
            setattr(metric, name, values[0])


def pool_metric(metric: Any, context: Context) -> bool:
    """Pool an ``eval.metrics`` accumulator over all processes into the main process's copy.

    Returns:
        True on the main process (whose ``metric`` now holds every process's statistics), False elsewhere.
    """
    if not context.is_distributed:
        return True
    states = all_gather_objects(metric_state(metric), context)
    if context.is_main:
        merge_metric_states(metric, states)
    return context.is_main


# ---------------------------------------------------------------------------------------------------------------------
# Main-process writing
# ---------------------------------------------------------------------------------------------------------------------


class RunRecorder:
    """Main-process writer of the run's ``metrics.csv`` / ``eval.csv`` and TensorBoard scalars; a no-op elsewhere.

    Args:
        run_dir: the run folder.
        enabled: True on the main process only.
        resume_step: when resuming, rows after this step (written by the killed run) are dropped first, and
            TensorBoard purges its later events; None (a fresh run): earlier rows and events are all dropped.
    """

    def __init__(self, run_dir: Path, enabled: bool, resume_step: int | None) -> None:
        self.run_dir = run_dir
        self.enabled = enabled
        self.tensorboard = None
        if not enabled:
            return
        # A fresh run (no checkpoint to resume) starts its logs from scratch; a resumed one drops what came after.
        for name in ("metrics.csv", "eval.csv"):
            self._truncate(run_dir / name, -1 if resume_step is None else resume_step)
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            logger.info("tensorboard is not installed: no TensorBoard logs (pip install tensorboard)")
            return
        purge = 0 if resume_step is None else resume_step + 1
        self.tensorboard = SummaryWriter(str(run_dir / "tensorboard"), purge_step=purge)

    @staticmethod
    def _truncate(path: Path, step: int) -> None:
        """Drop rows written after ``step`` by a run that was killed after its last checkpoint (all: step < 0)."""
        if not path.is_file():
            return
        if step < 0:
            path.unlink()
            return
        with open(path, newline="") as handle:
            rows = list(csv.reader(handle))
        kept = rows[:1] + [row for row in rows[1:] if row and int(row[0]) <= step]
        with open(path, "w", newline="") as handle:
            csv.writer(handle).writerows(kept)

    def write(self, name: str, rows: list[dict[str, Any]]) -> None:
        if not self.enabled or not rows:
            return
        path = self.run_dir / name
        fields = list(rows[0])
        if path.is_file() and path.stat().st_size:
            with open(path, newline="") as handle:
                fields = next(csv.reader(handle))
        with open(path, "a", newline="") as handle:
            writer = csv.DictWriter(handle, fields, extrasaction="ignore")
            if handle.tell() == 0:
                writer.writeheader()
            # repr() keeps every bit of the values, so runs can be compared exactly.
            writer.writerows({k: repr(v) if isinstance(v, float) else v for k, v in row.items()} for row in rows)
        if self.tensorboard is not None:
            prefix = "train/" if name == "metrics.csv" else ""
            for row in rows:
                for key, value in row.items():
                    if key not in ("step", "epoch") and isinstance(value, float):
                        self.tensorboard.add_scalar(prefix + key, value, row["step"])

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()


# ---------------------------------------------------------------------------------------------------------------------
# Sampling
# ---------------------------------------------------------------------------------------------------------------------


class ResumableBatchSampler(torch.utils.data.Sampler[list[int]]):
    """Per-process batches of a shuffled epoch that can start at any batch (exact resume).

    Epoch e is the permutation ``numpy.random.default_rng([seed, e]).permutation(N)`` (identity without
    shuffling), cut into global batches of ``global_batch_size`` (the incomplete tail is dropped); process r takes
    the r-th contiguous slice of each global batch. So the global batch at a step does not depend on the number of
    processes, and an epoch position (epoch, batch) fully decides what comes next.

    Args:
        dataset_size: N.
        global_batch_size: samples per step over all processes; must divide by ``world_size``.
        rank, world_size: this process.
        seed: shuffling seed.
        shuffle: False: in order (validation).

    Raises:
        ValueError: the batch does not split evenly, or the dataset holds less than one global batch.
    """

    def __init__(
        self,
        dataset_size: int,
        global_batch_size: int,
        *,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
    ) -> None:
        if global_batch_size % world_size:
            raise ValueError(
                f"data.batch_size {global_batch_size} (global) does not split over {world_size} processes; "
                f"use a multiple of {world_size}"
            )
        if dataset_size < global_batch_size:
            raise ValueError(
                f"the training set has {dataset_size} samples, fewer than one batch of {global_batch_size}; "
                "lower data.batch_size"
            )
        self.dataset_size = dataset_size
        self.global_batch_size = global_batch_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.start_batch = 0

    @property
    def batches_per_epoch(self) -> int:
        return self.dataset_size // self.global_batch_size

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Iterate epoch ``epoch`` from its batch ``start_batch`` on."""
        if not 0 <= start_batch <= self.batches_per_epoch:
            raise ValueError(f"start_batch {start_batch} outside [0, {self.batches_per_epoch}]")
        self.epoch = epoch
        self.start_batch = start_batch

    def epoch_order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.dataset_size)
        return np.random.default_rng([self.seed, epoch]).permutation(self.dataset_size)

    def __len__(self) -> int:
        return self.batches_per_epoch - self.start_batch

    def __iter__(self) -> Iterator[list[int]]:
        order = self.epoch_order(self.epoch)
        local = self.global_batch_size // self.world_size
        for batch in range(self.start_batch, self.batches_per_epoch):
            start = batch * self.global_batch_size + self.rank * local
            yield order[start : start + local].tolist()


def shard_evenly(dataset_size: int, batch_size: int, context: Context) -> list[tuple[list[int], int]]:
    """Validation batches of this process: (indices, number of real samples at the front).

    Samples are dealt round-robin; every process gets the same number of batches (collectives such as FSDP2's
    all-gathers need that), short processes repeating sample 0 as padding that the caller drops.
    """
    mine = list(range(context.rank, dataset_size, context.world_size))
    per_process = -(-dataset_size // context.world_size)
    num_batches = -(-per_process // batch_size)
    batches = []
    for batch in range(num_batches):
        real = mine[batch * batch_size : (batch + 1) * batch_size]
        size = min(batch_size, per_process - batch * batch_size)
        batches.append((real + [0] * (size - len(real)), len(real)))
    return batches
