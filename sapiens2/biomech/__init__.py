"""Biomechanics from video: OpenSim kinematics, gait analysis and ergonomic scores (docs/biomechanics.md)."""
