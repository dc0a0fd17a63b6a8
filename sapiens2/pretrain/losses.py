"""The pretraining losses, in float32 (PRETRAIN.md §6.3, §7.3-7.5): MAE norm-pix loss on masked patches,
Sinkhorn-Knopp (or softmax) teacher centring, the DINO cross-entropy over (student, teacher) view pairs, KoLeo.

Every cross-process quantity is all-reduced or all-gathered, so several processes on a split batch compute what one
process computes on the whole batch (Sinkhorn-Knopp sums, the KoLeo neighbour set).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["SoftmaxCentering", "dino_loss", "dino_pairs", "koleo_loss", "mae_loss", "norm_pix_target", "sinkhorn_knopp"]


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _all_reduce(tensor: Tensor, op: dist.ReduceOp = dist.ReduceOp.SUM) -> Tensor:
    if _distributed():
        dist.all_reduce(tensor, op=op)
    return tensor


def norm_pix_target(patches: Tensor, eps: float = 1e-6) -> Tensor:
    """Per patch (last dim): (x - mean) / sqrt(unbiased var + eps), MAE's ``norm_pix_loss`` target."""
    mean = patches.mean(dim=-1, keepdim=True)
    var = patches.var(dim=-1, keepdim=True)  # unbiased, as torch's default in MAE
    return (patches - mean) / (var + eps) ** 0.5


def mae_loss(pred: Tensor, target: Tensor, mask: Tensor) -> Tensor:
    """Mean squared error per patch, averaged over the masked patches only.

    Args:
        pred, target: (B, N, P) predictions and (already normalised) targets.
        mask: (B, N) bool or 0/1, 1 = removed.
    """
    per_patch = (pred.float() - target.float()).pow(2).mean(dim=-1)
    mask = mask.float()
    return (per_patch * mask).sum() / mask.sum()


def _logsumexp_over_processes(x: Tensor, dim: int | None = None) -> Tensor:
    """log(sum(exp(x))) over ``dim`` (all of x when None) and over every process's x, keepdim."""
    if dim is None:
        peak = _all_reduce(x.max().reshape(1).clone(), dist.ReduceOp.MAX)
        return peak + torch.log(_all_reduce((x - peak).exp().sum().reshape(1)))
    peak = _all_reduce(x.amax(dim=dim, keepdim=True).clone(), dist.ReduceOp.MAX)
    return peak + torch.log(_all_reduce((x - peak).exp().sum(dim=dim, keepdim=True)))


@torch.no_grad()
def sinkhorn_knopp(logits: Tensor, temperature: float, iterations: int = 3) -> Tensor:
    """Teacher targets by Sinkhorn-Knopp (DINOv3): (B, K) logits of every teacher view of the step -> (B, K)
    distributions whose rows sum to 1 and whose columns sum to about B/K after the iterations.

    Q = exp(logits / t) seen as K x B, divided by its total; then ``iterations`` x (each prototype's row divided by
    its sum and by K; each sample's column divided by its sum and by B); finally x B. Computed in the log domain
    (the same quantities, but no exp underflow or overflow at t = 0.04) in float32; the sums over samples run over
    every process, with B the global count.
    """
    log_q = (logits.float() / temperature).t()  # (K, B)
    prototypes = log_q.shape[0]
    batch = _all_reduce(torch.tensor([log_q.shape[1]], dtype=torch.float32, device=log_q.device))
    log_q = log_q - _logsumexp_over_processes(log_q)
    for _ in range(iterations):
        log_q = log_q - _logsumexp_over_processes(log_q, dim=1) - math.log(prototypes)
        log_q = log_q - torch.logsumexp(log_q, dim=0, keepdim=True) - torch.log(batch)
    return (log_q + torch.log(batch)).exp().t()


