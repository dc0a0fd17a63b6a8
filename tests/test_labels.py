"""Label sets of one's own (``sapiens2.labels``): the schema and COCO readers, the model file carrying the set, and
training, prediction and evaluation on a 4-keypoint set and a 5-class set over synthetic images whose labels are
known (coloured discs at the keypoints; rectangles for the classes)."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from test_train import TINY

from sapiens2.labels import (
    DEFAULT_SIGMA,
    LabelSet,
    class_set,
    keypoint_set,
    label_set_from_json,
    labels_of,
    read_label_set,
    write_label_set,
)
from sapiens2.metadata import keypoint_metadata, seg_metadata

KEYPOINTS = ["racket_tip", "bar_end", "left_wrist", "right_wrist"]
CLASSES = ["background", "shirt", "trousers", "left_sleeve", "right_sleeve"]
LABELS_YAML = """\
keypoints:
  names: [racket_tip, bar_end, left_wrist, right_wrist]
  skeleton: [[left_wrist, racket_tip], [right_wrist, bar_end]]
  sigmas: {racket_tip: 0.05}
classes:
  names: [background, shirt, trousers, left_sleeve, right_sleeve]
"""
IMAGE_HW = (96, 72)


# ------------------------------------------------------------------------------------------------- synthetic data


def _pose_image(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A grey image with a red disc (racket tip), a green disc (bar end) and two white discs (the wrists): the one
    on the image's right is the left wrist (a person facing the camera), so a mirror with the pair swapped is the
    same labelling. Returns the image and (4, 2) keypoints."""
    height, width = IMAGE_HW
    image = np.full((height, width, 3), 90, np.uint8)
    image += rng.integers(0, 20, image.shape, dtype=np.uint8)
    points = np.array(
        [
            (rng.uniform(0.15, 0.85) * width, rng.uniform(0.1, 0.4) * height),  # racket tip: upper part
            (rng.uniform(0.15, 0.85) * width, rng.uniform(0.6, 0.9) * height),  # bar end: lower part
            (rng.uniform(0.6, 0.85) * width, rng.uniform(0.4, 0.6) * height),  # left wrist: image right
            (rng.uniform(0.15, 0.4) * width, rng.uniform(0.4, 0.6) * height),  # right wrist: image left
        ]
    )
    for (x, y), color in zip(points, [(230, 30, 30), (30, 220, 30), (250, 250, 250), (250, 250, 250)], strict=True):
        cv2.circle(image, (round(x), round(y)), 5, color, -1, lineType=cv2.LINE_AA)
    return image, points


def make_pose_set(root: Path, count: int, seed: int = 0) -> Path:
    """A pose folder of the 4-keypoint set: images/, annotations.json (whole-image boxes), labels.yaml."""
    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True)
    images, annotations = [], []
    for index in range(count):
        image, points = _pose_image(rng)
        name = f"{index:04d}.png"
        cv2.imwrite(str(root / "images" / name), image[..., ::-1])
        images.append({"id": index, "file_name": name, "height": IMAGE_HW[0], "width": IMAGE_HW[1]})
        keypoints = np.concatenate([points, np.full((4, 1), 2.0)], axis=1).reshape(-1).tolist()
        box = [0.0, 0.0, float(IMAGE_HW[1]), float(IMAGE_HW[0])]
        annotations.append({"id": index + 1, "image_id": index, "category_id": 1, "keypoints": keypoints,
                            "bbox": box, "area": box[2] * box[3], "iscrowd": 0})  # fmt: skip
    (root / "annotations.json").write_text(json.dumps({"images": images, "annotations": annotations}))
    (root / "labels.yaml").write_text(LABELS_YAML)
    return root


