"""Makes docs/images/mocap_overlay.png: frame 20 of ``clip_overlay.mp4`` from ``run_mocap`` on the synthetic walk of
``tests/mocap_synth.py`` (its rendered keypoints, pointmap and seg stand in for the networks, through the tests'
``Oracle`` predictors), scaled to 360 pixels high. Run from the repository root: python docs/images/mocap_overlay.py"""

import sys
import tempfile
from pathlib import Path

import av
import cv2

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from test_mocap_run import oracles, synth_clip  # noqa: E402

from sapiens2.mocap.run import MocapOptions, run_mocap  # noqa: E402
from sapiens2.video import VideoOptions  # noqa: E402

with tempfile.TemporaryDirectory() as folder:
    clip, truth = synth_clip(Path(folder) / "clip.mp4", 24)
    options = MocapOptions(video=VideoOptions(smooth="none", save_dense=False), formats=("bvh",))
    run_mocap(oracles(truth), clip, Path(folder) / "out", options, progress=False)
    with av.open(str(Path(folder) / "out" / "clip_overlay.mp4")) as container:
        frame = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)][20]
height, width = frame.shape[:2]
picture = cv2.resize(frame, (round(width * 360 / height), 360), interpolation=cv2.INTER_AREA)
cv2.imwrite(str(Path(__file__).with_suffix(".png")), picture[..., ::-1])
