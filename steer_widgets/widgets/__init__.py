"""Notebook widgets over the engine: ``Explorer`` and the pieces it is made of.

The top layer: runs the model only through the engine's public API, and imports types and
helpers from every layer below (requests, results, explanations, evaluations). Only the
package itself (``sw.Explorer``) and ``export`` import it.
"""

from .completions import Completions
from .explorer import Explorer
from .heatmap import Heatmap
from .picker import FeaturePicker
from .runner import Runner
from .status import StatusLine

__all__ = ["Completions", "Explorer", "FeaturePicker", "Heatmap", "Runner", "StatusLine"]
