"""Notebook widgets over the engine: ``Explorer`` and the pieces it is made of."""

from .completions import Completions
from .explorer import Explorer
from .heatmap import Heatmap
from .picker import FeaturePicker
from .runner import Runner
from .status import StatusLine

__all__ = ["Completions", "Explorer", "FeaturePicker", "Heatmap", "Runner", "StatusLine"]
