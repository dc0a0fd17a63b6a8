"""``sapiens2 info``: the model zoo as a text table (arch, parameters, FLOPs, repos, released tasks)."""

from __future__ import annotations

import argparse

from ..models.zoo import ARCHS, PRETRAIN


def _format_count(value: float, unit: str = "") -> str:
    for threshold, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M")):
        if value >= threshold:
            return f"{value / threshold:.3f}{suffix}{unit}"
    return f"{value:.0f}{unit}"


def info_table() -> str:
    """The model zoo as a text table: arch, parameters, FLOPs at the native input, repo ids, released tasks."""
    header = ("arch", "params", "FLOPs", "input (HxW)", "pretrain repo", "released tasks")
    rows = [header]
    for arch in ARCHS.values():
        size = arch.img_size
        rows.append(
            (
                arch.name,
                f"{arch.num_parameters():,}",
                _format_count(arch.flops(), ""),
                f"{size[0]}x{size[1]}",
                arch.repo_id(PRETRAIN) if arch.released else "- (student arch: sapiens2 distill)",
                ", ".join(t for t in arch.released_tasks if t != PRETRAIN) or "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines += [
        "",
        "FLOPs: forward pass per image at the listed input, 2 FLOPs per multiply-add, attention included.",
        "Task weights: facebook/sapiens2-{task}-{size}, e.g. facebook/sapiens2-seg-1b "
        "(file sapiens2_1b_seg.safetensors).",
        "Weights are under Meta's Sapiens2 License; they are downloaded by you from Hugging Face.",
    ]
    return "\n".join(lines)


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Add ``info`` (it takes no options)."""
    parser = commands.add_parser("info", help="list the model zoo: sizes, parameters, FLOPs, repos, tasks")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    print(info_table())
    return 0
