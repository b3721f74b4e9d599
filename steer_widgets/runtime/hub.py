"""What a failed Hugging Face hub call means for the user: no such repo, a gated one, or no
network (and the file not in the hub cache).

``huggingface_hub`` raises a different class for each, and libraries that wrap it
(transformers, SAE Lens, TransformerLens) re-raise them as bare ``OSError``/``ValueError``
with the original chained, so we walk the chain rather than trust the outer type.
"""

from __future__ import annotations

import os

MISSING, GATED, OFFLINE = "missing", "gated", "offline"
NETWORK_ERRORS = ("ConnectError", "ConnectTimeout")  # httpx's, not ConnectionError subclasses


def cause(err: BaseException) -> str | None:
    """``MISSING``, ``GATED``, ``OFFLINE`` or ``None`` (some other failure) for a hub error."""
    from huggingface_hub import errors

    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, errors.GatedRepoError):
            return GATED
        if isinstance(err, (errors.LocalEntryNotFoundError, errors.OfflineModeIsEnabled)):
            return OFFLINE
        if isinstance(err, (errors.RepositoryNotFoundError, errors.RevisionNotFoundError)):
            return MISSING
        if isinstance(err, (errors.EntryNotFoundError, errors.HFValidationError)):
            return MISSING
        if isinstance(err, ConnectionError) or type(err).__name__ in (
            "ConnectError",
            "ConnectTimeout",
        ):
            return OFFLINE
        err = err.__cause__ or err.__context__
    return None


def offline_note() -> str:
    """Where the cache is and whether offline mode is on, for messages."""
    from huggingface_hub import constants

    mode = " HF_HUB_OFFLINE is set." if constants.HF_HUB_OFFLINE else ""
    return (
        f"it is not in the hub cache ({constants.HF_HUB_CACHE}) and the hub cannot be "
        f"reached.{mode}"
    )


def gated_note(repo_id: str) -> str:
    token = "a token is set" if os.environ.get("HF_TOKEN") else "no HF_TOKEN is set"
    return (
        f"the hub repo {repo_id!r} is gated: accept its licence at https://huggingface.co/"
        f"{repo_id} and log in (`hf auth login` or HF_TOKEN; {token})"
    )
