"""The service on Ray Serve: a ``Gateway`` (the FastAPI ingress: auth, limits, decoding, encoding, metrics) in front
of ``ModelReplica`` deployments (one per device, a ``Predictor`` per task behind ``@serve.batch``).

A request's image is decoded once in the gateway (``data.io.decode_image``: the checks and pixels of
``read_image``) and handed to the model replicas once per task; each replica gathers the images of many requests
into one ``Predictor.predict_batch`` call per task (``predict.batch.run_tasks``: the pre/post-processing of
``sapiens2 predict``, a failing batch retried image by image), so a served result is ``Predictor``'s.

``build_app(options)`` is the application (``serve.run`` it on any Ray cluster), ``build(args)`` the builder a Ray
Serve config file names (``serve run``/``serve deploy``), ``start``/``stop`` run it on this machine.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import json
import math
import os
import socket
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import unquote, urlsplit

import numpy as np

try:  # the [serve] extra (Ray Serve brings FastAPI and prometheus_client)
    import ray
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, PlainTextResponse
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
    from ray import serve
    from ray.exceptions import ActorUnavailableError, RayActorError
except ImportError as error:
    raise ImportError(f"sapiens2 serve needs Ray Serve ({error.name} is missing): pip install 'sapiens2[serve]'",
                      name=error.name) from None

from .. import __version__
from ..bulk.ray_engine import start_local_ray
from ..data.io import ImageReadError, decode_image, pixel_limit_problem
from ..memory import release_free_memory
from ..tasks import TASKS
from .codec import FORMATS, encode_result, format_problem
from .options import KEYPOINT_FORMATS, ServeOptions, replica_devices

__all__ = ["APP_NAME", "Gateway", "ModelReplica", "build", "build_app", "local_ray_lost", "start", "stop"]

APP_NAME = "sapiens2"
TOKEN_ENV = "SAPIENS2_SERVE_TOKEN"
READY_PROBE_TIMEOUT_S = 5.0
"""A model replica that does not describe itself within this long is not ready (``/readyz`` 503)."""


class HTTPProblem(Exception):
    """A request answered with ``status`` and ``{"error": message}`` (and headers such as ``Retry-After``)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}

    def response(self) -> JSONResponse:
        return JSONResponse({"error": self.message}, status_code=self.status, headers=self.headers)


# ---------------------------------------------------------------------------------------------------------------------
# The model replicas


@serve.deployment(name="Sapiens2Model")
class ModelReplica:
    """One device's Predictors (one per task), found and loaded as ``sapiens2 predict`` loads them."""

    def __init__(self, options: dict[str, Any], device: str, threads: int | None) -> None:
        from ..predict.batch import make_predictors
        from ..predict.options import PredictOptions, python_option

        started = time.perf_counter()
        self.options = o = ServeOptions.from_dict(options)
        predict_options = PredictOptions(
            tasks=o.tasks, output=".", model=o.model, models=o.models, device=device, dtype=o.dtype,
            batch_size=o.batch_size, input_size=o.input_size, mode=o.mode, compile=o.compile, quantize=o.quantize,
            detector=o.detector, flip_test=o.flip_test, threads=threads if device == "cpu" else None,
        )  # fmt: skip
        self.predictors = make_predictors(predict_options, list(o.tasks), python_option)
        self.load_s = round(time.perf_counter() - started, 3)  # finding and loading the models (/readyz)
        self.device = device
        # Every batch on one thread: the Predictors are not shared between threads, and the C heap keeps one arena
        # instead of one per worker of asyncio's default pool (whose free pages made the resident memory wander).
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="sapiens2-infer")
        self._batched.set_max_batch_size(o.max_batch)
        self._batched.set_batch_wait_timeout_s(o.max_wait_ms / 1000.0)

    def describe(self) -> dict[str, Any]:
        """This replica's process id, device, tasks and the seconds its models took to load (``/readyz``)."""
        return {"pid": os.getpid(), "device": self.device, "tasks": list(self.predictors), "load_s": self.load_s}

    async def infer(self, task: str, image: np.ndarray) -> dict[str, Any]:
        """One image through one task, batched with other requests': ``{"result", "batch"}`` or ``{"error"}``."""
        return await self._batched(task, image)

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.01)
    async def _batched(self, tasks: list[str], images: list[np.ndarray]) -> list[dict[str, Any]]:
        return await asyncio.get_running_loop().run_in_executor(self._worker, self._run, tasks, images)

    def _run(self, tasks: list[str], images: list[np.ndarray]) -> list[dict[str, Any]]:
        from ..predict.batch import run_tasks

        order = [task for task in TASKS if task in tasks]
        sizes = {task: tasks.count(task) for task in order}
        replies: list[dict[str, Any]] = [{"error": "not run"} for _ in images]
        pending = [[task] for task in tasks]
        for task, index, result, _ in run_tasks(self.predictors, order, None, images, pending):
            if isinstance(result, Exception):
                replies[index] = {"error": f"{task} failed: {type(result).__name__}: {result}"}
            else:
                replies[index] = {"result": result, "batch": sizes[task]}
        if self.device == "cpu":  # a batch's activations are freed now: give their pages back
            release_free_memory()
        return replies


