"""Training datasets: layouts, targets that feed the losses, determinism, options and clear errors on bad files."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest
import torch
from conftest import DATA
from torch.utils.data import DataLoader, default_collate

from sapiens2.data.io import read_image, save_json, save_npy, save_png
from sapiens2.metadata import keypoint_metadata
from sapiens2.pose.codec import decode_heatmaps
from sapiens2.train.augment import hflip
from sapiens2.train.datasets import build_dataset, fit_intrinsics, label_map_table
from sapiens2.train.demo_data import make_demo_dataset
from sapiens2.train.losses import build_loss

TASKS = ("seg", "normal", "pointmap", "albedo", "pose")
SIZE = (64, 48)
EXPECTED = {
    "seg": {"labels": ((64, 48), torch.int64)},
    "normal": {"gt_normal": ((3, 64, 48), torch.float32), "mask": ((1, 64, 48), torch.float32)},
    "pointmap": {
        "gt_pointmap": ((3, 64, 48), torch.float32),
        "mask": ((1, 64, 48), torch.float32),
        "gt_mean_depth": ((1,), torch.float32),
        "scale": ((1,), torch.float32),
        "original_K": ((3, 3), torch.float32),
    },
    "albedo": {"gt_albedo": ((3, 64, 48), torch.float32), "mask": ((1, 64, 48), torch.float32)},
    "pose": {"heatmaps": ((308, 16, 12), torch.float32), "keypoint_weights": ((308,), torch.float32)},
}
# Un-augmented (validation) pose items also carry what maps the crop back to the image.
POSE_VALIDATION = {"center": ((2,), torch.float32), "scale": ((2,), torch.float32), "annotation": ((), torch.int64)}


@pytest.fixture(scope="module")
def demo_roots(tmp_path_factory):
    base = tmp_path_factory.mktemp("demo")
    return {task: make_demo_dataset(task, base / task, num_images=4) for task in TASKS}


def _assert_same(first: dict, second: dict) -> None:
    assert first.keys() == second.keys()
    for key in first:
        torch.testing.assert_close(first[key], second[key], rtol=0, atol=0, msg=key)


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("augment", [True, False])
def test_samples_have_the_interface_shapes_and_collate(demo_roots, task, augment):
    dataset = build_dataset(task, demo_roots[task], input_size=SIZE, augment=augment, seed=3)
    assert len(dataset) == 4
    batch = next(iter(DataLoader(dataset, batch_size=4)))
    assert batch["image"].shape == (4, 3, *SIZE) and batch["image"].dtype == torch.float32
    assert batch["index"].tolist() == [0, 1, 2, 3] and batch["index"].dtype == torch.int64
    expected = EXPECTED[task] | (POSE_VALIDATION if task == "pose" and not augment else {})
    assert set(batch) == {"image", "index", *expected}
    for key, (shape, dtype) in expected.items():
        assert batch[key].shape == (4, *shape) and batch[key].dtype == dtype, key
        assert torch.isfinite(batch[key]).all(), key
    assert -3 < batch["image"].mean() < 3  # normalised, not 0-255


@pytest.mark.parametrize("task", TASKS)
def test_targets_feed_the_task_losses_directly(demo_roots, task):
    batch = default_collate([s for s in build_dataset(task, demo_roots[task], input_size=SIZE)])
    generator = torch.Generator().manual_seed(0)
    loss = build_loss(task)
    if task == "seg":
        terms = loss(torch.randn(4, 29, *SIZE, generator=generator), batch["labels"])
    elif task == "pose":
        pred = torch.rand(batch["heatmaps"].shape, generator=generator)
        terms = loss(pred, batch["heatmaps"], batch["keypoint_weights"])
    elif task == "pointmap":
        pred = batch["gt_pointmap"] + 0.01 * torch.randn(batch["gt_pointmap"].shape, generator=generator)
        keys = ("gt_pointmap", "mask", "gt_mean_depth", "scale", "original_K")
        terms = loss(pred, batch["scale"] * 1.1, *(batch[k] for k in keys))
        # The generated target agrees with its own intrinsics: the K-consistency term of a perfect prediction is 0.
        perfect = loss(batch["gt_pointmap"], batch["scale"], *(batch[k] for k in keys))
        assert perfect["loss_K_consistency"] < 1e-4 and perfect["loss_scale_l1"] == 0
    else:
        target = batch["gt_normal" if task == "normal" else "gt_albedo"]
        terms = loss(torch.randn(target.shape, generator=generator), target, batch["mask"])
        perfect = loss(target * batch["mask"] + (1 - batch["mask"]) * 0.5, target, batch["mask"])
        assert perfect["loss"] < 1e-5
    assert torch.isfinite(terms["loss"]) and terms["loss"] > 0


@pytest.mark.parametrize("task", TASKS)
def test_samples_are_a_function_of_seed_epoch_and_index(demo_roots, task):
    first = build_dataset(task, demo_roots[task], input_size=SIZE, seed=7)
    second = build_dataset(task, demo_roots[task], input_size=SIZE, seed=7)
    _assert_same(first[2], second[2])
    second[1]  # reading other samples in between changes nothing
    _assert_same(first[2], second[2])
    first.set_epoch(1)
    second.set_epoch(1)
    _assert_same(first[3], second[3])
    epochs = []
    for epoch in range(4):
        first.set_epoch(epoch)
        epochs.append(first[0]["image"])
    assert any(not torch.equal(epochs[0], other) for other in epochs[1:])
    reseeded = build_dataset(task, demo_roots[task], input_size=SIZE, seed=8)
    reseeded.set_epoch(3)
    assert not torch.equal(reseeded[0]["image"], epochs[3])


def test_samples_match_across_dataloader_workers(demo_roots):
    dataset = build_dataset("normal", demo_roots["normal"], input_size=SIZE, seed=1)
    dataset.set_epoch(2)
    serial = default_collate([dataset[i] for i in range(4)])
    parallel = next(iter(DataLoader(dataset, batch_size=4, num_workers=2)))
    _assert_same(serial, parallel)


def test_seg_labels_follow_their_image_through_augmentation(demo_roots):
    dataset = build_dataset("seg", demo_roots["seg"], input_size=(128, 96), seed=0)
    # The demo labels hair (4) where the photo is dark: after any geometric augmentation, hair pixels must still be
    # darker on average than clothing (23) pixels of the same augmented image.
    for epoch in range(6):
        dataset.set_epoch(epoch)
        sample = dataset.transform(dataset.load(0), dataset.generator(0))
        grey = sample["image"].mean(axis=2)
        hair, clothing = sample["labels"] == 4, sample["labels"] == 23
        if hair.sum() > 20 and clothing.sum() > 20:
            assert grey[hair].mean() < grey[clothing].mean()


def test_seg_label_map_remaps_named_and_dict_tables(tmp_path):
    table = label_map_table("dome34_to_29")
    assert table[2] == 0  # Chair -> Background (DENSE.md §2.1)
    assert table[200] == 255
    root = make_demo_dataset("seg", tmp_path / "seg", num_images=1)
    plain = build_dataset("seg", root, input_size=SIZE, augment=False)[0]["labels"]
    shifted = build_dataset("seg", root, input_size=SIZE, augment=False, label_map={i: (i + 1) % 29 for i in range(29)})
    remapped = shifted[0]["labels"]
    torch.testing.assert_close(remapped[plain != 255], (plain[plain != 255] + 1) % 29)
    with pytest.raises(ValueError, match="unknown label_map"):
        label_map_table("dome99")


def test_seg_background_replacement_option_reads_a_folder_of_jpgs(tmp_path):
    root = make_demo_dataset("seg", tmp_path / "seg", num_images=2)
    backgrounds = tmp_path / "bg"
    backgrounds.mkdir()
    assert cv2.imwrite(str(backgrounds / "green.jpg"), np.full((40, 90, 3), (0, 200, 0), np.uint8))
    dataset = build_dataset("seg", root, input_size=SIZE, background_dir=backgrounds)
    assert dataset[0]["labels"].shape == SIZE and dataset[1]["image"].shape == (3, *SIZE)
    with pytest.raises(FileNotFoundError, match="no .jpg"):
        build_dataset("seg", root, background_dir=tmp_path / "seg" / "labels")


def test_seg_rejects_out_of_range_ids_naming_the_file(tmp_path):
    root = make_demo_dataset("seg", tmp_path / "seg", num_images=1)
    save_png(root / "labels" / "demo_000.png", np.full((512, 512), 40, np.uint8))
    with pytest.raises(ValueError, match=r"demo_000\.png.*label_map"):
        build_dataset("seg", root, input_size=SIZE)[0]


def test_missing_and_corrupt_files_raise_errors_naming_them(tmp_path):
    root = make_demo_dataset("normal", tmp_path / "normal", num_images=2)
    (root / "normals" / "demo_000.npy").unlink()
    with pytest.raises(FileNotFoundError, match=r"demo_000"):
        build_dataset("normal", root, input_size=SIZE)[0]
    (root / "images" / "demo_001.png").write_bytes(b"\x89PNG\r\n\x1a\nbroken")
    with pytest.raises(ValueError, match=r"demo_001\.png"):
        build_dataset("normal", root, input_size=SIZE)[1]
    with pytest.raises(FileNotFoundError, match="not a folder"):
        build_dataset("normal", tmp_path / "nowhere")
    with pytest.raises(ValueError, match="unknown task"):
        build_dataset("depth", root)


def test_split_file_selects_names_and_reports_unknown_ones(tmp_path):
    root = make_demo_dataset("albedo", tmp_path / "albedo", num_images=4)
    (root / "val.txt").write_text("demo_002.png\ndemo_000\n")
    assert build_dataset("albedo", root, split="val").names == ["demo_002", "demo_000"]
    assert len(build_dataset("albedo", root, split="train")) == 4
    (root / "val.txt").write_text("demo_009\n")
    with pytest.raises(FileNotFoundError, match="demo_009"):
        build_dataset("albedo", root, split="val")


def test_normal_png_encoding_matches_npy(tmp_path):
    root = make_demo_dataset("normal", tmp_path / "normal", num_images=2)
    normals = np.load(root / "normals" / "demo_000.npy")
    save_png(root / "normals" / "demo_000.png", np.round((normals + 1) * 32767.5).astype(np.uint16))
    dataset = build_dataset("normal", root, input_size=SIZE, augment=False)
    from_npy = dataset.load(0)
    (root / "normals" / "demo_000.npy").unlink()
    from_png = dataset.load(0)
    np.testing.assert_array_equal(from_png["mask"], from_npy["mask"])
    np.testing.assert_allclose(from_png["normal"], from_npy["normal"], atol=2e-5)


def test_pointmap_file_and_depth_plus_intrinsics_give_the_same_targets(tmp_path):
    root = make_demo_dataset("pointmap", tmp_path / "pointmap", num_images=1)  # demo_000: depth + intrinsics
    dataset = build_dataset("pointmap", root, input_size=SIZE, seed=4)
    from_depth = [dataset[0] for _ in range(1)][0]
    truth = dataset.load(0)
    points = np.load(root / "depth" / "demo_000.npy")[..., None] * np.ones(3, np.float32)
    rows, cols = np.indices(points.shape[:2])
    k = truth["K"]
    points[..., 0] *= (cols - k[0, 2]) / k[0, 0]
    points[..., 1] *= (rows - k[1, 2]) / k[1, 1]
    np.testing.assert_allclose(fit_intrinsics(points, truth["mask"]), k, rtol=1e-5, atol=1e-3)
    save_npy(root / "pointmaps" / "demo_000.npy", points)
    (root / "depth" / "demo_000.npy").unlink()
    (root / "intrinsics" / "demo_000.json").unlink()
    from_points = dataset[0]
    for key in ("gt_pointmap", "mask", "gt_mean_depth", "scale", "original_K"):
        torch.testing.assert_close(from_points[key], from_depth[key], rtol=1e-4, atol=1e-4, msg=key)
    with pytest.raises(ValueError, match="pinhole"):
        fit_intrinsics(np.random.default_rng(0).uniform(1, 2, (8, 8, 3)), np.ones((8, 8), bool))


def test_pointmap_target_is_canonical_and_masked(demo_roots):
    dataset = build_dataset("pointmap", demo_roots["pointmap"], input_size=SIZE, augment=False)
    sample = dataset[0]
    k, mask = sample["original_K"], sample["mask"][0] > 0
    torch.testing.assert_close(sample["scale"], 768.0 / k[0, 0].reshape(1))
    z = sample["gt_pointmap"][2]
    torch.testing.assert_close(sample["gt_mean_depth"], z[mask].mean().reshape(1))
    assert (sample["gt_pointmap"][:, ~mask] == 0).all() and (z[mask] > 0).all()


def test_albedo_is_rgb_in_unit_range_and_uniform_albedo_is_rejected(tmp_path):
    root = make_demo_dataset("albedo", tmp_path / "albedo", num_images=1)
    sample = build_dataset("albedo", root, input_size=SIZE, augment=False)[0]
    valid = sample["mask"][0] > 0
    assert sample["gt_albedo"].min() >= 0 and sample["gt_albedo"].max() <= 1 and valid.any()
    save_png(root / "albedo" / "demo_000.png", np.full((512, 512, 3), 120, np.uint8))
    with pytest.raises(RuntimeError, match="drop rule"):
        build_dataset("albedo", root, input_size=SIZE)[0]


def test_pose_heatmaps_decode_to_the_transformed_keypoints(demo_roots):
    size = (512, 384)
    dataset = build_dataset("pose", demo_roots["pose"], input_size=size, seed=2)
    checked = 0
    for epoch in range(3):
        dataset.set_epoch(epoch)
        for index in range(len(dataset)):
            sample = dataset.transform(dataset.load(index), dataset.generator(index))
            decoded, _ = decode_heatmaps(sample["heatmaps"], input_size=size)
            heatmap_xy = sample["keypoints"] * np.array([95 / 383, 127 / 511])
            # Keypoints whose whole 37-pixel Gaussian window lies on the map decode exactly (UDP scale 384/383).
            inside = (sample["keypoint_weights"] > 0) & np.all((heatmap_xy >= 19) & (heatmap_xy < [77, 109]), axis=1)
            expected = sample["keypoints"] * np.array([384 / 383, 512 / 511])
            np.testing.assert_allclose(decoded[inside], expected[inside], atol=0.05)
            checked += int(inside.sum())
            assert np.all(sample["keypoint_weights"][sample["visible"] == 0] == 0)
    assert checked > 20


def test_pose_validation_items_map_the_crop_back_to_the_image(demo_roots):
    from sapiens2.pose.topdown import box_to_center_scale, heatmaps_to_image_keypoints

    size = (256, 192)
    dataset = build_dataset("pose", demo_roots["pose"], input_size=size, augment=False)
    annotations = json.loads((demo_roots["pose"] / "annotations.json").read_text())["annotations"]
    for index in range(len(dataset)):
        item = dataset[index]
        record = annotations[int(item["annotation"])]
        x, y, w, h = record["bbox"]
        center, scale = box_to_center_scale(np.array([x, y, x + w, y + h]), aspect=size[1] / size[0])
        np.testing.assert_allclose(item["center"].numpy(), center, rtol=1e-6)
        np.testing.assert_allclose(item["scale"].numpy(), scale, rtol=1e-6)
        # The target heatmaps decode, through centre and scale, to the annotated keypoints in the image.
        keypoints, _ = heatmaps_to_image_keypoints(
            item["heatmaps"][None].numpy(), item["center"][None].numpy(), item["scale"][None].numpy(), input_size=size
        )
        truth = np.asarray(record["keypoints"]).reshape(-1, 3)
        labelled = truth[:, 2] > 0
        np.testing.assert_allclose(keypoints[0, labelled], truth[labelled, :2], atol=0.5)
    labels = dataset.labels()
    assert sorted(n for numbers in labels.people_annotations.values() for n in numbers) == list(range(len(dataset)))


def test_pose_keypoints_follow_the_image_content_through_the_pipeline(demo_roots):
    dataset = build_dataset("pose", demo_roots["pose"], input_size=(256, 192), seed=5)
    checked = 0
    for epoch in range(6):
        dataset.set_epoch(epoch)
        sample = dataset.load(0)
        # Replace the photo by white dots on the labelled keypoints; the augmentation draws do not depend on pixels,
        # so a plain white photo under the same generator shows where the coarse-dropout hole went.
        dots = np.zeros_like(sample["image"])
        for x, y in sample["keypoints"][sample["visible"] > 0]:
            cv2.circle(dots, (int(round(x)), int(round(y))), 6, (255, 255, 255), -1)
        out = dataset.transform(dict(sample, image=dots), dataset.generator(0))
        white = dataset.transform(dict(sample, image=np.full_like(dots, 255)), dataset.generator(0))["image"]
        for x, y in np.round(out["keypoints"][out["visible"] > 0]).astype(int):
            if white[y, x].max() > 0:  # not under the hole
                assert out["image"][max(0, y - 1) : y + 2, max(0, x - 1) : x + 2].max() > 60, (epoch, x, y)
                checked += 1
    assert checked > 40


def test_pose_coco17_annotations_map_into_308_with_zero_weight_elsewhere(tmp_path):
    root = tmp_path / "coco"
    photo = read_image(DATA / "astronaut.png")
    save_png(root / "images" / "astro.png", photo)
    keypoints = np.zeros((17, 3))
    keypoints[:, 0] = np.linspace(150, 350, 17)
    keypoints[:, 1] = np.linspace(80, 480, 17)
    keypoints[:, 2] = 2
    keypoints[3, 2] = 0  # an unlabelled joint
    annotation = {"image_id": 1, "keypoints": keypoints.reshape(-1).tolist(), "bbox": [120, 60, 260, 440]}
    save_json(root / "annotations.json", {"images": [{"id": 1, "file_name": "astro.png"}], "annotations": [annotation]})
    dataset = build_dataset("pose", root, input_size=(128, 96), augment=False, keypoint_format="coco17")
    weights = dataset[0]["keypoint_weights"]
    body = list(keypoint_metadata().groups["body"])
    expected = torch.zeros(308)
    expected[body] = 1.0
    expected[body[3]] = 0.0
    torch.testing.assert_close(weights, expected)
    save_json(root / "annotations.json", {"images": [{"id": 1, "file_name": "astro.png"}], "annotations": [annotation]})
    with pytest.raises(ValueError, match="51 keypoint numbers, expected 924"):
        build_dataset("pose", root)
    with pytest.raises(ValueError, match="keypoint_format"):
        build_dataset("pose", root, keypoint_format="openpose25")
    (root / "annotations.json").write_text(json.dumps({"images": []}))
    with pytest.raises(ValueError, match="COCO-style"):
        build_dataset("pose", root)


def test_flipped_dataset_samples_flip_back_to_the_original(demo_roots):
    for task in ("seg", "normal", "pointmap", "albedo"):
        dataset = build_dataset(task, demo_roots[task], input_size=SIZE, augment=False)
        sample = dataset.load(1)
        twice = hflip(hflip(sample))
        for key in sample:
            np.testing.assert_array_equal(twice[key], sample[key], err_msg=f"{task} {key}")


def test_demo_dataset_rejects_unknown_tasks_and_counts(tmp_path):
    with pytest.raises(ValueError, match="unknown task"):
        make_demo_dataset("matting", tmp_path)
    with pytest.raises(ValueError, match="num_images"):
        make_demo_dataset("seg", tmp_path, num_images=0)
