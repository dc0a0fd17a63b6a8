"""``sapiens2 serve`` over real HTTP on loopback, against one real local Ray Serve instance (tiny random models),
started from the Ray Serve config file that ``sapiens2 serve --write-config`` writes."""

from __future__ import annotations

import base64
import http.server
import json
import socket
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cv2
import numpy as np
import pytest
from conftest import require_module, zeros_png

from sapiens2.metadata import SAMPLE_IMAGE

TOKEN = "s3cret-token"
TASKS = ("seg", "pose", "normal")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def photos(folder: Path, count: int = 6) -> list[Path]:
    """Crops and rescalings of the sample photo, as JPEG and PNG files of different sizes."""
    folder.mkdir(parents=True, exist_ok=True)
    image = cv2.imread(str(SAMPLE_IMAGE))
    paths = []
    for i in range(count):
        crop = image[8 * i : 300 + 20 * i, 4 * i : 240 + 10 * i]
        crop = cv2.resize(crop, None, fx=0.5 + 0.1 * i, fy=0.5 + 0.1 * i, interpolation=cv2.INTER_AREA)
        path = folder / f"photo{i}.{'jpg' if i % 2 else 'png'}"
        cv2.imwrite(str(path), crop)
        paths.append(path)
    return paths


def start_service(tiny_checkpoints, tmp_path_factory, **changes):
    """Ray (2 CPUs) + Serve on a free loopback port, built from the config file the CLI prints; yields the URL."""
    ray = require_module("ray")
    require_module("fastapi")
    yaml = require_module("yaml")
    from sapiens2.cli import main

    port = free_port()
    flags = ["serve", "--task", ",".join(TASKS), "--detector", "none", "--port", str(port), "--devices", "cpu",
             "--threads", "1", "--max-batch", "4", "--max-wait-ms", "50"]  # fmt: skip
    flags += [f"--model={task}={tiny_checkpoints[task]}" for task in TASKS]
    for flag, value in changes.items():
        flags += [flag, str(value)]
    config_path = tmp_path_factory.mktemp("serve") / "serve.yaml"
    assert main([*flags, "--write-config", str(config_path)]) == 0
    config = yaml.safe_load(config_path.read_text())
    assert config["http_options"] == {"host": "127.0.0.1", "port": port}
    application = config["applications"][0]
    import importlib

    module, _, builder = application["import_path"].partition(":")
    args = dict(application["args"], token=TOKEN)  # the token travels in the environment in a real config
    from ray import serve

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        serve.start(http_options=config["http_options"])
        serve.run(getattr(importlib.import_module(module), builder)(args), name=application["name"],
                  route_prefix=application["route_prefix"])  # fmt: skip
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def image_site(tmp_path_factory):
    """A loopback web server with an allowed folder (``/ok/``), a secret one and a redirect out of ``/ok/``."""
    tmp_path = tmp_path_factory.mktemp("site")
    (tmp_path / "ok").mkdir()
    (tmp_path / "secret").mkdir()
    photo = photos(tmp_path / "ok", 1)[0]
    (tmp_path / "secret" / photo.name).write_bytes(photo.read_bytes())

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(tmp_path), **kwargs)

        def do_GET(self):  # noqa: N802 (http.server's name)
            if self.path.startswith("/ok/redirect"):
                self.send_response(302)
                self.send_header("Location", f"/secret/{photo.name}")
                self.end_headers()
                return
            super().do_GET()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", photo
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def service(tiny_checkpoints, tmp_path_factory, image_site):
    yield from start_service(tiny_checkpoints, tmp_path_factory, **{"--allow-url": f"{image_site[0]}/ok/"})


def call(url: str, path: str, body: bytes | None = None, headers: dict | None = None, token: str | None = TOKEN,
         method: str | None = None) -> tuple[int, dict, object]:  # fmt: skip
    """(status, headers, JSON or text) of one real HTTP request."""
    headers = dict(headers or {})
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url + path, data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            status, head, data = response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        status, head, data = error.code, dict(error.headers), error.read()
    try:
        return status, head, json.loads(data)
    except ValueError:
        return status, head, data.decode(errors="replace")


def predictors(tiny_checkpoints):
    from sapiens2 import Predictor

    return {task: Predictor(task, model=tiny_checkpoints[task], device="cpu", detector=None, batch_size=8)
            for task in TASKS}  # fmt: skip


