"""Foot contacts on the planted synthetic walk (issue #35 item 5): the figures of docs/mocap.md, "Feet".

The planted walk of the tests (``tests/mocap_synth.py``, ``walk_clip(planted=True)``: 48 frames at 24 fps, 640x480,
the feet pinned on a flat floor while they carry the body) is rendered, lifted and solved with and without planting
(``SolveOptions.plant_feet``). Printed: how far a planted foot (ankle, toe, heel marker) strays from its mean over
each true contact (max and mean over contacts; over all of them and over the frames the detector found), how far
its lowest point goes below the estimated ground, the contact frames that agree with the truth and the estimated up
against the truth's.

    python benchmarks/mocap_feet.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

TESTS = Path(__file__).resolve().parents[1] / "tests"


def main() -> None:
    sys.path.insert(0, str(TESTS))
    from mocap_synth import walk_clip
    from test_mocap_feet import slides

    from sapiens2.mocap.lift import lift_frame
    from sapiens2.mocap.solve import SolveOptions, solve_track

    clip = walk_clip(planted=True)
    frames = [clip.frame(t, rgb=False) for t in range(clip.num_frames)]
    lifted = [lift_frame(f.keypoints, f.scores, f.pointmap, f.seg) for f in frames]
    solved = {plant: solve_track(lifted, clip.motion.fps, SolveOptions(plant_feet=plant)) for plant in (False, True)}
    found = solved[True].contacts.contact & clip.contact
    for plant, name in ((False, "before (no planting)"), (True, "after (planted)")):
        track = solved[plant]
        every, where_found = 100 * slides(track.motion, clip.contact), 100 * slides(track.motion, found)
        below = -100 * min(track.contacts.heights.min(), 0.0)
        print(f"{name}: slide over all true contacts max {every.max():.1f} cm, mean {every.mean():.1f} cm; over the "
              f"found ones max {where_found.max():.1f} cm, mean {where_found.mean():.1f} cm; lowest foot point "
              f"{below:.1f} cm below the ground")  # fmt: skip
    contacts = solved[True].contacts
    agree = 100 * (contacts.contact == clip.contact).mean()
    true = 100 * clip.contact[contacts.contact].mean()
    up = np.degrees(np.arccos(np.clip(contacts.up @ [0.0, -1.0, 0.0], -1, 1)))
    print(f"contact frames agreeing with the truth {agree:.0f} %, found ones true {true:.0f} %, up off by {up:.1f} deg")


if __name__ == "__main__":
    main()
