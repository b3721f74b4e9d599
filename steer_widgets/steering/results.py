"""What a steering request returns: completions, streaming frames, reproducible records."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from ..errors import RequestError
from ..version import __version__
from .generation import TokenProb
from .requests import SteerRequest, output_multipliers

COMPLETE_STOPS = ("eos", "length")


def final_stop(
    ids: Sequence[int], wanted: int, stop_ids: Collection[int], finished: bool = False
) -> str:
    """How a decoded row ended, the one rule every decode, stream and cache uses.

    ``"eos"`` if its last token is a stop token, ``"length"`` if it has all ``wanted``
    tokens, else ``"cancelled"``: cut off before either, so never complete and never cached
    as a DEFAULT. It reads the tokens, not a cancel flag: a cancel that lands after a row's
    last step leaves that row complete, and one that cut a row short is never "length".
    ``finished``: the row's producer says it ended (a server's ``done`` line), so a short
    row is "eos" even on a stop token ``stop_ids`` lacks (the server's own), not cut off.
    """
    if ids and ids[-1] in stop_ids:
        return "eos"
    if len(ids) >= wanted:
        return "length"
    return "eos" if finished else "cancelled"


def cut_short(outputs: Mapping[str, Completion]) -> bool:
    """Whether any output of a run was cut off (``final_stop`` said "cancelled"): the one
    test of "this run is incomplete" for the engine, the explorer and its panels. A cancel
    that lands after every row's last step leaves the run complete."""
    return any(c.stop == "cancelled" for c in outputs.values())


@dataclass(frozen=True)
class Completion:
    """One completion: ``stop`` is "eos", "length" or "cancelled" (or "" while streaming).

    ``token_probs`` has one ``TokenProb`` per token id (its log-probability and the top
    alternatives under the model's distribution before temperature and frequency penalty),
    or is ``None`` where the backend cannot supply them (remote engines). Two completions
    are equal when their text, tokens and stop are: the probabilities are not compared.

    ``gates``: for conditional steering (``sw.When``), each gated entry (``features[0]``,
    ``vectors[1]``) and whether it steered at each position the model ran, prompt first
    (``gates[entry][len(prompt_ids) + k]`` is generated token ``k``'s own position; the
    last generated token is never run, so it has none). Not compared either: two
    completions with the same tokens are equal however they were steered, so a condition
    that never held leaves a completion equal to DEFAULT's.
    """

    text: str
    token_ids: tuple[int, ...]
    stop: str = ""
    token_probs: tuple[TokenProb, ...] | None = field(default=None, compare=False, repr=False)
    gates: Mapping[str, tuple[bool, ...]] | None = field(default=None, compare=False, repr=False)

    @property
    def complete(self) -> bool:
        """Whether the completion ended as the request asked (``final_stop``): only a
        complete DEFAULT is cached and served again."""
        return self.stop in COMPLETE_STOPS

    def gated_tokens(self) -> tuple[bool, ...] | None:
        """Per generated token, whether it was written under a conditional steering: some
        gate on at the position that predicted it (the one before it; the last prompt
        position for the first token). ``None`` for an output without conditions."""
        if self.gates is None:
            return None
        n = len(self.token_ids)
        out = [False] * n
        for log in self.gates.values():
            first = len(log) - n  # the position that predicted token 0 (the log lags one)
            for k in range(n):
                out[k] = out[k] or (0 <= first + k < len(log) and bool(log[first + k]))
        return tuple(out)

    @property
    def logprobs(self) -> tuple[float, ...] | None:
        """Each token's log-probability (``None``: not available from this backend)."""
        return None if self.token_probs is None else tuple(p.logprob for p in self.token_probs)


@dataclass(frozen=True)
class Frame:
    """A streaming frame: every requested output's text and token ids so far."""

    outputs: dict[str, Completion]
    step: int
    done: bool = False


@dataclass
class SteerResult:
    request: SteerRequest
    outputs: dict[str, Completion]
    prompt_ids: tuple[int, ...]
    model: str
    stats: dict = field(default_factory=dict)
    served_by: dict = field(default_factory=dict)  # remote engines: server and guarantee
    products: str = "float32"  # how the model multiplied (runtime.quant.PRODUCTS)

    @property
    def cancelled(self) -> bool:
        return cut_short(self.outputs)

    def to_dict(self) -> dict:
        """A JSON-able record of settings and outputs; ``Engine.steer(record)`` replays it."""
        import torch

        record = {
            "request": self.request.to_dict(),
            "outputs": {k: _output_record(c) for k, c in self.outputs.items()},
            "prompt_ids": list(self.prompt_ids),
            "model": self.model,
            "versions": {"steer_widgets": __version__, "torch": torch.__version__},
            "threads": torch.get_num_threads(),
            "products": self.products,
        }
        if self.served_by:
            record["served_by"] = dict(self.served_by)
        return record

    def to_frame(self):
        """One row per output (DEFAULT, STEERED, sweep rows) as a pandas DataFrame."""
        import pandas as pd

        multipliers = output_multipliers(self.request)
        rows = []
        for label, c in self.outputs.items():
            rows.append(
                {
                    "type": label,
                    "strength_multiplier": multipliers.get(label),
                    "text": c.text,
                    "n_tokens": len(c.token_ids),
                    "stop": c.stop,
                }
            )
        return pd.DataFrame(rows)


def _output_record(c: Completion) -> dict:
    out = {"text": c.text, "token_ids": list(c.token_ids), "stop": c.stop}
    if c.gates is not None:
        out["gates"] = {name: [int(on) for on in values] for name, values in c.gates.items()}
    return out


def as_request(request: SteerRequest | Mapping, products: str | None = None) -> SteerRequest:
    """A request, or one read back from a record (``SteerResult.to_dict()``) or its dict.
    ``products``: the replaying engine's; a record made with the other setting is refused
    by name (its tokens would not replay)."""
    if isinstance(request, SteerRequest):
        return request
    if isinstance(request, Mapping):
        if "request" in request:
            check_products(request.get("products", "float32"), products)
        return SteerRequest.from_dict(request.get("request", request))
    raise RequestError("request", f"must be a SteerRequest or a record dict, got {type(request)}")


def check_products(recorded, products: str | None) -> None:
    """A record replays only on a model that multiplies as it did (``products``); records
    from before the setting existed were made with "float32". ``products`` None: no check."""
    if products is not None and recorded != products:
        raise RequestError(
            "products",
            f"the record was made with products={recorded!r} and this engine's model "
            f"multiplies with {products!r}: load_model(..., products={recorded!r}) replays it",
        )


def ordered(outputs: Mapping[str, Completion], labels: list[str]) -> dict[str, Completion]:
    """``outputs`` in the request's order (DEFAULT, STEERED, sweep rows), whatever finished
    first."""
    return {label: outputs[label] for label in labels}


def check_outputs(outputs: Mapping[str, Completion]) -> None:
    """Outputs by label, each a ``Completion`` (what ``steer_stream``'s frames hold)."""
    if not isinstance(outputs, Mapping):
        raise RequestError("outputs", f"must be a dict of label to Completion, got {outputs!r}")
    for label, completion in outputs.items():
        if not isinstance(label, str) or not isinstance(completion, Completion):
            raise RequestError(f"outputs[{label!r}]", f"must be a Completion, got {completion!r}")