def assert_same(task: str, served, expected) -> None:
    names = {"seg": ("labels",), "normal": ("normals",), "pose": ("boxes", "box_scores", "keypoints", "scores")}
    for name in names[task]:
        got, want = getattr(served, name), getattr(expected, name)
        assert got.dtype == want.dtype and got.shape == want.shape, (task, name)
        assert np.array_equal(got, want, equal_nan=True), f"{task}.{name} differs from Predictor's"
    if task == "pose":
        assert served.keypoint_names == expected.keypoint_names and served.image_size == expected.image_size
    else:
        assert tuple(served.size) == tuple(expected.size)


def test_served_results_equal_predictor_bit_for_bit(service, tiny_checkpoints, tmp_path):
    from sapiens2.serve import Client

    paths = photos(tmp_path, 4)
    local = predictors(tiny_checkpoints)
    client = Client(service, token=TOKEN, timeout=60)
    # one request at a time (batches of one), then all at once from several clients (batches of several requests)
    sequential = [client.predict(list(TASKS), path) for path in paths[:2]]
    with ThreadPoolExecutor(len(paths)) as pool:
        concurrent = list(pool.map(lambda p: client.predict(list(TASKS), p), paths))
    for path, served in zip(paths[:2] + paths, sequential + concurrent, strict=True):
        for task in TASKS:
            assert_same(task, served[task], local[task](path))
    seg = local["seg"](paths[0])
    for fmt in ("npy", "rle"):  # the other lossless encodings of seg give the same labels
        assert np.array_equal(client.predict("seg", paths[0], format=fmt).labels, seg.labels)
    coco17 = client.predict("pose", paths[0], keypoint_format="coco17")
    assert_same("pose", coco17, local["pose"](paths[0]).converted("coco17"))
    metrics = client.metrics()
    lines = [line.split(" ") for line in metrics.splitlines() if line.startswith("sapiens2_batch_size_")]
    batches = {key: float(value) for key, value in lines}
    mean = batches['sapiens2_batch_size_sum{task="seg"}'] / batches['sapiens2_batch_size_count{task="seg"}']
    assert mean > 1.0, "concurrent requests were not batched together"


def test_rle_masks_read_back_with_pycocotools(service, tiny_checkpoints, tmp_path):
    mask_utils = require_module("pycocotools.mask")
    path = photos(tmp_path, 1)[0]
    status, _, answer = call(service, "/v1/seg?format=rle", path.read_bytes())
    assert status == 200
    seg = answer["results"]["seg"]
    height, width = seg["size"]
    labels = predictors(tiny_checkpoints)["seg"](path).labels
    assert sorted(entry["id"] for entry in seg["classes"].values()) == sorted(np.unique(labels).tolist())
    for name, entry in seg["classes"].items():
        rle = mask_utils.frPyObjects({"size": entry["size"], "counts": entry["counts"]}, height, width)
        assert np.array_equal(mask_utils.decode(rle).astype(bool), labels == entry["id"]), name


def test_pictures_and_exr_by_format(service, tmp_path):
    path = photos(tmp_path, 1)[0]
    height, width = cv2.imread(str(path)).shape[:2]
    status, _, answer = call(service, "/v1/normal?format=png", path.read_bytes())
    assert status == 200
    picture = cv2.imdecode(np.frombuffer(base64.b64decode(answer["results"]["normal"]["arrays"]["normals"]["data"]),
                                         np.uint8), cv2.IMREAD_UNCHANGED)  # fmt: skip
    assert picture.shape == (height, width, 3) and picture.dtype == np.uint8
    status, _, answer = call(service, "/v1/normal,seg?format=exr", path.read_bytes())
    if status == 400 and "OpenEXR" in answer["error"]:
        pytest.skip(answer["error"])
    openexr = require_module("OpenEXR")
    assert status == 200
    exr_path = tmp_path / "normal.exr"
    exr_path.write_bytes(base64.b64decode(answer["results"]["normal"]["arrays"]["exr"]["data"]))
    with openexr.File(str(exr_path)) as exr:
        channels = exr.channels()
        assert {"N.X", "N.Y", "N.Z"} <= set(channels) and channels["N.X"].pixels.shape == (height, width)