class SoftmaxCentering(nn.Module):
    """DINOv2's centring: softmax((t - c) / tau), with c an EMA (momentum) of the all-reduced batch-mean teacher
    logits, updated after use (lazily, at the next call). The centre is a buffer saved with the checkpoint."""

    def __init__(self, prototypes: int, momentum: float = 0.9) -> None:
        super().__init__()
        self.momentum = momentum
        self.register_buffer("center", torch.zeros(1, prototypes))
        self.register_buffer("pending", torch.zeros(1, prototypes))
        self.register_buffer("has_pending", torch.zeros((), dtype=torch.bool))

    @torch.no_grad()
    def forward(self, logits: Tensor, temperature: float) -> Tensor:
        if bool(self.has_pending):
            self.center.mul_(self.momentum).add_(self.pending, alpha=1 - self.momentum)
        logits = logits.float()
        count = _all_reduce(torch.tensor([logits.shape[0]], dtype=torch.float32, device=logits.device))
        self.pending.copy_(_all_reduce(logits.sum(dim=0, keepdim=True)) / count)
        self.has_pending.fill_(True)
        return F.softmax((logits - self.center) / temperature, dim=-1)


def dino_pairs(n_student: int, n_teacher: int) -> list[tuple[int, int]]:
    """(student view, teacher view) pairs of the global term: view ids 0, 1; the student holds the first
    ``n_student``, the teacher the last ``n_teacher``; same-view pairs are excluded (``global_ignore_diagonal``)."""
    teacher_views = range(2 - n_teacher, 2)
    return [(s, t) for s in range(n_student) for t in teacher_views if s != t]


def dino_loss(
    student_global: Tensor,
    student_local: Tensor,
    teacher_targets: Tensor,
    n_teacher: int,
    student_temp: float = 0.1,
) -> tuple[Tensor, int]:
    """Mean cross-entropy over every (student view, teacher view) pair and the batch (PRETRAIN.md §7.4).

    Args:
        student_global: (B, Gs, K) logits of the masked student globals (view ids 0 .. Gs - 1).
        student_local: (B, L, K) logits of the local crops (L may be 0).
        teacher_targets: (B, Gt, K) target distributions (view ids 2 - Gt .. 1).
        n_teacher: Gt.

    Returns:
        (loss, number of pairs): global pairs (diagonal excluded) + L x Gt local pairs, each weighted equally.
    """
    terms = []
    targets = teacher_targets.float()
    first_teacher = 2 - n_teacher

    def cross_entropy(logits: Tensor, target: Tensor) -> Tensor:
        return -(target * F.log_softmax(logits.float() / student_temp, dim=-1)).sum(dim=-1).mean()

    for s, t in dino_pairs(student_global.shape[1], n_teacher):
        terms.append(cross_entropy(student_global[:, s], targets[:, t - first_teacher]))
    for local in range(student_local.shape[1]):
        for t in range(n_teacher):
            terms.append(cross_entropy(student_local[:, local], targets[:, t]))
    if not terms:
        raise ValueError("no (student, teacher) view pairs: use two global views or local crops")
    return torch.stack(terms).mean(), len(terms)


def _gather_with_grad(x: Tensor) -> tuple[Tensor, int]:
    """All processes' rows (gradients flow back to their owners) and where this process's rows start."""
    if not _distributed():
        return x, 0
    from torch.distributed.nn.functional import all_gather

    parts = all_gather(x.contiguous())
    return torch.cat(parts), dist.get_rank() * x.shape[0]


def koleo_loss(features: Tensor, eps: float = 1e-8) -> Tensor:
    """KoLeo on one global view: -mean log(distance to the nearest other sample), L2-normalised features, nearest
    neighbour by inner product over the whole (all-gathered) batch, float32 (PRETRAIN.md §7.5)."""
    x = F.normalize(features.float(), dim=-1, eps=eps)
    everyone, start = _gather_with_grad(x)
    with torch.no_grad():
        similarity = x @ everyone.t()
        own = torch.arange(x.shape[0], device=x.device) + start
        similarity[torch.arange(x.shape[0], device=x.device), own] = -2.0  # below any cosine: never its own NN
        nearest = similarity.argmax(dim=1)
    distances = (x - everyone[nearest]).norm(dim=-1)
    return -torch.log(distances + eps).mean()
