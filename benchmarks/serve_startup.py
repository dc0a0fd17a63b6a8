"""Where ``sapiens2 serve``'s start-up goes: seconds from launching the command to ``/readyz`` answering 200.

Runs the real command (``python -m sapiens2 serve``, a local Ray instance, one model replica) ``--runs`` times on a
small stand-in model (random weights, official layout) or the ``--model`` files given, polls ``/readyz`` every
50 ms, and reads the command's own progress lines (``  5.3 s  starting Ray Serve ...`` on stderr) for the stages:
the imports, Ray's start, Serve's controller and proxy, the gateway and model replicas (their processes, imports
and model loading, until Serve calls the application running; ``load_s`` of ``/readyz`` is the loading alone).
Prints a Markdown table, one row per run, and the medians. ``--pythonpath`` runs another checkout's code (a "before"
figure: a checkout without progress lines shows the total only).

    python benchmarks/serve_startup.py --runs 3
    python benchmarks/serve_startup.py --runs 3 --pythonpath /tmp/before    # git archive HEAD~1 | tar -x -C ...
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

SMALL = {"embed_dims": 128, "num_layers": 4, "num_heads": 4, "feedforward_channels": 512, "num_tokenizer_layers": 0}
STAGES = {  # progress line -> stage name (a stage lasts until the next line; "ready": serve.run returned)
    "importing Ray Serve": "import Ray Serve",
    "starting Ray on this machine": "Ray start",
    "joining the Ray cluster": "Ray join",
    "starting Ray Serve": "Serve controller + proxy",
    "starting the gateway": "gateway + replicas",
    "ready": "ready",
}
PROGRESS = re.compile(r"^\s*([0-9.]+) s  (.*)$")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def small_model(folder: Path, task: str) -> Path:
    from safetensors.torch import save_file

    from sapiens2 import build_model

    path = folder / f"small_{task}.safetensors"
    model = build_model(task, SMALL, input_size=(256, 192))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def one_run(argv: list[str], port: int, env: dict[str, str], cwd: Path, timeout: float) -> dict[str, float]:
    """Seconds of each stage and the total of one start, then the service stopped (Ctrl+C, as a user would) once it
    has printed that it serves. Each progress line is timed as it arrives (the command flushes them)."""
    lines: list[tuple[float, str]] = []  # (seconds since the launch, line) of stdout and stderr

    def read(stream) -> None:
        for line in stream:
            lines.append((time.perf_counter() - launched, line.rstrip("\n")))

    launched = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd, text=True,
                               start_new_session=True)  # fmt: skip
    readers = [
        threading.Thread(target=read, args=(stream,), daemon=True) for stream in (process.stdout, process.stderr)
    ]
    for reader in readers:
        reader.start()
    ready, load_s = None, float("nan")
    try:
        while time.perf_counter() - launched < timeout and process.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as answer:
                    ready = time.perf_counter() - launched
                    load_s = json.loads(answer.read()).get("replica", {}).get("load_s", float("nan"))
                    break
            except (urllib.error.URLError, OSError, ValueError):
                time.sleep(0.05)
        while ready is not None and time.perf_counter() - launched < timeout and process.poll() is None:
            if any(line.startswith("serving") for _, line in lines):
                break
            time.sleep(0.05)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
    for reader in readers:
        reader.join(timeout=5)
    if ready is None:
        raise RuntimeError("not ready within {timeout:g} s; its output ends:\n" + "\n".join(l for _, l in lines[-30:]))
    marks = []
    for at, line in lines:
        match = PROGRESS.match(line)
        name = match and next((stage for key, stage in STAGES.items() if match.group(2).startswith(key)), None)
        if name:
            marks.append((name, at))
    stages = {"total": ready}
    if marks:  # before the first line: the interpreter, torch and the command's checks
        stages["python + torch + checks"] = marks[0][1]
        for (name, at), (_, until) in zip(marks, marks[1:], strict=False):
            stages[name] = until - at
        stages["/readyz after ready"] = ready - dict(marks).get("ready", ready)
    stages["models loaded"] = load_s  # inside "gateway + replicas"
    return stages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--task", default="seg")
    parser.add_argument("--model", action="append", default=[], metavar="TASK=PATH",
                        help="model files (default: a small random model per task)")  # fmt: skip
    parser.add_argument("--devices", default="cpu")
    parser.add_argument("--threads", default="1")
    parser.add_argument("--pythonpath", default=None, help="run the sapiens2 found here (another checkout)")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="serve_startup_"))
    models = args.model or [f"{task}={small_model(folder, task)}" for task in args.task.split(",")]
    env = dict(os.environ, RAY_TMPDIR=str(folder), OMP_NUM_THREADS=args.threads)
    if args.pythonpath:
        env["PYTHONPATH"] = args.pythonpath
    rows = []
    for _ in range(args.runs):
        port = free_port()
        argv = [sys.executable, "-m", "sapiens2", "serve", "--task", args.task, *(f"--model={m}" for m in models),
                "--devices", args.devices, "--threads", args.threads, "--port", str(port)]  # fmt: skip
        if not args.model:
            argv += ["--input-size", "256", "192"]
        rows.append(one_run(argv, port, env, folder, args.timeout))
    names = list(dict.fromkeys(name for row in rows for name in row))
    print(f"sapiens2 serve --task {args.task} --devices {args.devices}: seconds from launch to /readyz 200\n")
    print("| run | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for index, row in enumerate(rows, 1):
        print(f"| {index} | " + " | ".join(f"{row.get(name, float('nan')):.1f}" for name in names) + " |")
    medians = [statistics.median(row.get(name, float("nan")) for row in rows) for name in names]
    print("| median | " + " | ".join(f"{value:.1f}" for value in medians) + " |")


if __name__ == "__main__":
    main()