def test_every_way_of_sending_an_image_gives_the_same_answer(service, tmp_path):
    path = photos(tmp_path, 1)[0]
    data = path.read_bytes()
    raw = call(service, "/v1/seg", data, {"Content-Type": "image/png"})
    boundary = "sapiens2boundary"
    form = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"image\"; filename=\"{path.name}\"\r\n"
            f"Content-Type: image/png\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()  # fmt: skip
    multipart = call(service, "/v1/seg", form, {"Content-Type": f"multipart/form-data; boundary={boundary}"})
    payload = json.dumps({"image": base64.b64encode(data).decode(), "name": path.name}).encode()
    as_json = call(service, "/v1/seg", payload, {"Content-Type": "application/json"})
    labels = [answer[2]["results"]["seg"]["arrays"]["labels"]["data"] for answer in (raw, multipart, as_json)]
    assert [answer[0] for answer in (raw, multipart, as_json)] == [200, 200, 200]
    assert labels[0] == labels[1] == labels[2]
    assert multipart[2]["image"]["name"] == as_json[2]["image"]["name"] == path.name


def test_auth_health_openapi_and_metrics(service):
    assert call(service, "/healthz", token=None)[0] == 200
    status, _, ready = call(service, "/readyz", token=None)
    assert status == 200 and ready["status"] == "ready" and ready["replica"]["device"] == "cpu"
    for token in (None, "wrong"):
        for path, body in (("/v1/seg", b"x"), ("/metrics", None), ("/v1", None)):
            status, headers, answer = call(service, path, body, token=token)
            assert status == 401 and headers.get("www-authenticate", headers.get("WWW-Authenticate")), (path, token)
            assert "bearer token" in answer["error"]
    status, _, schema = call(service, "/openapi.json", token=None)
    assert status == 200 and "/v1/{tasks}" in schema["paths"] and "/readyz" in schema["paths"]
    body = schema["paths"]["/v1/{tasks}"]["post"]["requestBody"]["content"]
    assert {"multipart/form-data", "application/json", "image/*"} <= set(body)
    status, _, text = call(service, "/metrics")
    assert status == 200
    for name in ("sapiens2_requests_total", "sapiens2_request_seconds_bucket", "sapiens2_batch_size_bucket",
                 "sapiens2_queue_depth", "sapiens2_requests_in_flight"):  # fmt: skip
        assert name in text, name
    status, _, about = call(service, "/v1")
    assert status == 200 and about["tasks"] == list(TASKS)


