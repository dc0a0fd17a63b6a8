"""How a CPU forward's speed depends on the torch thread count when other processes share the cores (issue #25).

Each configuration runs in a fresh interpreter (OpenMP reads ``OMP_WAIT_POLICY`` once, when torch loads it), in
alternating rounds, with or without a busy-loop process burning one core beside it::

    python benchmarks/cpu_threads.py --rounds 3 --seconds 3
    python benchmarks/cpu_threads.py --model 0.1b --input-size 512 384 --seconds 10

Prints images/s per configuration (median over rounds) and the ratio to 1 thread on the same load.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time

TINY = {"embed_dims": 32, "num_layers": 2, "num_heads": 2, "feedforward_channels": 64, "num_tokenizer_layers": 0}

CHILD = r"""
import json, os, sys, time
import torch
from sapiens2.models import Sapiens2
args = json.loads(sys.argv[1])
if args["via_sapiens2"]:
    from sapiens2.models.threads import set_threads
    set_threads(args["threads"])
else:
    torch.set_num_threads(args["threads"])
model = Sapiens2(args["model"], img_size=tuple(args["size"]), out_type="featmap").eval()
x = torch.randn(args["batch"], 3, *args["size"])
with torch.inference_mode():
    for _ in range(3):
        model(x)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < args["seconds"]:
        model(x)
        count += 1
print(json.dumps({"images_per_s": count * args["batch"] / (time.perf_counter() - start)}))
"""


def _burn(stop) -> None:
    while not stop.is_set():
        sum(range(10_000))


def _run(config: dict, wait_policy: str | None) -> float:
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)
    if wait_policy:
        env["OMP_WAIT_POLICY"] = wait_policy
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(config)], env=env, capture_output=True, text=True,
                         check=True)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])["images_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="arch name (default: a 2-layer 32-wide tiny backbone)")
    parser.add_argument("--input-size", type=int, nargs=2, default=(64, 48))
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--threads", type=int, nargs="+", default=(1, 2))
    parser.add_argument("--policies", nargs="+", default=("default", "PASSIVE"), help="OMP_WAIT_POLICY values")
    parser.add_argument("--via-sapiens2", action="store_true", help="set threads with sapiens2's set_threads")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    results: dict[tuple, list[float]] = {}
    for _ in range(args.rounds):
        for busy in (False, True):
            stop = multiprocessing.Event()
            burner = multiprocessing.Process(target=_burn, args=(stop,), daemon=True) if busy else None
            if burner:
                burner.start()
                time.sleep(0.5)
            try:
                for policy in args.policies:
                    for threads in args.threads:
                        config = {"model": args.model or TINY, "size": list(args.input_size), "batch": args.batch_size,
                                  "threads": threads, "seconds": args.seconds, "via_sapiens2": args.via_sapiens2}
                        rate = _run(config, None if policy == "default" else policy)
                        results.setdefault((busy, policy, threads), []).append(rate)
                        print(f"# busy={busy} {policy} threads={threads}: {rate:.2f} images/s", flush=True)
            finally:
                if burner:
                    stop.set()
                    burner.join()
    print(f"{'other load':<14}{'OMP_WAIT_POLICY':<17}{'threads':>8}{'images/s':>12}{'vs 1 thread':>13}")
    for (busy, policy, threads), rates in sorted(results.items()):
        base = statistics.median(results[(busy, policy, min(args.threads))])
        rate = statistics.median(rates)
        print(f"{'1 core busy' if busy else 'none':<14}{policy:<17}{threads:>8}{rate:>12.3g}{rate / base:>12.2f}x")


if __name__ == "__main__":
    main()
