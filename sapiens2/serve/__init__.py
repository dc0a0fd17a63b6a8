"""``sapiens2 serve`` (``docs/serving.md``): an HTTP service on Ray Serve with dynamic batching, and its client.

``options`` (``ServeOptions``, the config file), ``codec`` (results as JSON and back), ``client`` (``Client``: the
result objects of ``Predictor``, standard library only) and ``app`` (the Ray Serve deployments: ``build_app``,
``start``, ``stop``; Ray Serve and FastAPI are imported only there: ``pip install 'sapiens2[serve]'``).
"""

from __future__ import annotations

from typing import Any

from .client import Client, ServeError
from .options import ServeOptions

__all__ = ["Client", "ServeError", "ServeOptions", "build_app", "start", "stop"]


def require_serve() -> Any:
    """The ``app`` module, or one ImportError line naming the extra to install."""
    try:
        from . import app
    except ImportError as error:
        raise ImportError(f"sapiens2 serve needs Ray Serve and FastAPI ({error.name} is missing): "
                          "pip install 'sapiens2[serve]'") from None  # fmt: skip
    return app


def __getattr__(name: str) -> Any:
    if name in ("build_app", "start", "stop"):
        return getattr(require_serve(), name)
    raise AttributeError(f"module 'sapiens2.serve' has no attribute {name!r}")
