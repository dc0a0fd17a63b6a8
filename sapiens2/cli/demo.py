"""``sapiens2 demo``: the flags, parsed into a ``DemoOptions`` for ``sapiens2.demo.launch`` (a local web page)."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile

from ..demo.options import DemoOptions
from ..messages import report_error, report_warning
from ..tasks import TASKS
from .predict import add_max_megapixels_flag, add_model_flags, cli_option, model_options


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "demo",
        help="every task in a local web page (needs the [demo] extra: Gradio)",
        description="Serve a web page to try every task on your photos: sapiens2 demo, then open the printed URL. "
        "Models load on first use; offline, pass local files: sapiens2 demo --model pose=PATH --detector none",
    )
    add_model_flags(parser, f"each task on first use ({', '.join(TASKS)}), and the person detector for pose",
                    batch_help="person crops per forward pass (pose)")  # fmt: skip
    serve = parser.add_argument_group("serving")
    serve.add_argument("--host", default="127.0.0.1", help="address to serve on (default 127.0.0.1: this machine "
                       "only; 0.0.0.0: the network)")  # fmt: skip
    serve.add_argument("--port", type=int, default=None, help="port (default 7860, or the next free one)")
    share = serve.add_mutually_exclusive_group()
    share.add_argument(
        "--share",
        dest="share",
        action="store_true",
        help="also open a public https://*.gradio.live link through Gradio's free share service (needs internet)",
    )
    share.add_argument(
        "--share-free",
        dest="share",
        action="store_false",
        help="no public link: the page is served only on --host (the default)",
    )
    serve.add_argument(
        "--task",
        default="pose,seg",
        help=f"comma-separated tasks ticked when the page opens (of {', '.join(TASKS)}; default pose,seg)",
    )
    add_max_megapixels_flag(serve, default=40.0)
    serve.add_argument("--max-file-mb", type=float, default=50.0, help="refuse larger uploads (default 50)")
    serve.add_argument("--queue-size", type=int, default=16, help="requests that may wait in the queue (default 16)")
    serve.add_argument(
        "--max-video-frames", type=int, default=150, help="frames of a clip the video tab processes (default 150)"
    )
    serve.add_argument(
        "--max-kept-results",
        type=int,
        default=16,
        help="pages whose last results stay in memory for the class toggles and keypoint choice (default 16)",
    )
    serve.add_argument(
        "--max-kept-mb", type=float, default=1024.0, help="megabytes of those results kept at most (default 1024)"
    )
    parser.set_defaults(func=run, share=False)


def options_from_args(args: argparse.Namespace) -> DemoOptions:
    """The parsed flags as a ``DemoOptions`` (``--model`` as ``sapiens2 predict`` reads it)."""
    return DemoOptions(
        **model_options(args),
        host=args.host,
        port=args.port,
        share=args.share,
        tasks=[t.strip() for t in args.task.split(",") if t.strip()],
        max_megapixels=args.max_megapixels,
        max_file_mb=args.max_file_mb,
        queue_size=args.queue_size,
        max_video_frames=args.max_video_frames,
        max_kept_results=args.max_kept_results,
        max_kept_mb=args.max_kept_mb,
    )


@contextlib.contextmanager
def _private_gradio_folder():
    """Gradio keeps uploads and copies of every result under ``$GRADIO_TEMP_DIR`` (default a shared
    /tmp/gradio), and leaves some behind: unless the user chose a folder, this server gets its own, removed when it
    stops."""
    if os.environ.get("GRADIO_TEMP_DIR"):
        yield
        return
    folder = tempfile.mkdtemp(prefix="sapiens2-demo-gradio-")
    os.environ["GRADIO_TEMP_DIR"] = folder
    try:
        yield
    finally:
        os.environ.pop("GRADIO_TEMP_DIR", None)
        shutil.rmtree(folder, ignore_errors=True)


def _stop_on_sigterm() -> None:
    """``kill``, ``docker stop`` and systemd send SIGTERM, which ends Python without any clean-up: make it stop the
    server as Ctrl+C does, so the requests' temporary files go with it."""
    import signal
    import threading

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, interrupt)


def warn_missing_model_files(options: DemoOptions) -> None:
    """One warning per model file the page's ticked tasks (``--task``) will lack on first use (offline, not
    cached), each with its remedy, all before the page starts: the page still serves the tasks it can load."""
    from ..checkpoints import MissingFilesError
    from ..predict.batch import resolve_sources
    from ..predict.options import PredictOptions

    files = PredictOptions(tasks=tuple(options.tasks), output=".", model=options.model, models=options.models,
                           detector=options.detector)  # fmt: skip
    try:
        resolve_sources(files, list(options.tasks), cli_option, download=False)
    except MissingFilesError as error:
        for problem in error.problems:
            report_warning(problem)
        report_warning("the page starts; the task(s) above fail on first use until their files are given")


def run(args: argparse.Namespace) -> int:
    options = options_from_args(args)
    try:
        options.check(cli_option)
    except ValueError as error:
        report_error(str(error))
        return 2
    warn_missing_model_files(options)
    try:
        from ..demo import launch

        _stop_on_sigterm()
        with _private_gradio_folder():
            launch(options, option=cli_option)
    except ImportError as error:
        report_error(str(error))
        return 2
    except OSError as error:  # e.g. the port is taken; Gradio's advice names its own API, so keep its first sentence
        reason = str(error).split(". ")[0]
        where = f"{options.host}:{options.port or 7860}"
        report_error(f"cannot serve on {where}: {reason}; choose another with --port or --host")
        return 1
    return 0