def test_bad_inputs_are_one_line_400s_and_the_service_keeps_serving(service, tmp_path):
    good = photos(tmp_path, 1)[0].read_bytes()
    jpeg = cv2.imencode(".jpg", cv2.imread(str(SAMPLE_IMAGE)))[1].tobytes()
    bomb = zeros_png(32768, 32000, channels=3)  # 3 MB that claims a gigapixel: refused from its header
    cases = [
        ("/v1/seg", b"", {}, 400, "no image"),
        ("/v1/seg", b"this is not an image at all", {}, 400, "not a decodable image"),
        ("/v1/seg", jpeg[: len(jpeg) // 2], {}, 400, "truncated JPEG"),
        ("/v1/seg", good[:-30] + bytes(30), {}, 400, "image"),
        ("/v1/seg", bomb, {}, 413, "over the limit of 40 megapixels"),
        ("/v1/seg", b"{not json", {"Content-Type": "application/json"}, 400, "not valid JSON"),
        ("/v1/seg", b'{"image": "%%%"}', {"Content-Type": "application/json"}, 400, "not valid base64"),
        ("/v1/seg", b'{"url": "http://127.0.0.1:1/x.png"}', {"Content-Type": "application/json"}, 403,
         "not under an allowed prefix"),
        ("/v1/matting", good, {}, 404, "not served here"),
        ("/v1/seg?format=tiff", good, {}, 400, "format='tiff'"),
        ("/v1/normal?format=rle", good, {}, 400, "for seg only"),
        ("/v1/pose?keypoint_format=coco18", good, {}, 400, "keypoint_format"),
        ("/v1/seg,seg", good, {}, 400, "twice"),
    ]  # fmt: skip
    for path, body, headers, status, words in cases:
        got, _, answer = call(service, path, body, headers, method="POST")
        assert got == status and words in answer["error"] and "\n" not in answer["error"], (path, body[:20], answer)
    # a body announced larger than the limit is refused before it is read
    request = urllib.request.Request(
        service + "/v1/seg",
        data=b"x" * 16,
        method="POST",
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Length": "60000000"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 413 and b"50 MB" in refused.value.read()
    status, _, answer = call(service, "/v1/seg,pose", good)
    assert status == 200 and set(answer["results"]) == {"seg", "pose"}
    status, _, text = call(service, "/metrics")
    assert 'sapiens2_requests_total{code="413",task="seg"}' in text and 'code="400",task="seg"' in text


def test_urls_are_fetched_only_under_allowed_prefixes(service, image_site):
    site, photo = image_site

    def fetch(address: str):
        return call(service, "/v1/seg", json.dumps({"url": address}).encode(), {"Content-Type": "application/json"})

    status, _, answer = fetch(f"{site}/ok/{photo.name}")
    assert status == 200 and answer["image"]["name"] == photo.name
    status, _, direct = call(service, "/v1/seg", photo.read_bytes())
    assert answer["results"] == direct["results"]
    port = site.rsplit(":", 1)[1]
    for address in (f"{site}/secret/{photo.name}", f"{site}/ok/../secret/{photo.name}",
                    f"{site}/ok/%2e%2e/secret/{photo.name}", f"http://localhost:{port}/ok/{photo.name}",
                    f"{site}/ok@evil.example/{photo.name}", "file:///etc/passwd"):  # fmt: skip
        status, _, answer = fetch(address)
        assert status == 403 and "not under an allowed prefix" in answer["error"], address
    status, _, answer = fetch(f"{site}/ok/redirect")  # the redirect leads out of /ok/: not followed
    assert status == 400 and "302" in answer["error"]


def test_cli_refuses_bad_flags_with_one_line_and_status_2(tiny_checkpoints, tmp_path, capsys):
    from sapiens2.cli import main

    model = f"--model=seg={tiny_checkpoints['seg']}"
    cases = [
        (["--task", "sag"], "--task sag: unknown task 'sag'"),
        (["--task", "seg", "--model", "matte=x.safetensors"], "--model matte=x.safetensors: unknown task"),
        (["--task", "seg", model, "--allow-url", "ftp://example.com/x"], "--allow-url ftp://example.com/x"),
        (["--task", "seg", model, "--max-batch", "0"], "--max-batch 0: must be >= 1"),
        (["--task", "seg", model, "--port", "70000"], "--port 70000"),
        (["--task", "seg", model, "--devices", "cuda:7"], "--devices cuda:7"),
        (["--task", "seg", "--model", f"seg={tmp_path / 'missing.safetensors'}"], "missing.safetensors"),
    ]
    for flags, words in cases:
        assert main(["serve", *flags]) == 2, flags
        err = capsys.readouterr().err
        assert err.startswith("sapiens2 serve: error: ") and words in err and err.count("\n") == 1, (flags, err)


def test_the_config_file_round_trips_the_options(tiny_checkpoints, tmp_path, capsys):
    yaml = require_module("yaml")
    from sapiens2.cli import main
    from sapiens2.serve import ServeOptions

    path = tmp_path / "serve.yaml"
    flags = ["serve", "--task", "pose,seg", f"--model=seg={tiny_checkpoints['seg']}", "--detector", "none",
             "--max-batch", "16", "--max-wait-ms", "5", "--token", "hidden", "--host", "0.0.0.0", "--port", "9000",
             "--allow-url", "https://images.example.com/public/", "--write-config", str(path)]  # fmt: skip
    assert main(flags) == 0 and "wrote" in capsys.readouterr().out
    config = yaml.safe_load(path.read_text())
    assert config["http_options"] == {"host": "0.0.0.0", "port": 9000} and "hidden" not in path.read_text()
    application = config["applications"][0]
    assert application["import_path"] == "sapiens2.serve.app:build"
    options = ServeOptions.from_dict(application["args"])
    assert options.tasks == ("pose", "seg") and options.max_batch == 16 and options.max_wait_ms == 5.0
    assert options.models == {"seg": str(tiny_checkpoints["seg"])} and options.token is None
    assert options.allow_urls == ("https://images.example.com/public/",)
    with pytest.raises(ValueError, match="unknown option.*max_batchsize"):
        ServeOptions.from_dict({"max_batchsize": 4})
