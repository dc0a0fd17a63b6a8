"""Inference: the Predictor (images in, typed results out), pictures and file writers, and ``predict_files``
(what ``sapiens2 predict`` runs: tasks over files, folders and globs, writing files per image)."""

from .options import PredictOptions
from .predictor import Predictor
from .run import predict_files

__all__ = ["PredictOptions", "Predictor", "predict_files"]
