"""VFX work above the Predictor (``docs/vfx.md``): relighting a plate from predicted normals and albedo
(``sapiens2 relight``). The EXR writer itself is ``predict.exr``; the temporal dense filter is ``video.temporal``."""