# ---------------------------------------------------------------------------------------------------------------------
# The gateway

api = FastAPI(
    title="sapiens2",
    version=__version__,
    description="Sapiens2 human-centric vision models over HTTP (docs/serving.md). POST an image to /v1/{task}.",
)

_IMAGE_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {"type": "object", "properties": {"image": {"type": "string", "format": "binary"}}}
            },
            "application/json": {
                "schema": {
                    "type": "object",
                    "properties": {
                        "image": {"type": "string", "format": "byte", "description": "the encoded image, base64"},
                        "name": {"type": "string", "description": "the image's name in errors and results"},
                        "url": {"type": "string", "description": "fetch the image (only under allowed prefixes)"},
                    },
                }
            },
            "image/*": {"schema": {"type": "string", "format": "binary"}},
        },
    }
}


class _Metrics:
    """The gateway's Prometheus metrics, in a registry of its own (``/metrics``)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("sapiens2_requests", "Requests answered, by task and HTTP status", ["task", "code"],
                                registry=self.registry)  # fmt: skip
        self.latency = Histogram(
            "sapiens2_request_seconds", "Time from arrival to answer, by task", ["task"], registry=self.registry,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
        )  # fmt: skip
        self.batch = Histogram("sapiens2_batch_size", "Images per model batch a request's image ran in, by task",
                               ["task"], registry=self.registry, buckets=(1, 2, 4, 8, 16, 32, 64))  # fmt: skip
        self.queue = Gauge("sapiens2_queue_depth", "Images waiting for or running in a model, by task", ["task"],
                           registry=self.registry)  # fmt: skip
        self.in_flight = Gauge("sapiens2_requests_in_flight", "Requests inside the service", registry=self.registry)
        self.rejected = Counter("sapiens2_rejected", "Requests turned away with 503 because the queue was full",
                                registry=self.registry)  # fmt: skip

    def text(self) -> bytes:
        return generate_latest(self.registry)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):  # a redirect could leave the allowed prefixes
        return None


@serve.deployment(name="Sapiens2Gateway")
@serve.ingress(api)
class Gateway:
    """The HTTP side: every request is checked, decoded once and sent to the model replicas task by task."""

    def __init__(self, model: Any, options: dict[str, Any], token: str | None = None) -> None:
        self.model = model
        self.options = ServeOptions.from_dict(options)
        self.token = token or os.environ.get(TOKEN_ENV) or None
        self.metrics = _Metrics()
        self.active = 0  # requests admitted (their body arrived): at most max_queue
        self.receiving = 0  # requests whose body is still arriving, not admitted yet
        self.draining = False
        self.recent = deque(maxlen=64)  # seconds per answered request, for Retry-After
        # /readyz answers from this at once; _watch_replicas keeps it current (a probe of a dead replica can hang)
        self.readiness: dict[str, Any] = {"status": "not ready", "error": "no model replica has answered yet"}
        self.watcher = asyncio.get_running_loop().create_task(self._watch_replicas())

    def drain(self) -> int:
        """Stop taking requests (503, and ``/readyz`` 503); returns how many are still inside (``stop``)."""
        self.draining = True
        return self.active + self.receiving

    async def _watch_replicas(self) -> None:
        """Ask a model replica to describe itself every second; ``readiness`` is the last answer, or why none came."""
        while True:
            try:
                replica = await asyncio.wait_for(self.model.describe.remote(), timeout=READY_PROBE_TIMEOUT_S)
                self.readiness = {"status": "ready", "tasks": list(self.options.tasks), "replica": replica,
                                  "gateway": {"pid": os.getpid()}}  # fmt: skip
            except Exception as error:  # not started, restarting, or gone
                self.readiness = {"status": "not ready", "error": f"{type(error).__name__}: {error}".strip()}
            await asyncio.sleep(1.0)

    # ------------------------------------------------------------------------------------------------- endpoints

    @api.get("/healthz", summary="Liveness: the gateway answers")
    async def healthz(self) -> dict[str, str]:
        return {"status": "ok"}

    @api.get("/readyz", summary="Readiness: a model replica answers (503 until one does)")
    async def readyz(self) -> Any:
        if self.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        return JSONResponse(self.readiness, status_code=200 if self.readiness["status"] == "ready" else 503)

    @api.get("/metrics", summary="Prometheus metrics: requests, latency, batch sizes, queue depth per task")
    async def metrics(self, request: Request) -> Any:
        try:
            self._authorise(request)
        except HTTPProblem as problem:
            return problem.response()
        return PlainTextResponse(self.metrics.text(), media_type="text/plain; version=0.0.4")

    @api.get("/v1", summary="What this service serves: tasks, formats, keypoint sets, limits")
    async def describe(self, request: Request) -> Any:
        try:
            self._authorise(request)
        except HTTPProblem as problem:
            return problem.response()
        o = self.options
        return {"tasks": list(o.tasks), "formats": list(FORMATS), "keypoint_formats": list(KEYPOINT_FORMATS),
                "keypoint_format": o.keypoint_format, "max_megapixels": o.max_megapixels,
                "max_upload_mb": o.max_upload_mb, "max_batch": o.max_batch, "version": __version__}  # fmt: skip

    @api.post(
        "/v1/{tasks}",
        summary="Run one or more tasks (comma-separated: /v1/pose,seg) on one image",
        description="The image as multipart (field 'image'), raw bytes, or JSON {'image': base64} / {'url': ...}. "
        "format: npy (dense default), png (seg default; pictures for the other tasks), rle (seg), exr. "
        "keypoint_format: the pose keypoint set.",
        openapi_extra=_IMAGE_BODY,
    )
    async def predict(self, tasks: str, request: Request, format: str | None = None,
                      keypoint_format: str | None = None) -> Any:  # fmt: skip
        start = time.perf_counter()
        deadline = start + self.options.request_timeout_s
        names = [t.strip() for t in tasks.split(",") if t.strip()]
        try:
            self._authorise(request)
            self._check_request(names, format, keypoint_format)
            self._admit()  # a full or stopping service says so before the body is read
            body = await self._receive(request, deadline)
            self._admit()  # a slot is taken only once the body is here: slow senders hold none
        except HTTPProblem as problem:
            return self._answer(problem.response(), names, start)
        self.active += 1
        self.metrics.in_flight.inc()
        try:
            name, data = await self._image_bytes(request, body)
            del body
            problem = pixel_limit_problem(data, self.options.max_megapixels)
            if problem is not None:
                raise HTTPProblem(413, f"image {name!r}: {problem}")
            try:
                image = await asyncio.to_thread(decode_image, data, name, max_megapixels=self.options.max_megapixels)
            except ImageReadError as error:
                raise HTTPProblem(413 if "over the limit" in error.reason else 400, str(error)) from None
            del data
            results = await asyncio.gather(*(self._infer(task, image, deadline) for task in names),
                                           return_exceptions=True)  # fmt: skip
            failed = next((result for result in results if isinstance(result, BaseException)), None)
            if failed is not None:
                raise failed
            keypoints = keypoint_format or self.options.keypoint_format
            encoded = await asyncio.to_thread(
                lambda: {
                    task: encode_result(task, result, format, keypoints)
                    for task, result in zip(names, results, strict=True)
                }
            )
            height, width = image.shape[:2]
            body = {"image": {"name": name, "height": height, "width": width}, "results": encoded,
                    "milliseconds": round(1000.0 * (time.perf_counter() - start), 3)}  # fmt: skip
            self.recent.append(time.perf_counter() - start)
            return self._answer(JSONResponse(body), names, start)
        except HTTPProblem as problem:
            return self._answer(problem.response(), names, start)
        except Exception as error:  # a bug of ours: one line, and the service goes on
            problem = HTTPProblem(500, f"internal error: {type(error).__name__}: {error}".splitlines()[0])
            return self._answer(problem.response(), names, start)
        finally:
            self.active -= 1
            self.metrics.in_flight.dec()

    # ------------------------------------------------------------------------------------------------- internals

    def _answer(self, response: Any, tasks: list[str], start: float) -> Any:
        seconds = time.perf_counter() - start
        for task in tasks if tasks and all(t in TASKS for t in tasks) else ["unknown"]:
            self.metrics.requests.labels(task, str(response.status_code)).inc()
            self.metrics.latency.labels(task).observe(seconds)
        return response

    def _authorise(self, request: Request) -> None:
        if self.token is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self.token.encode()):
            raise HTTPProblem(401, "missing or wrong bearer token: send 'Authorization: Bearer <token>'",
                              {"WWW-Authenticate": 'Bearer realm="sapiens2"'})  # fmt: skip

    def _check_request(self, names: list[str], fmt: str | None, keypoint_format: str | None) -> None:
        served = ", ".join(self.options.tasks)
        if not names:
            raise HTTPProblem(404, f"name a task: POST /v1/{{task}}, one or more of {served}")
        unknown = [task for task in names if task not in self.options.tasks]
        if unknown:
            raise HTTPProblem(404, f"task {unknown[0]!r} is not served here; served: {served}")
        if len(set(names)) != len(names):
            raise HTTPProblem(400, f"a task is named twice in {','.join(names)!r}")
        problem = format_problem(names, fmt)
        if problem is not None:
            raise HTTPProblem(400, problem)
        if keypoint_format is not None and keypoint_format not in KEYPOINT_FORMATS:
            raise HTTPProblem(400, f"keypoint_format={keypoint_format!r} is not one of {', '.join(KEYPOINT_FORMATS)}")

    def _retry_after(self) -> int:
        typical = sorted(self.recent)[len(self.recent) // 2] if self.recent else 1.0
        return int(min(60, max(1, math.ceil(typical))))

    def _admit(self) -> None:
        """Refuse a request (503 + Retry-After) while the service stops or holds ``max_queue`` requests."""
        if self.draining:
            raise HTTPProblem(503, "the service is shutting down; retry on another instance",
                              {"Retry-After": str(self._retry_after())})  # fmt: skip
        if self.active >= self.options.max_queue:
            self.metrics.rejected.inc()
            raise HTTPProblem(503, f"the service is full ({self.active} requests queued); retry later",
                              {"Retry-After": str(self._retry_after())})  # fmt: skip

    async def _receive(self, request: Request, deadline: float) -> bytes:
        """The request body by the request's deadline: a client that sends too slowly, or stops, is answered 408
        and its connection closed."""
        self.receiving += 1
        try:
            return await asyncio.wait_for(self._body(request), timeout=max(0.0, deadline - time.perf_counter()))
        except asyncio.TimeoutError:
            late = f"the request body did not arrive within {self.options.request_timeout_s:g} s (--request-timeout)"
            raise HTTPProblem(408, f"{late}; send it whole, without pauses", {"Connection": "close"}) from None
        finally:
            self.receiving -= 1

    async def _body(self, request: Request) -> bytes:
        """The request body, refused from ``Content-Length`` when too large, and while reading when unannounced."""
        limit = int(self.options.max_upload_mb * 1e6)
        too_large = f"the request body is over the limit of {self.options.max_upload_mb:g} MB"
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise HTTPProblem(413, f"{too_large} ({int(length) / 1e6:.1f} MB announced)")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise HTTPProblem(413, too_large)
            chunks.append(chunk)
        return b"".join(chunks)

    async def _image_bytes(self, request: Request, body: bytes) -> tuple[str, bytes]:
        """(name, encoded image) from a multipart form, a JSON body (base64 or an allowed URL) or raw bytes."""
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind == "multipart/form-data":

            async def replay() -> dict[str, Any]:
                return {"type": "http.request", "body": body, "more_body": False}

            try:
                form = await Request(request.scope, replay).form()
            except Exception as error:
                raise HTTPProblem(400, f"cannot read the multipart form: {error}") from None
            upload = form.get("image")
            if upload is None or isinstance(upload, str):
                raise HTTPProblem(400, "the multipart form has no file field 'image'")
            return upload.filename or "image", await upload.read()
        if kind == "application/json":
            try:
                data = json.loads(body)
            except ValueError as error:
                raise HTTPProblem(400, f"the JSON body is not valid JSON: {error}") from None
            if not isinstance(data, dict) or ("image" in data) == ("url" in data):
                raise HTTPProblem(400, "the JSON body must be an object with one of 'image' (base64) or 'url'")
            if "url" in data:
                return await asyncio.to_thread(self._fetch, str(data["url"]))
            try:
                return str(data.get("name") or "image"), base64.b64decode(str(data["image"]), validate=True)
            except (binascii.Error, ValueError):
                raise HTTPProblem(400, "'image' in the JSON body is not valid base64") from None
        if not body:
            raise HTTPProblem(400, "no image: send it as the body, a multipart field 'image', or JSON {'image': ...}")
        return request.headers.get("x-filename") or "image", body

    def _fetch(self, url: str) -> tuple[str, bytes]:
        """An image from a URL under one of the allowed prefixes (no redirects, size-limited)."""
        if not self.options.allow_urls:
            raise HTTPProblem(403, "this service does not fetch URLs; send the image itself (the operator can allow "
                              "URL prefixes with --allow-url)")  # fmt: skip
        parts = urlsplit(url)
        segments = unquote(parts.path).split("/")
        allowed = (
            ".." not in segments
            and "." not in segments
            and not parts.username
            and any(
                url.startswith(prefix) and parts.hostname == urlsplit(prefix).hostname
                for prefix in self.options.allow_urls
            )
        )
        if not allowed:
            raise HTTPProblem(403, f"URL {url!r} is not under an allowed prefix")
        limit = int(self.options.max_upload_mb * 1e6)
        opener = urllib.request.build_opener(_NoRedirect)
        try:
            with opener.open(url, timeout=10) as response:
                data = response.read(limit + 1)
        except urllib.error.HTTPError as error:
            raise HTTPProblem(400, f"fetching {url!r} failed: HTTP {error.code}") from None
        except (urllib.error.URLError, OSError) as error:
            raise HTTPProblem(400, f"fetching {url!r} failed: {getattr(error, 'reason', error)}") from None
        if len(data) > limit:
            raise HTTPProblem(413, f"{url!r} is over the limit of {self.options.max_upload_mb:g} MB")
        return parts.path.rsplit("/", 1)[-1] or "image", data

    async def _infer(self, task: str, image: np.ndarray, deadline: float) -> Any:
        """One task's result from the model replicas; a replica that dies is retried on another (or its
        replacement) until the deadline, then the request is answered 503."""
        self.metrics.queue.labels(task).inc()
        try:
            delay = 0.25
            while True:
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    raise HTTPProblem(504, f"{task}: no result within {self.options.request_timeout_s:g} s")
                try:
                    reply = await asyncio.wait_for(self.model.infer.remote(task, image), timeout=remaining)
                    break
                except (RayActorError, ActorUnavailableError) as error:
                    self.readiness = {"status": "not ready", "error": f"{type(error).__name__}: a replica stopped"}
                    if deadline - time.perf_counter() <= delay:
                        raise HTTPProblem(503, f"{task}: the model replica stopped and none came back in time; "
                                          "retry", {"Retry-After": str(self._retry_after())}) from None  # fmt: skip
                    await asyncio.sleep(delay)
                    delay = min(2.0, delay * 2)
                except asyncio.TimeoutError:
                    raise HTTPProblem(504, f"{task}: no result within {self.options.request_timeout_s:g} s") from None
        finally:
            self.metrics.queue.labels(task).dec()
        if "error" in reply:
            raise HTTPProblem(500, reply["error"])
        self.metrics.batch.labels(task).observe(reply["batch"])
        return reply["result"]


# ---------------------------------------------------------------------------------------------------------------------
# Building and running


def build_app(options: ServeOptions) -> Any:
    """The Ray Serve application of ``options`` (checked first): ``serve.run(build_app(options))`` on any cluster.

    One ``ModelReplica`` per device (``options.devices``; GPU replicas take one GPU each, CPU replicas one CPU and
    ``options.threads`` torch threads), behind one ``Gateway``. Queues are bounded at every hop: the gateway answers
    503 past ``max_queue`` requests, and each replica takes at most two batches' worth of images at a time.
    """
    options.check()
    devices = replica_devices(options.devices)
    threads = options.threads
    if devices[0] == "cpu" and threads is None:
        from ..models.threads import available_cores

        threads = max(1, available_cores() // len(devices))
    resources = {"num_gpus": 1} if devices[0] == "cuda" else {"num_cpus": 1}
    data = options.to_dict()
    model = ModelReplica.options(
        num_replicas=len(devices),
        ray_actor_options=resources,
        max_ongoing_requests=2 * options.max_batch,
        graceful_shutdown_timeout_s=options.drain_s,
        graceful_shutdown_wait_loop_s=0.1,
        health_check_period_s=2.0,
    ).bind(data, devices[0], threads)
    # The gateway answers the overflow itself (503 with Retry-After), so Serve's proxy must pass it on: room for
    # every request in flight, and as much again queued at the proxy for the moments its probe of the gateway's
    # queue length is late on a busy host (Serve's own 503 carries no Retry-After). Both bounds stay finite.
    gateway_room = 4 * options.max_queue + 64
    return Gateway.options(
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=gateway_room,
        max_queued_requests=gateway_room,
        graceful_shutdown_timeout_s=options.drain_s,
        graceful_shutdown_wait_loop_s=0.1,
    ).bind(model, data, options.token)


def build(args: dict[str, Any]) -> Any:
    """The builder a Ray Serve config file names (``import_path: sapiens2.serve.app:build``): ``args`` are
    ``ServeOptions`` fields; the token comes from ``$SAPIENS2_SERVE_TOKEN`` in the replicas' environment."""
    return build_app(ServeOptions.from_dict(dict(args or {})))


