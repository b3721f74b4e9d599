"""steer_widgets: steer language models with SAE features from live notebook widgets.

The engine (``Engine``, ``SteerRequest``, ``Feature``, ``Vector``) runs in the kernel and knows
nothing of widgets; ``Explorer`` is the widget front end that calls it.
"""

from .engine import Engine
from .errors import RequestError, SourceError, SteerWidgetsError
from .generation import Sampling
from .model import DEFAULT_MODEL, load_model
from .results import Completion, Frame, SteerResult
from .sae_store import SAEStore
from .steering import METHODS, TYPES, Feature, SteerRequest, Vector

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_MODEL",
    "METHODS",
    "TYPES",
    "Completion",
    "Engine",
    "Explorer",
    "Feature",
    "Frame",
    "RequestError",
    "SAEStore",
    "Sampling",
    "SourceError",
    "SteerRequest",
    "SteerResult",
    "SteerWidgetsError",
    "Vector",
    "load_model",
]

from .widgets import Explorer  # noqa: E402 - the widgets build on the engine above
