"""Makes docs/images/chart_*.png: one chart of each kind that ``sapiens2.eval.plots`` draws. The eval charts show
example numbers (seeded, not a model's scores: their titles say so); the joint-angle chart is the one ``sapiens2
mocap`` writes, for the synthetic walk of the tests (``tests/mocap_synth.py``, its true motion).
Run from the repository root: python docs/images/charts.py"""

import sys
from pathlib import Path

import numpy as np

from sapiens2.data.io import save_png
from sapiens2.eval.plots import bar_chart, histogram_chart, pixels
from sapiens2.eval.pose import group_ap_figure
from sapiens2.metadata import seg_metadata
from sapiens2.mocap.tables import write_joint_angles

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tests"))
from mocap_synth import walk_clip  # noqa: E402

rng = np.random.default_rng(0)
names = seg_metadata().class_names
iou = rng.uniform(35, 92, len(names))
title = f"per-class IoU (%), mIoU {iou.mean():.2f} - example numbers"
save_png(HERE / "chart_bars.png", pixels(bar_chart(names, iou, title)))

errors = np.degrees(np.arccos(np.clip(1 - np.abs(rng.normal(0, 0.03, 200_000)), -1, 1)))
counts = np.histogram(errors, bins=180, range=(0, 180))[0]
title = f"angular error, mean {errors.mean():.2f} / median {np.median(errors):.2f} deg - example numbers"
chart = histogram_chart(counts, 1.0, title, x_label="angular error (degrees)", marks=(11.25, 22.5, 30.0), x_max=180.0)
save_png(HERE / "chart_histogram.png", pixels(chart))

groups = ("body17", "foot", "face", "lefthand", "righthand", "hands", "all308")
metrics = {}
for group, ap in zip(groups, (0.78, 0.71, 0.66, 0.52, 0.54, 0.53, 0.61), strict=True):
    metrics |= {f"{group}/AP": ap, f"{group}/AP50": min(ap + 0.17, 0.99), f"{group}/AP75": ap + 0.05}
save_png(HERE / "chart_grouped_bars.png", group_ap_figure(metrics, "OKS AP by keypoint group - example numbers"))

clip = walk_clip(96, 24.0)
csv_path, png_path = write_joint_angles(clip.motion, HERE / "walk_angles.csv")
csv_path.unlink()
png_path.replace(HERE / "chart_joint_angles.png")