_started_ray = False  # whether start() started the local Ray instance (stop() ends it)


def start(
    options: ServeOptions,
    ray_address: str | None = None,
    num_cpus: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> str:
    """Start Ray (or join ``ray_address``), Serve on ``options.host:port`` and the application; returns its URL once
    every replica is up. A local Ray instance listens on loopback only (``bulk.ray_engine.start_local_ray``) and is
    given ``num_cpus`` (default: this machine's cores, or one per CPU replica where they are more). Ray starts an
    idle worker process per CPU it is given, which the gateway and replicas then take at once: one CPU for a single
    replica was 12.7 s to ready against 9.8 s with every core (2-core machine, docs/benchmarks.md). ``progress`` is
    told of each stage as it begins (``sapiens2 serve`` prints them)."""
    global _started_ray
    say = progress or (lambda message: None)
    devices = replica_devices(options.devices)
    if not ray.is_initialized():
        settings = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
        if ray_address is None:
            options.check_listen()
            if num_cpus is None:
                num_cpus = max(os.cpu_count() or 1, devices.count("cpu"))
            say(f"starting Ray on this machine (loopback only, {num_cpus} CPU(s))")
            start_local_ray(num_cpus=num_cpus, **settings)
            _started_ray = True
        else:
            say(f"joining the Ray cluster at {ray_address}")
            ray.init(address=ray_address, **settings)
    say("starting Ray Serve (its controller and HTTP proxy)")
    serve.start(http_options={"host": options.host, "port": int(options.port)})
    say(f"starting the gateway and {len(devices)} model replica(s) ({', '.join(devices)}), each loading "
        f"{', '.join(options.tasks)}")  # fmt: skip
    serve.run(build_app(options), name=APP_NAME, route_prefix="/", blocking=False)
    host = "127.0.0.1" if options.host in ("0.0.0.0", "::") else options.host
    return f"http://{host}:{int(options.port)}"


def stop(drain_s: float = 30.0) -> None:
    """Drain, then shut Serve down (and the local Ray instance ``start`` started): the gateway answers new requests
    503 (and ``/readyz`` 503) while those inside finish, for up to ``drain_s`` seconds; then Serve stops.

    A local instance idle when asked to stop ends at once (nothing to hand over: Ray's own shutdown is enough); one
    that was busy lets Serve see the last answers out first, and what still runs at ``drain_s`` is cut off."""
    global _started_ray
    deadline = time.monotonic() + drain_s
    inside = drained = 0
    try:
        gateway = serve.get_app_handle(APP_NAME)
        inside = left = gateway.drain.remote().result(timeout_s=5.0)
        while left > 0 and time.monotonic() < deadline:
            time.sleep(0.05)
            left = gateway.drain.remote().result(timeout_s=5.0)
        drained = left == 0
    except Exception:  # no such application (never started, already gone): nothing to drain
        drained = True
    if not _started_ray or (inside and drained):
        serve.shutdown()  # the replicas stop once their answers are out: at once when drained
    if _started_ray:
        _started_ray = False  # from here on its end is expected (``local_ray_lost``)
        ray.shutdown()


def local_ray_lost() -> bool:
    """Whether the local Ray instance ``start`` started has gone while this process runs: its GCS refuses
    connections. A signal sent to the whole process group (``kill -- -PGID``, ``timeout``, systemd's default
    KillMode) stops Ray's processes with this one; then nothing is left to drain, and Serve's shutdown would wait
    60 s for the GCS before it fails."""
    if not _started_ray:
        return False
    host, _, port = ray.get_runtime_context().gcs_address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=1.0).close()
    except OSError:
        return True
    return False
