"""``sapiens2 curate CONFIG.yaml [--set a.b=v ...] [--engine local|ray] [--strict]``: build a human-centric pretraining
corpus (docs/curation.md). The flags parse into ``CurateOptions`` for ``sapiens2.curate.curate``."""

from __future__ import annotations

import argparse

from ..curate import CurateOptions, ModelMissing, curate
from ..data.collections import CollectionError
from ..messages import report_error

# Problems with the user's config, inputs or models: one line on stderr, exit status 2 (no traceback).
_USER_ERRORS = (CollectionError, ModelMissing, FileNotFoundError, ValueError, ImportError)


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Add the ``curate`` subcommand."""
    parser = commands.add_parser(
        "curate",
        help="filter, de-duplicate and balance an image dump into a pretraining corpus (docs/curation.md)",
        description="Curate images into a human-centric pretraining corpus: person/head-pose/CLIP/text scores, "
        "filters, pHash and feature-kNN dedup, hierarchical k-means and balanced sampling. Writes "
        "OUTPUT/manifest.parquet, scores.parquet and report.md. A rerun resumes where the last one stopped.",
    )
    parser.add_argument("config", help="curation config YAML (every key and default: docs/curation.md)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set balance.target_size=100000 (repeatable)",
    )
    parser.add_argument("--engine", choices=("local", "ray"), default=None, help="override the config's engine")
    parser.add_argument("--strict", action="store_true", default=None, help="fail if any stage would be skipped")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def options_from_args(args: argparse.Namespace) -> CurateOptions:
    """The parsed flags as a ``CurateOptions``."""
    return CurateOptions(
        args.config, tuple(args.overrides), engine=args.engine, strict=args.strict, progress=not args.no_progress
    )


def run(args: argparse.Namespace) -> int:
    try:
        result = curate(options_from_args(args))
    except _USER_ERRORS as error:
        report_error(str(error))
        return 2
    dropped = ", ".join(f"{reason} {count}" for reason, count in result.dropped.items()) or "none"
    print(f"{result.images_in} images in, {result.kept} kept; dropped: {dropped}")
    print(f"images scored now {result.computed}, reused from an earlier run {result.reused}")
    print(f"manifest: {result.manifest}\nreport: {result.report}")
    return 0
