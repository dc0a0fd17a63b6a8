"""``sapiens2 serve`` as a real process (its own local Ray instance, real sockets on loopback) against hostile
clients and operators: idle uploads, a port already taken, a model replica killed with SIGKILL, SIGTERM, and which
sockets the whole process tree listens on."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import pytest
from conftest import require_module
from test_serve import free_port

MAX_QUEUE = 4
REQUEST_TIMEOUT = 8.0


@dataclass
class Server:
    process: subprocess.Popen
    port: int
    stderr: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def serve_command(tiny_checkpoints, port: int, *flags: str) -> list[str]:
    return [sys.executable, "-m", "sapiens2", "serve", "--task", "seg", f"--model=seg={tiny_checkpoints['seg']}",
            "--devices", "cpu", "--threads", "1", "--port", str(port), *flags]  # fmt: skip


@contextlib.contextmanager
def cli_server(tiny_checkpoints, folder: Path, *flags: str):
    """``sapiens2 serve`` in a process group of its own (Ray's temporary files under ``folder``), once it says it
    serves; whatever of its process tree is left at the end is killed."""
    require_module("ray")
    require_module("fastapi")
    port = free_port()
    out, err = folder / "serve.out", folder / "serve.err"
    env = os.environ | {"RAY_TMPDIR": str(folder), "OMP_NUM_THREADS": "1"}
    with out.open("w") as stdout, err.open("w") as stderr:
        process = subprocess.Popen(serve_command(tiny_checkpoints, port, *flags), stdout=stdout, stderr=stderr,
                                   env=env, start_new_session=True)  # fmt: skip
    tree: set[int] = set()
    try:
        deadline = time.monotonic() + 240
        while "serving" not in out.read_text():
            assert process.poll() is None and time.monotonic() < deadline, err.read_text()[-3000:]
            time.sleep(0.2)
        tree = descendants(process.pid)
        yield Server(process, port, err)
    finally:
        tree |= descendants(process.pid)
        for pid in tree:  # Ray's agents leave the process group: each by its id
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        process.wait(timeout=60)


def descendants(root: int) -> set[int]:
    """``root`` and every process under it (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            parent = int(Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(name))
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo += children.get(pid, [])
    return found


def listening_sockets(root: int) -> list[tuple[str, int, str]]:
    """(address, port, process) of every TCP socket that ``root`` or a process under it listens on."""
    listening = {}
    for table, width in (("tcp", 4), ("tcp6", 16)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A":  # TCP_LISTEN
                continue
            address, port = fields[1].split(":")
            raw = bytes.fromhex(address)
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, width, 4))  # host-order 32-bit words
            listening[fields[9]] = (str(ipaddress.ip_address(raw)), int(port, 16))
    found = []
    for pid in descendants(root):
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
            name = " ".join([Path(argv[0]).name, *argv[1:]])[:80]  # the program's own name, wherever it is installed
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:[") and link[8:-1] in listening:
                        found.append((*listening[link[8:-1]], name.strip()))
    return sorted(set(found))


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return (getattr(ip, "ipv4_mapped", None) or ip).is_loopback


def png() -> bytes:
    return cv2.imencode(".png", np.full((64, 48, 3), 90, np.uint8))[1].tobytes()


def get(url: str, timeout: float = 60.0, data: bytes | None = None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


@pytest.fixture(scope="module")
def server(tiny_checkpoints, tmp_path_factory):
    flags = ("--max-queue", str(MAX_QUEUE), "--request-timeout", f"{REQUEST_TIMEOUT:g}", "--max-wait-ms", "5")
    with cli_server(tiny_checkpoints, tmp_path_factory.mktemp("ray"), *flags) as running:
        yield running


def test_the_local_ray_instance_listens_on_loopback_only(server):
    sockets = listening_sockets(server.process.pid)
    assert ("127.0.0.1", server.port) in [(address, port) for address, port, _ in sockets]
    names = " ".join(name for _, _, name in sockets)
    assert all(part in names for part in ("gcs_server", "raylet", "DashboardAgent", "ServeController")), sockets
    # Ray Serve (2.60) binds each replica's inter-deployment gRPC server to "[::]:0" in its own code
    # (ray/serve/_private/replica.py), with no option to change it; everything else must be loopback
    exposed = [s for s in sockets if not is_loopback(s[0]) and not (s[0] == "::" and "ServeReplica" in s[2])]
    assert exposed == [], f"listening beyond loopback: {exposed}"


def test_start_up_says_each_stage_as_it_begins_and_readyz_how_long_the_models_took(server):
    """A start takes seconds to a minute: the command prints each stage with the seconds since it began, the local
    Ray instance gets this machine's cores (its idle workers, one per CPU, are what the gateway and replica take at
    once), and /readyz says how long the replica took to load its models."""
    import json
    import re

    stages = [re.match(r"^\s*([0-9.]+) s  (.+)$", line) for line in server.stderr.read_text().splitlines()]
    stages = [(float(m.group(1)), m.group(2)) for m in stages if m]
    expected = ["importing Ray Serve", f"starting Ray on this machine (loopback only, {os.cpu_count()} CPU(s))",
                "starting Ray Serve (its controller and HTTP proxy)",
                "starting the gateway and 1 model replica(s) (cpu), each loading seg", "ready"]  # fmt: skip
    assert [message for _, message in stages] == expected, stages
    seconds = [at for at, _ in stages]
    assert seconds == sorted(seconds) and seconds[-1] > seconds[0], stages
    status, body = get(server.url + "/readyz")
    load_s = json.loads(body)["replica"]["load_s"]
    assert status == 200 and 0 < load_s < seconds[-1] - seconds[-2], (load_s, stages)


def test_a_port_in_use_is_one_line_naming_it_at_once(server, tiny_checkpoints):
    with socket.socket() as other:  # a plain server (no SO_REUSEPORT), and this service's own port
        other.bind(("127.0.0.1", 0))
        other.listen()
        for port in (other.getsockname()[1], server.port):
            started = time.monotonic()
            result = subprocess.run(serve_command(tiny_checkpoints, port), capture_output=True, text=True,
                                    timeout=90)  # fmt: skip
            lines = result.stderr.strip().splitlines()
            assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
            assert f"--port {port}: 127.0.0.1:{port} is in use" in lines[0] and lines[0].endswith("--port")
            assert time.monotonic() - started < 30


@pytest.mark.slow  # 8-15 s: the default suite stays under 10 minutes
def test_idle_uploads_take_no_slot_and_are_cut_off_at_the_request_timeout(server):
    head = f"POST /v1/seg HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nContent-Length: 100000\r\n\r\n".encode()
    idle = []
    try:
        for _ in range(2 * MAX_QUEUE):  # announce 100 kB, send 7 kB, then nothing
            connection = socket.create_connection(("127.0.0.1", server.port), timeout=REQUEST_TIMEOUT + 30)
            connection.sendall(head + b"x" * 7000)
            idle.append(connection)
        started = time.monotonic()
        time.sleep(1.0)  # inside the gateway by now
        status, body = get(server.url + "/v1/seg", data=png())
        assert status == 200, body[:300]
        for connection in idle:
            answer = b""
            while chunk := connection.recv(65536):  # until the service closes the connection
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 408") and b"--request-timeout" in answer, answer[:300]
        assert time.monotonic() - started < REQUEST_TIMEOUT + 10
    finally:
        for connection in idle:
            connection.close()


def test_readyz_answers_at_once_while_a_killed_replica_is_replaced(server):
    import json

    victim = json.loads(get(server.url + "/readyz")[1])["replica"]["pid"]
    os.kill(victim, signal.SIGKILL)
    slowest, deadline = 0.0, time.monotonic() + 120
    while True:
        asked = time.monotonic()
        status, body = get(server.url + "/readyz", timeout=4.0)  # a load balancer's probe
        slowest = max(slowest, time.monotonic() - asked)
        if status == 200 and json.loads(body)["replica"]["pid"] != victim:
            break
        assert status in (200, 503) and time.monotonic() < deadline, body
        time.sleep(0.2)
    assert slowest < 1.0, f"a /readyz probe took {slowest:.1f} s"
    assert get(server.url + "/v1/seg", data=png())[0] == 200


def test_sigterm_stops_an_idle_server_within_seconds(server):
    tree = descendants(server.process.pid)
    started = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(timeout=90) == 0
    took = time.monotonic() - started
    assert took < 6.0, f"an idle server took {took:.1f} s to stop"
    time.sleep(1.0)
    assert not [pid for pid in tree if alive(pid)], "Ray processes outlived the server"


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
