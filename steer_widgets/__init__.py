"""steer_widgets: steer language models with SAE features from live notebook widgets.

The engine (``Engine``, ``SteerRequest``, ``Feature``, ``Vector``) runs in the kernel and knows
nothing of widgets; ``Explorer`` is the widget front end that calls it.
"""

from .analysis.concept_features import ConceptFeatures
from .analysis.evaluation import Evaluation
from .engine import Engine
from .errors import (
    RequestError,
    SourceError,
    SteerWidgetsError,
    VectorError,
    VectorModelMismatch,
    VectorUnsupported,
    VectorWarning,
)
from .runtime.model import DEFAULT_MODEL, load_model
from .sae.store import SAEStore
from .steering.chat import Chat, Turn
from .steering.conditions import Condition, When
from .steering.generation import Sampling, TokenProb
from .steering.requests import METHODS, TYPES, Feature, SteerRequest, Vector
from .steering.results import Completion, Frame, SteerResult
from .steering.vector_files import load_vectors, save_vectors
from .steering.vectors import to_steering_vector
from .version import __version__

try:  # Engine.remote: the remote engine declares itself to Engine (it subclasses it)
    from .remote import engine as _remote  # noqa: F401
except ModuleNotFoundError as err:  # the remote extra (httpx) is not installed
    if err.name != "httpx":
        raise

__all__ = [
    "__version__",
    "DEFAULT_MODEL",
    "METHODS",
    "TYPES",
    "Chat",
    "Completion",
    "Condition",
    "ConceptFeatures",
    "Engine",
    "Evaluation",
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
    "TokenProb",
    "Turn",
    "Vector",
    "VectorError",
    "VectorModelMismatch",
    "VectorUnsupported",
    "VectorWarning",
    "When",
    "load_model",
    "load_vectors",
    "presets",
    "save_vectors",
    "to_steering_vector",
]


def __getattr__(name: str):
    """``sw.Explorer`` and ``sw.presets`` import the widgets (and ipywidgets) on first use
    only, so code that uses just the engine never loads a widget library."""
    if name == "Explorer":
        from .widgets import Explorer

        return Explorer
    if name == "presets":
        from .widgets.presets import presets

        return presets
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
