"""``sapiens2 demo``: every task in a local web page (Gradio, the ``[demo]`` extra).

``build_app(options)`` returns the page as a ``gradio.Blocks`` that a Hugging Face Space or a notebook hosts with
two lines; ``launch(options)`` serves it as the command does. Gradio is imported only when an app is built.

>>> from sapiens2.demo import DemoOptions, build_app
>>> build_app(DemoOptions(models={"seg": "my_seg.safetensors"})).launch()
"""

from .app import build_app, launch
from .options import SAMPLE_IMAGES, DemoOptions

__all__ = ["SAMPLE_IMAGES", "DemoOptions", "build_app", "launch"]
