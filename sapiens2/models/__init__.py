"""Networks: the architecture table, generic layers, the backbone, heads and task models."""

from .backbone import Sapiens2
from .zoo import ARCHS, Arch, get_arch

__all__ = ["ARCHS", "Arch", "Sapiens2", "get_arch"]
