"""Motion capture (``sapiens2 mocap``, ``docs/mocap.md``): pose + pointmap (+ seg) through the video pipeline, lifted to
metric 3D joints, solved on a kinematic skeleton and exported (BVH, glTF, C3D, CSV/Parquet, joint angles)."""
