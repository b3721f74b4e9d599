"""Errors users see. Each names the field or source at fault, so a widget can show it."""

from __future__ import annotations

import difflib


class SteerWidgetsError(Exception):
    """Base class: anything raised on purpose by steer_widgets."""


class RequestError(SteerWidgetsError, ValueError):
    """A request field is invalid. Raised before any generation starts."""

    def __init__(self, field: str, problem: str) -> None:
        self.field, self.problem = field, problem
        super().__init__(f"{field}: {problem}")

    def under(self, prefix: str) -> RequestError:
        """This error naming its field under ``prefix`` (``requests['b']`` and ``seed`` give
        ``requests['b'].seed``), of its own class and with its own attributes: a batch names
        the request at fault, and a caller that catches a subclass (``RemoteUnsupported``)
        still catches it."""
        keyed = type(self).__new__(type(self))
        keyed.__dict__.update(self.__dict__)
        RequestError.__init__(keyed, f"{prefix}.{self.field}", self.problem)
        return keyed


class ArgumentError(RequestError, TypeError):
    """A call with an argument its function does not take, or without one it needs (say,
    ``ex.set(nope=1)``): ``field`` is the argument. Also a ``TypeError``, as Python's own."""


class Cancelled(SteerWidgetsError):
    """A call that needs whole completions (a concept's examples) was stopped by
    ``cancel_all`` before they ended: it has no answer and keeps nothing, so asking again
    starts afresh. ``what`` names what was being made."""

    def __init__(self, what: str) -> None:
        self.what = what
        super().__init__(f"cancelled while making {what}; nothing was kept: ask again")


class SourceError(SteerWidgetsError, ValueError):
    """An SAE source cannot be loaded or does not fit the model."""

    def __init__(self, source: str, problem: str) -> None:
        self.source, self.problem = source, problem
        super().__init__(f"SAE source {source!r}: {problem}")


class SourceNotFound(SourceError, LookupError):
    """No such SAE: a release or id not in SAE Lens' registry, or a repo or file the hub
    does not have; the message names the nearest known ids."""


class SourceUnsupported(SourceError):
    """An SAE we do not read: a transcoder, or an SAE Lens loader whose SAEs do not read and
    write one hook."""


class SourceModelMismatch(SourceError):
    """An SAE trained on another model than the one loaded."""


class SourceUnavailable(SourceError, ConnectionError):
    """An SAE that needs the network (not in the hub cache, offline) or a licence (gated)."""


class ModelError(SteerWidgetsError, OSError):
    """A model cannot be loaded by the name given; ``model`` is that name."""

    def __init__(self, model: str, problem: str) -> None:
        self.model, self.problem = model, problem
        super().__init__(f"model {model!r}: {problem}")


class ModelNotFound(ModelError, LookupError):
    """Neither the hub nor TransformerLens knows the name (nearest names suggested)."""


class ModelGated(ModelError, PermissionError):
    """The hub repo is gated: accept its licence on the hub and log in (``hf auth login``)."""


class ModelUnavailable(ModelError, ConnectionError):
    """The model is not in the hub cache and the hub cannot be reached (or ``HF_HUB_OFFLINE``)."""


class FileWriteError(SteerWidgetsError, OSError):
    """A file could not be written whole (a full disk, a file-size limit, a read-only folder):
    ``path`` names it, and a file that was already there keeps its bytes (``files.py``)."""

    def __init__(self, path: str, problem: str) -> None:
        self.path, self.problem = str(path), problem
        super().__init__(f"{self.path}: {problem}")


class QuantizationUnsupported(SteerWidgetsError, ValueError):
    """A GGUF tensor we cannot read exactly: a quantization type we do not decode (the
    message lists those we do), or a block whose scale is inf or NaN; ``qtype`` names it."""

    def __init__(self, qtype: str, problem: str) -> None:
        self.qtype, self.problem = qtype, problem
        super().__init__(f"quantization {qtype}: {problem}")


class RemoteError(SteerWidgetsError):
    """A remote model server (``Engine.remote``) failed; ``url`` says which one.

    Raised during a generation, ``outputs`` holds every token already received, per output
    (stop "error" where a row did not finish), so nothing already shown is lost.
    """

    def __init__(self, url: str, problem: str) -> None:
        self.url, self.problem = url, problem
        self.outputs: dict = {}
        super().__init__(f"interp-engine server at {url}: {problem}")


class RemoteUnreachable(RemoteError, ConnectionError):
    """Nothing answers at the URL (not started, wrong port, killed, network down)."""


class RemoteAuthError(RemoteError, PermissionError):
    """The server wants a bearer token and ours is missing or wrong (HTTP 401)."""


class RemoteRefused(RemoteError, ValueError):
    """The server refused the request as invalid (HTTP 422); ``problem`` is its reason."""


class RemoteBusy(RemoteError):
    """The server's queue stayed full (HTTP 503) after every retry we were allowed."""

    def __init__(self, url: str, problem: str, attempts: int, retry_after: float) -> None:
        self.attempts, self.retry_after = attempts, retry_after
        super().__init__(url, problem)


class RemoteStreamBroken(RemoteError):
    """A generation stream ended before its last token (server killed, connection lost, an
    error line); ``outputs`` keeps what arrived."""


class RemoteUnsupported(RequestError):
    """A request field the remote server cannot serve exactly (a hook it has no point for, a
    sampling rule it lacks). Raised before any request is sent."""


class VectorError(SteerWidgetsError, ValueError):
    """A steering vector that cannot be read, written or fitted; ``source`` names the file,
    the object's type or the request field at fault."""

    def __init__(self, source: str, problem: str) -> None:
        self.source, self.problem = str(source), problem
        super().__init__(f"vector source {self.source!r}: {problem}")


class VectorModelMismatch(VectorError):
    """Vectors made for another model: a width or layer the model lacks, a model hint
    (``controlvector.model_hint``) naming another architecture, or a Neuronpedia
    ``modelId`` naming another model. The message gives both."""


class VectorUnsupported(VectorError):
    """What the source or the target format cannot express exactly (a layer type with no
    hook of ours, a hook no block output reaches, a steer method that is not additive): it
    is refused by name, never written or read as something else."""


class VectorWarning(UserWarning):
    """A vector file written without a setting it cannot carry (llama.cpp adds one vector at
    every position): the setting is recorded in the file's metadata and named here."""


def suggest(name: str, choices: list[str], n: int = 3) -> str:
    """``"; did you mean 'a', 'b'?"`` for the nearest names (difflib), or ``""``."""
    near = difflib.get_close_matches(name, choices, n=n, cutoff=0.6)
    if not near:
        lowered = name.lower()
        near = [c for c in choices if lowered in c.lower()][:n]
    return f"; did you mean {', '.join(repr(c) for c in near)}?" if near else ""