def _seg_image(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Shirt (blue rectangle), trousers (brown rectangle) and two sleeves of one colour (the image-right one is the
    left sleeve) on a noisy background."""
    height, width = IMAGE_HW
    image = rng.integers(60, 120, (height, width, 3), dtype=np.uint8)
    labels = np.zeros((height, width), np.uint8)
    cx = int(rng.integers(28, 44))
    top = int(rng.integers(8, 20))
    shapes = [
        (1, (cx - 12, top, cx + 12, top + 30), (40, 60, 220)),
        (2, (cx - 10, top + 31, cx + 10, min(height - 2, top + 70)), (140, 90, 40)),
        (3, (cx + 13, top, cx + 22, top + 20), (230, 200, 40)),
        (4, (cx - 22, top, cx - 13, top + 20), (230, 200, 40)),
    ]
    for class_id, (x0, y0, x1, y1), color in shapes:
        image[y0:y1, x0:x1] = color
        labels[y0:y1, x0:x1] = class_id
    return image, labels


def make_seg_set(root: Path, count: int, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir()
    for index in range(count):
        image, labels = _seg_image(rng)
        cv2.imwrite(str(root / "images" / f"{index:04d}.png"), image[..., ::-1])
        cv2.imwrite(str(root / "labels" / f"{index:04d}.png"), labels)
    (root / "labels.yaml").write_text(LABELS_YAML)
    return root


# ------------------------------------------------------------------------------------------------- the label set


def test_a_schema_file_gives_names_pairs_skeleton_sigmas_and_colours(tmp_path):
    path = tmp_path / "labels.yaml"
    path.write_text(LABELS_YAML)
    labels = read_label_set(path)
    points, classes = labels.keypoints, labels.classes
    assert points.names == tuple(KEYPOINTS)
    assert points.flip_pairs == ((2, 3),)  # derived from left_/right_
    assert points.flip_indices.tolist() == [0, 1, 3, 2]
    assert points.skeleton_links.tolist() == [[2, 0], [3, 1]]
    released = keypoint_metadata()
    wrist = released.names.index("left_wrist")
    # a name of the 308 takes its sigma and colour; a new one the documented default and the fixed palette
    assert points.sigmas.tolist() == [0.05, DEFAULT_SIGMA, released.sigmas[wrist], released.sigmas[wrist]]
    assert points.keypoint_colors[2].tolist() == released.keypoint_colors[wrist].tolist()
    assert points.groups == {"all": (0, 1, 2, 3)} and points.coco_wholebody_to_308 == ()
    assert points.upper_body_ids == (2, 3) and points.min_visible_keypoints == 1
    assert classes.class_names == tuple(CLASSES) and classes.hflip_swap_pairs == ((3, 4),)
    assert classes.ce_class_weights == (1.0,) * 5 and classes.palette.shape == (5, 3)
    # the writer and the JSON of a model file give the same set back
    for written in (write_label_set(labels, tmp_path / "again.yaml"), write_label_set(labels, tmp_path / "a.json")):
        assert read_label_set(written).to_dict() == labels.to_dict()
    assert label_set_from_json(labels.to_json()).to_dict() == labels.to_dict()


def test_coco_categories_and_the_released_sets(tmp_path):
    coco = {
        "images": [],
        "annotations": [],
        "categories": [
            {"id": 1, "name": "player", "keypoints": KEYPOINTS, "skeleton": [[3, 1], [4, 2]],
             "flip_pairs": [["left_wrist", "right_wrist"]], "sigmas": [0.04, 0.06, 0.07, 0.07]},
        ],
    }  # fmt: skip
    (tmp_path / "coco.json").write_text(json.dumps(coco))
    labels = read_label_set(tmp_path / "coco.json")
    assert labels.classes is None and labels.keypoints.names == tuple(KEYPOINTS)
    assert labels.keypoints.skeleton_links.tolist() == [[2, 0], [3, 1]]  # 1-based in COCO
    assert labels.keypoints.sigmas.tolist() == [0.04, 0.06, 0.07, 0.07]
    assert keypoint_set(keypoint_metadata().names) is keypoint_metadata()
    assert class_set(seg_metadata().class_names) is seg_metadata()


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("keypoints: {names: [a, a]}", "must be unique; repeated: a"),
        ("keypoints: {names: [a, b], flip_pairs: [[a, c]]}", "unknown name 'c'"),
        ("keypoints: {names: [a, b], sigmas: {a: -1}}", "sigmas must all be positive"),
        ("classes: {names: [x, y], palette: [[0, 0, 0]]}", "one RGB colour per name"),
        ("keypoints: {names: [a], colours: {}}", "unknown field(s) colours"),
        ("points: [a]", "expected a 'keypoints' and/or 'classes' section"),
    ],
)
def test_bad_label_files_are_refused_in_one_line_naming_the_file(tmp_path, text, problem):
    path = tmp_path / "labels.yaml"
    path.write_text(text)
    with pytest.raises(ValueError) as error:
        read_label_set(path)
    assert str(error.value).startswith(str(path)) and problem in str(error.value) and "\n" not in str(error.value)


# ------------------------------------------------------------------------------------------------- training


def _train(task: str, tmp_path: Path, train_root: Path):
    from test_train import tiny_config

    from sapiens2.train.trainer import fit

    # 128x96 input (8x6 tokens), no augmentation, 300 steps: what a tiny CPU model needs to place the discs.
    data = {"batch_size": 8, "input_size": [128, 96], "augment": False}
    config = tiny_config(task, train_root, tmp_path / "run", steps=300, data=data, optimizer={"lr": 2e-3},
                         schedule={"warmup_steps": 10})  # fmt: skip
    return fit(config)


@pytest.mark.slow
def test_a_tiny_pose_model_learns_a_custom_set_and_every_step_keeps_its_names(tmp_path):
    """300 CPU steps reach OKS AP >= 0.5 (recorded: 0.757 without, 0.811 with the flip test); the flip test with the
    set's pairs helps and one with the pairs swapped (racket tip <-> bar end) hurts; the exported file carries the
    names through load_model, the ONNX export and predict."""
    from sapiens2 import load_model
    from sapiens2.eval.pose import evaluate_pose
    from sapiens2.predict.predictor import Predictor

    train = make_pose_set(tmp_path / "train", 64, seed=0)
    val = make_pose_set(tmp_path / "val", 16, seed=1)
    summary = _train("pose", tmp_path, train)
    model = load_model("pose", summary["model"])
    points = labels_of(model).keypoints
    assert points.names == tuple(KEYPOINTS) and points.flip_pairs == ((2, 3),)

    def ap(flip: bool, keypoints=points) -> float:
        model.labels = LabelSet(keypoints=keypoints)
        predictor = Predictor("pose", model, device="cpu", input_size=(128, 96), detector=None, flip_test=flip)
        return evaluate_pose(predictor, val, "val", progress=False, keypoint_set=keypoints).metrics["all/AP"]

    plain, flipped = ap(False), ap(True)
    wrong = keypoint_set(KEYPOINTS, flip_pairs=[["racket_tip", "bar_end"]], skeleton=[])
    swapped = ap(True, wrong)
    print(f"OKS AP: {plain:.3f} plain, {flipped:.3f} flip test, {swapped:.3f} flip test with swapped pairs")
    assert plain >= 0.5 and flipped >= 0.5
    assert flipped > plain  # the flip test with the set's pairs helps
    assert swapped < plain - 0.1  # the negative control: wrong pairs average the wrong channels


@pytest.mark.slow
def test_a_tiny_seg_model_learns_a_custom_class_list(tmp_path):
    """300 CPU steps reach mIoU >= 50 % over the 5 classes (recorded: 85.7 %, aAcc 95.4 %); the report's table
    lists the set's classes."""
    from sapiens2.eval.run import EvalOptions, evaluate

    train = make_seg_set(tmp_path / "train", 64, seed=0)
    val = make_seg_set(tmp_path / "val", 16, seed=1)
    summary = _train("seg", tmp_path, train)
    options = EvalOptions(task="seg", data=str(val), model=str(summary["model"]), device="cpu",
                          input_size=(128, 96), progress=False)  # fmt: skip
    report = evaluate(options)
    print("seg metrics", report.metrics)
    assert [row["class"] for row in report.tables["per_class"]] == CLASSES
    assert report.metrics["mIoU"] >= 50  # percent


def test_mocap_refuses_a_pose_model_of_another_keypoint_set_in_one_line():
    from test_train import HEADS as TINY_HEADS

    from sapiens2.mocap.run import check_pose_model
    from sapiens2.models.task_model import build_model
    from sapiens2.predict.predictor import Predictor

    model = build_model("pose", TINY, input_size=(64, 48), out_channels=4, **TINY_HEADS["pose"])
    model.labels = LabelSet(keypoints=keypoint_set(KEYPOINTS))
    own = Predictor("pose", model, device="cpu", input_size=(64, 48), detector=None)
    with pytest.raises(ValueError, match=r"^mocap needs a pose model of the 308 .*4 keypoints of its own \(racket_tip"):
        check_pose_model(own)
    released = build_model("pose", TINY, input_size=(64, 48), **TINY_HEADS["pose"])
    check_pose_model(Predictor("pose", released, device="cpu", input_size=(64, 48), detector=None))  # no error


# ------------------------------------------------------------------------------------------------- carried through


def _tiny_run(task: str, root: Path, out: Path, **top):
    from test_train import tiny_config

    from sapiens2.train.trainer import fit

    return fit(tiny_config(task, root, out, steps=2, **top))


@pytest.fixture(scope="module")
def pose_run(tmp_path_factory) -> tuple[Path, Path]:
    """(dataset folder, model.safetensors) of a 2-step run of the 4-keypoint set, trained once per module."""
    base = tmp_path_factory.mktemp("pose_run")
    root = make_pose_set(base / "pose", 4)
    return root, Path(_tiny_run("pose", root, base / "run")["model"])


def _predicted_names(source, image: np.ndarray, out: Path) -> tuple[list[str], str]:
    """(names in the written _pose.json, its keypoint_format) of a Predictor on ``source``."""
    from sapiens2.predict.predictor import Predictor
    from sapiens2.predict.writers import WriteOptions, write_result

    predictor = Predictor("pose", source, device="cpu", input_size=(64, 48), detector=None)
    assert predictor.labels.keypoints.names == tuple(KEYPOINTS), source
    result = predictor(image)
    assert result.keypoint_names == tuple(KEYPOINTS)
    written = write_result("pose", result, out / "0000", image, WriteOptions(labels=predictor.labels))
    record = json.loads(next(p for p in written if p.suffix == ".json").read_text())
    return record["keypoint_names"], record["keypoint_format"]


def test_a_run_saves_its_set_and_load_predict_eval_give_the_same_names(pose_run, tmp_path):
    """train (labels.yaml found in the dataset) -> model.safetensors -> load_model -> Predictor -> _pose.json;
    eval scores the set; the seg model's classes reach its results."""
    from sapiens2 import load_model
    from sapiens2.eval.run import EvalOptions, evaluate
    from sapiens2.predict.predictor import Predictor
    from sapiens2.predict.writers import LABELS_FORMAT

    root, model_file = pose_run
    model = load_model("pose", model_file)
    assert model.decode_head.conv_pose.out_channels == 4
    expected = read_label_set(root / "labels.yaml").to_dict()["keypoints"]
    assert labels_of(model).to_dict() == {"keypoints": expected}  # a pose model carries the keypoints
    image = cv2.imread(str(root / "images" / "0000.png"))[..., ::-1].copy()
    assert _predicted_names(model_file, image, tmp_path / "out") == (KEYPOINTS, LABELS_FORMAT)
    # eval reads the set from the file before the model loads: the annotations in its order, its sigmas
    report = evaluate(EvalOptions(task="pose", data=str(root), model=str(model_file), device="cpu",
                                  input_size=(64, 48), progress=False))  # fmt: skip
    stats = ("AP", "AP50", "AP75", "APm", "APl", "AR", "AR50", "AR75", "ARm", "ARl")
    assert set(report.metrics) == {f"all/{stat}" for stat in stats}

    seg_root = make_seg_set(tmp_path / "seg", 4)
    seg = load_model("seg", _tiny_run("seg", seg_root, tmp_path / "seg_run")["model"])
    predictor = Predictor("seg", seg, device="cpu", input_size=(64, 48))
    assert predictor(image).class_names == tuple(CLASSES)


@pytest.mark.slow
def test_an_onnx_export_carries_the_set_to_predict(pose_run, tmp_path):
    from conftest import require_module

    from sapiens2 import load_model
    from sapiens2.predict.writers import LABELS_FORMAT

    require_module("onnxruntime")
    require_module("onnxscript")
    from sapiens2.export.formats import export_onnx

    root, model_file = pose_run
    model = load_model("pose", model_file)
    network = export_onnx(model, tmp_path / "pose.onnx", input_size=(64, 48))
    image = cv2.imread(str(root / "images" / "0000.png"))[..., ::-1].copy()
    assert _predicted_names(network, image, tmp_path / "out") == (KEYPOINTS, LABELS_FORMAT)


def test_shared_names_start_from_the_released_head_and_new_ones_fresh(tmp_path):
    """A 308-keypoint task file initialises a run of the 4-keypoint set (two new names, two of the 308): the
    wrists' rows of the final conv are the file's rows of left_wrist / right_wrist, the others are not."""
    from test_train import HEADS as TINY_HEADS
    from test_train import tiny_config

    from sapiens2.data.io import write_safetensors
    from sapiens2.models.task_model import build_model
    from sapiens2.train.trainer import Trainer

    released = build_model("pose", TINY, input_size=(64, 48), **TINY_HEADS["pose"])
    write_safetensors(tmp_path / "pose308.safetensors", {k: v.contiguous() for k, v in released.state_dict().items()})
    root = make_pose_set(tmp_path / "pose", 4)
    config = tiny_config(
        "pose", root, tmp_path / "run", model={"arch": None, "init_from": str(tmp_path / "pose308.safetensors")}
    )
    trainer = Trainer(config)
    try:
        weight = trainer.model.decode_head.conv_pose.weight.detach()
        bias = trainer.model.decode_head.conv_pose.bias.detach()
    finally:
        trainer.close()
    source_weight, source_bias = released.decode_head.conv_pose.weight.detach(), released.decode_head.conv_pose.bias
    names = keypoint_metadata().names
    for row, name in ((2, "left_wrist"), (3, "right_wrist")):
        assert torch.equal(weight[row], source_weight[names.index(name)])
        assert torch.equal(bias[row], source_bias[names.index(name)].detach())
    for row in (0, 1):  # racket tip and bar end: fresh
        assert not any(torch.equal(weight[row], source_weight[i]) for i in range(308))
    # everything else of the file loaded as it is
    assert torch.equal(trainer.model.backbone.cls_token, released.backbone.cls_token)


def test_custom_oks_ap_equals_pycocotools_with_the_same_sigmas(tmp_path):
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    from sapiens2.eval.pose import pose_metrics, read_pose_labels

    root = make_pose_set(tmp_path / "pose", 12)
    points = read_label_set(root / "labels.yaml").keypoints
    labels = read_pose_labels(root, "val", keypoint_set=points)
    rng = np.random.default_rng(3)
    results = []
    for annotation in labels.gt["annotations"]:
        triplets = np.asarray(annotation["keypoints"]).reshape(-1, 3)
        noisy = triplets[:, :2] + rng.normal(0, rng.uniform(1, 6), (4, 2))
        scores = rng.uniform(0.2, 1.0, 4)
        flat = np.concatenate([noisy, scores[:, None]], axis=1).reshape(-1).tolist()
        results.append({"image_id": annotation["image_id"], "category_id": 1, "keypoints": flat,
                        "score": float(scores.mean())})  # fmt: skip
    ours, _ = pose_metrics(labels.gt, results, points)
    gt = dict(labels.gt, categories=[{"id": 1, "name": "player", "keypoints": KEYPOINTS}])
    coco = COCO()
    coco.dataset = gt
    coco.createIndex()
    evaluation = COCOeval(coco, coco.loadRes(results), "keypoints")
    evaluation.params.kpt_oks_sigmas = points.sigmas
    evaluation.evaluate()
    evaluation.accumulate()
    evaluation.summarize()
    assert ours["all/AP"] == pytest.approx(evaluation.stats[0], abs=1e-12)
    assert ours["all/AR"] == pytest.approx(evaluation.stats[5], abs=1e-12)
    assert 0.1 < ours["all/AP"] < 0.99  # neither trivial nor empty
    # the 308's sigmas for these names would give other figures: the set's sigmas are the ones used
    other = keypoint_set(KEYPOINTS, sigmas=[0.01] * 4)
    assert pose_metrics(labels.gt, results, other)[0]["all/AP"] < ours["all/AP"]


def test_train_refuses_labels_it_cannot_use_in_one_line(tmp_path, capsys):
    from test_train import tiny_config

    from sapiens2 import cli
    from sapiens2.train.trainer import Trainer

    root = make_seg_set(tmp_path / "seg", 2)
    with pytest.raises(ValueError, match="data.labels .* applies to pose and seg, not normal"):
        tiny_config("normal", root, tmp_path / "n", data={"labels": str(root / "labels.yaml")})
    (tmp_path / "points.yaml").write_text("keypoints: {names: [a, b]}")
    config = tiny_config("seg", root, tmp_path / "run", data={"labels": str(tmp_path / "points.yaml")})
    with pytest.raises(ValueError, match="has no 'classes' section, which seg training needs"):
        Trainer(config)
    assert not (tmp_path / "run").exists()  # refused before the run folder is made
    # the CLI flag: one error line, exit status 2
    text = f"task: seg\nsteps: 2\ndevice: cpu\nschedule: {{warmup_steps: 1}}\ndata: {{root: {root}}}\n"
    text += "model: {arch: 0.4b}\n"
    (tmp_path / "seg.yaml").write_text(text)
    assert cli.main(["train", str(tmp_path / "seg.yaml"), "--labels", str(tmp_path / "missing.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing.yaml" in err[0] and "does not exist" in err[0]


def test_video_writes_the_sets_names_and_draws_its_skeleton(pose_run, tmp_path):
    """A frame folder through predict_video with a pose model of the 4-keypoint set: the summary names its
    keypoints, each frame record holds 4 triplets per person, the overlay is drawn."""
    from sapiens2 import load_model
    from sapiens2.predict.predictor import Predictor
    from sapiens2.predict.writers import LABELS_FORMAT
    from sapiens2.video import VideoOptions, predict_video

    root, model_file = pose_run
    predictor = Predictor("pose", load_model("pose", model_file), device="cpu", input_size=(64, 48), detector=None)
    report = predict_video(predictor, root / "images", tmp_path / "out", VideoOptions(), progress=False)
    assert report.error is None and report.frames == 4
    summary = json.loads(next((tmp_path / "out").glob("*_video.json")).read_text())
    assert summary["keypoint_format"] == LABELS_FORMAT and summary["keypoint_names"] == KEYPOINTS
    records = [json.loads(line) for line in next((tmp_path / "out").glob("*_frames.jsonl")).read_text().splitlines()]
    assert records and all(len(person["keypoints"]) == 12 for record in records for person in record["people"])


def test_a_label_set_is_read_straight_from_an_annotation_tools_export():
    """``read_label_set`` takes a CVAT for images XML and a Label Studio JSON export (through
    ``sapiens2.data.annotations``): the skeleton's points in its order, the classes after background, the left/right
    pairs derived from the names."""
    data = Path(__file__).parent / "data" / "annotations"
    cvat = read_label_set(data / "cvat_racket" / "annotations.xml")
    assert cvat.keypoints.names == ("racket_tip", "bar_end", "left_wrist", "right_wrist")
    flipped = [cvat.keypoints.names[i] for pair in cvat.keypoints.flip_pairs for i in pair]
    assert flipped == ["left_wrist", "right_wrist"]
    assert cvat.classes.class_names[0] == "background" and "left_sleeve" in cvat.classes.class_names
    studio = read_label_set(data / "labelstudio_racket.json")
    assert set(studio.keypoints.names) == set(cvat.keypoints.names)


def test_pre_annotations_of_a_custom_model_carry_its_skeleton_and_flip_pairs(pose_run, tmp_path, capsys):
    """``predict --export-labels coco`` with a model of its own set: the file's skeleton and flip pairs are the
    model's (no known format has these names), so the tool draws the links the lab labelled."""
    from sapiens2.cli import main
    from sapiens2.data.annotations import read_annotations

    root, model_file = pose_run
    out = tmp_path / "out"
    code = main(["predict", "--task", "pose", str(root / "images" / "0000.png"), "-o", str(out),
                 "--model", f"pose={model_file}", "--detector", "none", "--input-size", "64", "48",
                 "--export-labels", "coco"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    labels = read_annotations(out / "coco_annotations.json")
    assert labels.keypoint_names == tuple(KEYPOINTS)
    assert set(labels.skeleton) == {("left_wrist", "racket_tip"), ("right_wrist", "bar_end")}
    assert labels.flip_pairs == (("left_wrist", "right_wrist"),)
