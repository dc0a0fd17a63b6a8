"""Inference: the Predictor (images in, typed results out), pictures and file writers."""

from .predictor import Predictor

__all__ = ["Predictor"]
