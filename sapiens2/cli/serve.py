"""``sapiens2 serve``: the flags, parsed into a ``ServeOptions`` for ``sapiens2.serve`` (an HTTP service on Ray
Serve; ``docs/serving.md``)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import NoReturn

from ..messages import report_error, report_warning
from ..serve.options import KEYPOINT_FORMATS, ServeOptions, config_file_text
from ..tasks import TASKS
from .predict import add_max_megapixels_flag, add_model_flags, cli_option, model_options, note_unused_model_flags

_FLAGS = {
    "tasks": "--task",
    "models": "--model",
    "allow_urls": "--allow-url",
    "request_timeout_s": "--request-timeout",
    "drain_s": "--drain",
}


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "serve",
        help="an HTTP inference service with dynamic batching on Ray Serve (needs the [serve] extra)",
        description="Serve tasks over HTTP: POST an image to /v1/{task}. Example: sapiens2 serve --task pose,seg "
        "--model 1b, then curl --data-binary @photo.jpg http://127.0.0.1:8000/v1/pose (docs/serving.md)",
    )
    parser.add_argument("--task", default="pose,seg", help=f"comma-separated tasks of {', '.join(TASKS)} "
                        "(default pose,seg)")  # fmt: skip
    model = add_model_flags(parser, "the --task tasks, and the person detector for pose",
                            batch_help="person crops per forward pass (pose; default 8)")  # fmt: skip
    model.set_defaults(batch_size=8)
    model.add_argument("--keypoint-format", default="sapiens308", choices=KEYPOINT_FORMATS,
                       help="pose keypoint set when a request names none (?keypoint_format=)")  # fmt: skip
    serving = parser.add_argument_group("serving")
    serving.add_argument("--devices", default=None, help="one model replica per device: all (default: every GPU, "
                         "else one CPU replica), a GPU list (0,1: one replica each), cuda, cpu or cpu:N")  # fmt: skip
    serving.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this "
                         "machine only; 0.0.0.0: the network)")  # fmt: skip
    serving.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    serving.add_argument("--max-batch", type=int, default=8, help="images of one task per model batch, gathered "
                         "from any requests (default 8)")  # fmt: skip
    serving.add_argument("--max-wait-ms", type=float, default=10.0, help="how long a batch waits to fill (default 10)")
    serving.add_argument("--max-queue", type=int, default=64, help="requests inside the service at once; more are "
                         "answered 503 with Retry-After (default 64)")  # fmt: skip
    add_max_megapixels_flag(serving, default=40.0)
    serving.add_argument("--max-upload-mb", type=float, default=50.0, help="refuse larger request bodies (default 50)")
    serving.add_argument("--token", default=None, help="require 'Authorization: Bearer TOKEN' on /v1 and /metrics "
                         "(default $SAPIENS2_SERVE_TOKEN; none: no authentication)")  # fmt: skip
    serving.add_argument("--allow-url", action="append", default=[], metavar="PREFIX", help="let JSON requests name "
                         "an image URL under this prefix (repeatable; default: no URL is ever fetched)")  # fmt: skip
    serving.add_argument("--request-timeout", type=float, default=120.0, help="answer 504 after this many seconds")
    serving.add_argument("--drain", type=float, default=30.0, help="on shutdown, seconds in-flight requests may take")
    serving.add_argument("--ray-address", default=None, help="an existing Ray cluster (default: start a local one)")
    serving.add_argument("--write-config", default=None, metavar="FILE.yaml", help="write the Ray Serve config "
                         "file of these flags (for serve run / serve deploy; - for stdout) and exit")  # fmt: skip
    parser.set_defaults(func=run)


def options_from_args(args: argparse.Namespace) -> ServeOptions:
    values = model_options(args)
    device = values.pop("device")
    return ServeOptions(
        tasks=[t.strip() for t in args.task.split(",") if t.strip()],
        **values,
        devices=args.devices or device,  # --device cpu: one replica there
        keypoint_format=args.keypoint_format,
        host=args.host,
        port=args.port,
        max_batch=args.max_batch,
        max_wait_ms=args.max_wait_ms,
        max_queue=args.max_queue,
        max_megapixels=args.max_megapixels,
        max_upload_mb=args.max_upload_mb,
        token=args.token or os.environ.get("SAPIENS2_SERVE_TOKEN") or None,
        allow_urls=args.allow_url,
        request_timeout_s=args.request_timeout,
        drain_s=args.drain,
    )


def serve_option(name: str, value=None) -> str:
    """A ``ServeOptions`` field as messages name it on the command line."""
    text, flag = cli_option(name, value), cli_option(name)  # the value as predict's messages write it
    return _FLAGS.get(name, flag) + text[len(flag) :]


def _wait_for_signal() -> None:
    """Block until Ctrl+C or SIGTERM (``kill``, ``docker stop``, systemd)."""
    import signal
    import threading

    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass


def run(args: argparse.Namespace) -> int:
    began = time.monotonic()

    def progress(message: str) -> None:  # each stage as it begins, on stderr: a start takes seconds to a minute
        print(f"{time.monotonic() - began:5.1f} s  {message}", file=sys.stderr, flush=True)

    options = options_from_args(args)
    note_unused_model_flags(args, list(options.tasks))
    try:
        options.check(serve_option)
    except ValueError as error:
        report_error(str(error))
        return 2
    if args.write_config:
        if args.write_config == "-":
            print(config_file_text(options), end="")
        else:
            from ..data.io import atomic_write

            atomic_write(args.write_config, config_file_text(options).encode())
            print(f"wrote {args.write_config}: serve run {args.write_config} (here) or serve deploy (a cluster)")
        return 0
    if args.ray_address is None:  # every model file found (or downloaded) here first: a missing one fails at once
        try:
            options.check_listen(serve_option)  # the port is free: Ray Serve would fail after ~30 s, unclearly
        except ValueError as error:
            report_error(str(error))
            return 2
        from ..predict.batch import resolve_sources
        from ..predict.options import PredictOptions

        files = PredictOptions(tasks=options.tasks, output=".", model=options.model, models=options.models,
                               detector=options.detector)  # fmt: skip
        try:
            resolve_sources(files, list(options.tasks), serve_option)
        except (ValueError, FileNotFoundError) as error:
            report_error(error)
            return 2
    try:
        progress("importing Ray Serve")
        from ..serve import require_serve

        app = require_serve()
    except ImportError as error:
        report_error(str(error))
        return 2
    try:
        url = app.start(options, ray_address=args.ray_address, progress=progress)
    except Exception as error:  # a model that does not load, a port that is taken ...
        report_error(f"cannot start the service: {type(error).__name__}: {str(error).splitlines()[0]}")
        app.stop()
        return 1
    auth = " (bearer token required)" if options.token else ""
    progress("ready")
    print(f"serving {', '.join(options.tasks)} at {url}/v1/{{task}}{auth}; OpenAPI at {url}/docs; Ctrl+C stops",
          flush=True)  # fmt: skip
    try:
        _wait_for_signal()
    finally:
        print(f"draining (up to {options.drain_s:g} s) and stopping", file=sys.stderr)
        _stop(app, options.drain_s)  # ends the process


def _stop(app, drain_s: float) -> NoReturn:
    """``app.stop(drain_s)``, then end the process. The local Ray instance is watched meanwhile: when the signal
    stopped Ray's processes too (it was sent to the whole process group), the process ends at once instead of
    waiting on them. Nothing is left to clean up after ``stop``, so the interpreter's own teardown (1-3 s after Ray
    and torch) is skipped too."""
    import threading

    stopper = threading.Thread(target=app.stop, args=(drain_s,), daemon=True)
    stopper.start()
    while stopper.is_alive():
        stopper.join(0.1)
        if stopper.is_alive() and app.local_ray_lost():
            report_warning("the local Ray instance stopped with this process (the signal reached its processes "
                           "too); nothing is left to drain")  # fmt: skip
            break
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # Ray's exit handlers would wait seconds to a minute on a stopped instance
