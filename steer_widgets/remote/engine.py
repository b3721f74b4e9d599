"""The engine's public API over an interp-engine server, for models bigger than this machine.

``Engine.remote(url, token)`` returns a ``RemoteEngine``: the same ``steer``,
``steer_stream``, ``generate``, ``activations``, ``top_features*``, ``neighbours``,
``feature_index`` and records as the local engine, so ``sw.Explorer(engine)`` works
unchanged. What runs where:

* The model runs on the server (PyPI ``interp-engine``: eager on one device, or vLLM
  tensor-parallel on several GPUs). SAEs stay in our SAE store on this machine; a feature's
  decoder row goes out as a steering vector, and activations come back as residuals from
  ``/v1/capture`` with the SAE maths (TopK, JumpReLU, ``b_dec``, normalisation) done by
  ``sae/sae.py`` here.
* Tokenization runs here with the model's own tokenizer (checked against the server's at
  connect), so validation, special-token flags and records are the local engine's.
* Every output (DEFAULT, STEERED, each sweep row) is its own ``/v1/generate`` request,
  streamed concurrently. No row is ever batched with another by us, so each is exactly what
  that request gives alone; ``served_by["guarantee"]`` in every record says how far the
  server's side of that promise goes (see ``GUARANTEES``).

TransformerLens hook names map to the server's point names (``blocks.10.hook_resid_post``
is ``resid_post.10``); a hook, method or sampling rule the server cannot serve exactly is
refused with a ``RemoteUnsupported`` error before any request is sent.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import Tensor

from .. import checks
from ..checks import public_methods
from ..engine import Engine
from ..errors import RemoteError, RemoteUnsupported, RequestError
from ..files import user_path
from ..runtime.model import DEFAULT_MODEL, LoadedModel, default_model_dir
from ..runtime.tokens import EncodedPrompt, Tokenizer
from ..sae.store import DEFAULT_BUDGET
from ..steering.conditions import When
from ..steering.requests import (
    Direction,
    Plan,
    SteerRequest,
    conditions_of,
    resolve_directions,
    sample_seeds,
    unsteered,
    validate_shape,
)
from ..steering.results import Completion, Frame, SteerResult, final_stop, ordered
from .client import TOKEN_ENV, RemoteClient, decode_tensor, encode_tensor

# TransformerLens hook kind -> the server's canonical point name (same tensor, checked in tests).
HOOK_POINTS = {
    "hook_resid_pre": "resid_pre",
    "attn.hook_z": "z",
    "hook_attn_out": "attn_out",
    "hook_resid_mid": "resid_mid",
    "hook_mlp_out": "mlp_out",
    "hook_resid_post": "resid_post",
}
STEER_OPS = {"SIMPLE_ADDITIVE": "additive", "ORTHOGONAL_DECOMP": "orthogonal"}
STEER_OPS["PROJECTION_CAP"] = "projection_cap"
GUARANTEES = {
    "eager": "exact-solo: each output is its own request on a server that runs one request at "
    "a time with its seed, so it is exactly that output requested alone",
    "other": "solo-request: each output is its own request, but this backend batches "
    "concurrent requests (from anyone) and its kernels are not promised batch-invariant, so "
    "an output can change with the server's load; seeded sampling follows the server's sampler",
}
CHAT_PROBE = [{"role": "user", "content": "Is the tokenizer here the server's? Ünïcode ✓"}]


def point_of(hook: str) -> tuple[str, int]:
    """``blocks.L.<kind>`` to the server's ``(point, L)``; ``RemoteUnsupported`` otherwise."""
    parts = hook.split(".", 2)
    if len(parts) == 3 and parts[0] == "blocks" and parts[1].isdigit() and parts[2] in HOOK_POINTS:
        return HOOK_POINTS[parts[2]], int(parts[1])
    kinds = ", ".join(HOOK_POINTS)
    raise RemoteUnsupported("hook", f"{hook!r} has no interp-engine point (served: {kinds})")


@dataclass(frozen=True)
class RemoteConfig:
    """What the engine reads from ``runtime.cfg``, as the server describes its model."""

    n_layers: int
    d_model: int
    max_context: int
    vocab_size: int


class RemoteRuntime:
    """The model behind a server, seen through the runtime interface the engine's analysis
    uses: hook names and widths, and ``forward`` with capture hooks (one ``/v1/capture``).

    Generation does not go through here: ``RemoteEngine`` streams whole completions.
    """

    device = "cpu"  # where captured residuals land (the SAEs live here)
    products = "float32"  # the server's arithmetic is its own; no int8 blocks are read here

    def __init__(self, client: RemoteClient, describe: dict, max_context: int, vocab: int):
        d = describe["description"]
        self.client = client
        self.cfg = RemoteConfig(d["n_layers"], d["d_model"], max_context, vocab)
        served = set(d.get("capture_points", ()))
        self.points = frozenset(served)
        widths = {p: d["d_model"] for p in HOOK_POINTS.values()}
        widths["z"] = d["n_heads"] * d["head_dim"]
        self._widths = {
            f"blocks.{i}.{kind}": widths[point]
            for i in range(d["n_layers"])
            for kind, point in HOOK_POINTS.items()
            if point in served
        }
        self._unembed: Tensor | None = None

    @property
    def hook_names(self) -> list[str]:
        return list(self._widths)

    def hook_widths(self) -> dict[str, int]:
        return dict(self._widths)

    def capture(self, ids: Sequence[int], hooks: Sequence[str]) -> dict[str, Tensor]:
        """Activations [T, width] at ``hooks`` for the token ids, in one request."""
        names = {h: "{}.{}".format(*point_of(h)) for h in hooks}
        body = {"prompt_token_ids": list(ids), "points": sorted(set(names.values()))}
        acts = self.client.post("/v1/capture", body)["activations"]
        missing = [p for p in names.values() if p not in acts]
        if missing:
            raise RemoteError(self.client.url, f"/v1/capture did not return {missing}")
        return {h: decode_tensor(acts[p]) for h, p in names.items()}

    def capture_point(self, ids: Sequence[int], point: str, rows: Sequence[int]) -> Tensor:
        """One global point (``lm_head``, ``final_norm``) at the given positions."""
        body = {"prompt_token_ids": list(ids), "points": [point], "rows": list(rows)}
        return decode_tensor(self.client.post("/v1/capture", body)["activations"][point])

    def forward(self, tokens: Tensor, cache=None, hooks=None, stop_at_layer=None, **_) -> None:
        """Call each capture hook with its activation [1, T, width] (as a local forward
        would); a forward for logits or with a KV cache has no remote counterpart."""
        if cache is not None or not hooks or stop_at_layer is None:
            raise RemoteUnsupported(
                "model", "a remote model serves captures and whole generations, not forwards"
            )
        ids = tokens[0].tolist()
        for name, value in self.capture(ids, list(hooks)).items():
            hooks[name](value[None], 0)

    @property
    def unembed_weight(self) -> Tensor:
        """[vocab, d_model], fetched once (float16 on the wire) for SAEs without an index."""
        if self._unembed is None:
            rows = []
            for start in range(0, self.cfg.vocab_size, 4096):
                ids = list(range(start, min(start + 4096, self.cfg.vocab_size)))
                body = {"token_ids": ids, "output_dtype": "float16"}
                rows.append(decode_tensor(self.client.post("/v1/unembed_rows", body)["tensor"]))
            self._unembed = torch.cat(rows)
        return self._unembed


@public_methods
class RemoteEngine(Engine, kind="remote"):
    """``Engine`` whose model is an interp-engine server; see the module docstring.

    ``model`` names the model for records and for the SAEs shipped with the package (default:
    what the server reports); ``tokenizer`` is where to load its tokenizer from (default: the
    offline copy for the default model, else the server's model id, a hub name or a folder).
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        saes: Sequence[str | Path] | Mapping[str, str | Path] | None = None,
        model: str | None = None,
        tokenizer: str | Path | None = None,
        sae_budget_bytes: int = DEFAULT_BUDGET,
        retries: int = 5,
    ) -> None:
        _check_connection(url, token, model, tokenizer, retries)
        client = RemoteClient(url, token or os.environ.get(TOKEN_ENV), retries)
        info = client.get("/v1/describe")  # unreachable / wrong token fail here, by name
        server_model = info["description"]["hf_model_id"]
        name = model or server_model
        tok = _load_tokenizer(tokenizer, name, server_model)
        _check_tokenizer(client, tok, info.get("has_chat_template", False))
        max_context = _max_context(tokenizer, name, server_model, info["limits"])
        runtime = RemoteRuntime(client, info, max_context, len(tok.hf))
        self.client, self.limits = client, info["limits"]
        self.hooks_available = bool(info["description"].get("hooks_available", True))
        backend = info["description"]["backend"]
        self.served_by = {
            "url": client.url,
            "engine": f"interp-engine {info.get('engine_version', '?')}",
            "backend": backend,
            "server_model": server_model,
            "dtype": info.get("load", {}).get("dtype"),
            "guarantee": GUARANTEES["eager" if backend == "eager" else "other"],
        }
        super().__init__(LoadedModel(name, runtime, tok), saes, sae_budget_bytes)

    # -- public API: the local engine's, plus where the outputs came from -----------------
    def default_prompt_multiplier(self) -> float:
        """1: the server steers every position alike (see ``plan``)."""
        return 1.0

    def steer(self, request, cancel: threading.Event | None = None) -> SteerResult:
        result = super().steer(request, cancel)
        result.served_by = dict(self.served_by)
        return result

    def result(self, request: SteerRequest, outputs: Mapping[str, Completion]) -> SteerResult:
        result = super().result(request, outputs)
        result.served_by = dict(self.served_by)
        return result

    def plan(self, request: SteerRequest) -> tuple[EncodedPrompt, Plan]:
        """The local validation, then what this server cannot serve exactly, before any
        request is sent."""
        validate_shape(request)
        _check_conditions(request)  # before the local plan captures for a prompt-scope one
        prompt, plan = super().plan(request)
        steers = any(label != "DEFAULT" for label in plan.labels)
        if steers and not self.hooks_available:
            raise RemoteUnsupported(
                "features", "this server's backend generates only (no hooks): it cannot steer"
            )
        if steers and not request.steer_special_tokens:
            raise RemoteUnsupported(
                "steer_special_tokens",
                "False needs a per-position steering mask, which interp-engine's /v1/generate "
                "does not take; the server steers every prompt position",
            )
        if steers and request.prompt_multiplier != 1.0:
            raise RemoteUnsupported(
                "prompt_multiplier",
                "a prompt strength other than the generated tokens' needs per-position "
                "coefficients, which interp-engine's /v1/generate does not take; use 1",
            )
        if (
            steers
            and request.steer_method != "SIMPLE_ADDITIVE"
            and any(d.centred for d in self._directions(request))
        ):
            raise RemoteUnsupported(
                "steer_method",
                f"{request.steer_method} on an SAE that reads its hook mean-centred needs the "
                "centred component, which the server's steering ops do not take",
            )
        if request.temperature > 0 and request.freq_penalty > 0:
            raise RemoteUnsupported(
                "freq_penalty",
                "interp-engine samples with a presence penalty, not a frequency penalty; "
                "use freq_penalty=0 (or temperature=0, where it has no effect)",
            )
        if len(prompt.ids) > self.limits["max_prompt_tokens"]:
            raise RequestError(
                "prompt",
                f"is {len(prompt.ids)} tokens; the server takes {self.limits['max_prompt_tokens']}",
            )
        if request.n_completion_tokens > self.limits["max_new_tokens"]:
            raise RequestError(
                "n_completion_tokens",
                f"is {request.n_completion_tokens}; the server takes "
                f"{self.limits['max_new_tokens']}",
            )
        return prompt, plan

    # -- generation: one request per output, streamed concurrently ------------------------
    def _stream(self, request, prompt, plan, cancel, every_step: bool = True) -> Iterator[Frame]:
        decoder = self.decoder
        outputs = {label: Completion("", ()) for label in plan.labels}
        cached = None
        if "DEFAULT" in plan.labels:
            cached = decoder.cached_default(prompt.ids, request.sampling)
        if cached is not None:
            outputs["DEFAULT"] = cached
        bodies = self._bodies(request, prompt, plan, skip_default=cached is not None)
        if not bodies:
            yield Frame(ordered(outputs, plan.labels), 0, done=True)
            return
        wanted = request.sampling.n_completion_tokens
        with decoder.running(cancel) as token:  # the run's one token, for cancel_all too
            streams = _Streams(self.client, bodies, token)
            try:
                for label, ids in streams.tokens():
                    if every_step:
                        outputs[label] = decoder.completion(ids, "")
                        yield Frame(ordered(outputs, plan.labels), streams.step)
            except RemoteError as err:  # keep every token already received
                finals = self._finals(streams, wanted, cut="error")
                err.outputs = ordered({**outputs, **finals}, plan.labels)
                raise
            finally:
                streams.close()
        outputs.update(self._finals(streams, wanted))
        on = _decided(plan)
        for out in plan.outputs:  # each gated entry's log: one decision at every position
            if on and out.multiplier is not None and out.label in outputs:
                ran = len(prompt.ids) + max(len(outputs[out.label].token_ids) - 1, 0)
                gates = {entry: (decision,) * ran for entry, decision in on.items()}
                outputs[out.label] = replace(outputs[out.label], gates=gates)
        if "DEFAULT" in bodies:  # kept only if complete
            decoder.remember_default(prompt.ids, request.sampling, outputs["DEFAULT"])
        yield Frame(ordered(outputs, plan.labels), streams.step, done=True)

    def _finals(
        self, streams: _Streams, wanted: int, cut: str = "cancelled"
    ) -> dict[str, Completion]:
        """Each streamed output with its stop by the one rule (``results.final_stop``), told
        which streams the server finished: one it ended short on a stop token we do not
        know is "eos"; one cut off by our cancel or a broken stream stops ``cut``."""
        decoder, out = self.decoder, {}
        for label, ids in streams.ids.items():
            stop = final_stop(ids, wanted, decoder.stop_ids, label in streams.finished)
            out[label] = decoder.completion(ids, cut if stop == "cancelled" else stop)
        return out

    def _bodies(self, request, prompt, plan: Plan, skip_default: bool) -> dict[str, dict]:
        """One ``/v1/generate`` body per output still to generate."""
        base = _generate_body(prompt.ids, request.sampling)
        steered = any(out.multiplier is not None for out in plan.outputs)
        on = _decided(plan)
        directions = self._directions(request) if steered else []
        directions = [d for d in directions if on.get(d.entry, True)]  # gates decided: off
        bodies = {}
        for out in plan.outputs:
            if out.multiplier is None:
                if not skip_default:
                    bodies[out.label] = base
            else:
                wire = steering_wire(request.steer_method, directions, out.multiplier)
                bodies[out.label] = {**base, "steering": wire} if wire else base
        return bodies

    def _directions(self, request: SteerRequest) -> list[Direction]:
        return resolve_directions(request, self.saes, self.model.runtime.hook_widths())

    # -- the rest of the engine's API, one request per output -------------------------------
    def samples(self, prompt, n: int, **sampling) -> list[Completion]:
        """``n`` samples, seeds ``seed + i``, each its own request (as ``generate`` would)."""
        request = unsteered(prompt, sampling)
        enc, _ = self.plan(request)  # raises before any work
        base = _generate_body(enc.ids, request.sampling)
        bodies = {str(i): {**base, "seed": seed} for i, seed in enumerate(sample_seeds(request, n))}
        with self.decoder.running() as token:  # cancel_all reaches it
            streams = _Streams(self.client, bodies, token)
            try:
                for _ in streams.tokens():
                    pass
            finally:
                streams.close()
        return list(self._finals(streams, request.n_completion_tokens).values())

    def steer_batch(
        self, requests: Mapping[str, SteerRequest], cancel: threading.Event | None = None
    ) -> dict[str, SteerResult]:
        """Each request on its own (every output is a solo request here anyway), on any
        prompts and sampling; all are validated, a bad one named by its key, first."""
        reqs, _ = self._batch_plans(requests)
        with self.decoder.running(cancel) as token:  # one token for every request
            return {name: self.steer(request, token) for name, request in reqs.items()}

    def steer_batch_stream(
        self, requests: Mapping[str, SteerRequest], cancel: threading.Event | None = None
    ) -> Iterator[dict[str, Frame]]:
        """Each request streamed in turn, after every token every request's latest frame
        (the last time, all done); all are validated first, a bad one named by its key."""
        reqs, plans = self._batch_plans(requests)
        return self._in_turn(reqs, plans, cancel)

    def _in_turn(self, reqs, plans, cancel) -> Iterator[dict[str, Frame]]:
        latest = {
            n: Frame({label: Completion("", ()) for label in plans[n][1].labels}, 0) for n in reqs
        }
        with self.decoder.running(cancel) as token:  # one token for every request
            for name, request in reqs.items():
                prompt, plan = plans[name]
                for frame in self._stream(request, prompt, plan, token):
                    latest[name] = frame
                    if not all(f.done for f in latest.values()):
                        yield dict(latest)
        yield dict(latest)

    def token_logprobs(self, prompt, completion) -> Tensor:
        """Log-probabilities of the completion's tokens, from the server's logits."""
        if "lm_head" not in self.model.runtime.points:
            raise RemoteUnsupported("token_logprobs", "this server does not serve lm_head")
        text = self.text(prompt, completion)
        n = len(text.ids) - len(self.text(prompt).ids)
        if n == 0:
            return torch.zeros(0)
        rows = list(range(len(text.ids) - n - 1, len(text.ids) - 1))
        logits = self.model.runtime.capture_point(text.ids, "lm_head", rows)
        targets = torch.tensor(text.ids[-n:])
        return torch.log_softmax(logits, -1).gather(1, targets[:, None])[:, 0]


def _check_conditions(request: SteerRequest) -> None:
    """Only prompt-scope conditions can be served: decided here from ``/v1/capture`` before
    the request, they turn an entry's steering on or off for the whole generation."""
    for field, cond in conditions_of(request):
        for leaf in cond.leaves():
            if not isinstance(leaf, When) or leaf.scope != "prompt":
                raise RemoteUnsupported(
                    field,
                    "token-scope conditions and token windows need each position's gate "
                    "inside the forward pass, which interp-engine's /v1/generate does not "
                    "take; a scope='prompt' condition is served, or run it on a local engine",
                )


def _decided(plan: Plan) -> dict[str, bool]:
    """Each gated entry's decision (prompt scope only here), from the plan's steered rows."""
    for out in plan.outputs:
        if out.row.gates is not None:
            return out.row.gates.resolved.decided()
    return {}


def _generate_body(ids: Sequence[int], s) -> dict:
    """A ``/v1/generate`` body with our sampling, nothing left to the server's defaults."""
    return {
        "prompt_token_ids": list(ids),
        "max_tokens": s.n_completion_tokens,
        "temperature": float(s.temperature),
        "top_k": 0,  # 0 / 1.0 / 0.0: no filtering, not the checkpoint's recommendation
        "top_p": 1.0,
        "presence_penalty": 0.0,
        "seed": s.seed,
        "stop_at_eos": True,
        "stream": True,
    }


def steering_wire(method: str, directions: Sequence[Direction], multiplier: float) -> list[dict]:
    """Directions as interp-engine steering specs: one per point, ops by layer, in order.

    ``c = multiplier * strength``: SIMPLE_ADDITIVE is ``additive`` with scale c,
    ORTHOGONAL_DECOMP is ``orthogonal`` with coeff c, PROJECTION_CAP is ``projection_cap``
    with max c; the server applies each at every prompt position and generated token.
    """
    by_point: dict[str, dict[str, list]] = {}
    for d in directions:
        point, layer = point_of(d.hook)
        c = float(multiplier * d.strength)
        op = {"method": STEER_OPS[method], "vector": encode_tensor(d.vector)}
        op.update({"additive": {"scale": c}, "orthogonal": {"coeff": c}}.get(op["method"], {}))
        if op["method"] == "projection_cap":
            op["max"] = c
        by_point.setdefault(point, {}).setdefault(str(layer), []).append(op)
    return [{"point": p, "layers": layers} for p, layers in by_point.items()]


class _Streams:
    """Concurrent ``/v1/generate`` streams, one thread each, merged into one token feed.

    Each thread checks ``cancel`` (and ``close()``) after every line it reads, so a cancelled
    or abandoned stream is closed within one token. ``finished``: the streams whose ``done``
    line came, the server's word that the row ended (``results.final_stop``).
    """

    def __init__(self, client: RemoteClient, bodies: dict[str, dict], cancel: threading.Event):
        self.client, self.cancel = client, cancel
        self.ids: dict[str, list[int]] = {label: [] for label in bodies}
        self.finished: set[str] = set()
        self._events: queue.Queue = queue.Queue()
        self._closed = threading.Event()
        self._threads = [
            threading.Thread(target=self._pump, args=(label, body), daemon=True)
            for label, body in bodies.items()
        ]
        for t in self._threads:
            t.start()

    @property
    def step(self) -> int:
        return max(len(ids) for ids in self.ids.values())

    def tokens(self) -> Iterator[tuple[str, list[int]]]:
        """Yield ``(label, ids so far)`` per token until every stream ends or on cancel."""
        pending = set(self.ids)
        while pending and not self.cancel.is_set():
            try:
                kind, label, value = self._events.get(timeout=0.05)
            except queue.Empty:
                continue
            if kind == "token":
                self.ids[label].append(value)
                yield label, self.ids[label]
            elif kind == "done":
                pending.discard(label)
                self.finished.add(label)
            else:
                raise value

    def close(self) -> None:
        self._closed.set()

    def _halt(self) -> bool:
        return self.cancel.is_set() or self._closed.is_set()

    def _pump(self, label: str, body: dict) -> None:
        try:
            for item in self.client.stream("/v1/generate", body, self._halt, label):
                if item["type"] == "start":
                    _check_sampling(self.client.url, body, item.get("sampling", {}))
                elif item["type"] == "token":
                    self._events.put(("token", label, int(item["token_id"])))
                elif item["type"] == "done":
                    self._events.put(("done", label, item.get("finish")))
        except RemoteError as err:
            self._events.put(("error", label, err))
        except Exception as err:  # a malformed line: still a named error for the caller
            self._events.put(("error", label, RemoteError(self.client.url, f"{label}: {err!r}")))


def _check_sampling(url: str, body: dict, used: dict) -> None:
    """The server reports the sampling it applies; refuse to stream anything else."""
    want = {"temperature": body["temperature"], "top_k": None, "top_p": None}
    got = {k: used.get(k) for k in want}
    if got["top_p"] == 1.0:
        got["top_p"] = None
    if got != want or (used.get("presence_penalty") or 0.0) != 0.0:
        raise RemoteError(url, f"the server samples with {used}, not {want}")


def _check_connection(url, token, model, tokenizer, retries) -> None:
    """What ``RemoteEngine`` is given, checked before anything is sent."""
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise RequestError("url", f"must be an http:// or https:// address, got {url!r}")
    for name, value in (("token", token), ("model", model)):
        if value is not None:
            checks.text(name, value)
    if token is not None and not (token.isascii() and token.isprintable()):
        raise RequestError("token", "must be printable ASCII (it travels in an HTTP header)")
    if tokenizer is not None:
        user_path(tokenizer, "tokenizer")
    checks.integer("retries", retries, lo=0)


def _tokenizer_location(tokenizer, name: str, server_model: str):
    if tokenizer is not None:  # a folder (``~`` is the home folder) or a hub name
        return user_path(tokenizer, "tokenizer")
    return default_model_dir() if name == DEFAULT_MODEL else server_model


def _load_tokenizer(tokenizer, name: str, server_model: str) -> Tokenizer:
    location = _tokenizer_location(tokenizer, name, server_model)
    try:
        return Tokenizer.from_folder(location)
    except Exception as err:  # not on disk and no network: say what to pass
        raise RequestError(
            "tokenizer",
            f"could not load the model's tokenizer from {str(location)!r} "
            f"({type(err).__name__}); pass tokenizer= a local folder or hub name",
        ) from err


def _check_tokenizer(client: RemoteClient, tok: Tokenizer, chat: bool) -> None:
    """Our token ids must be the server's, or every request would mean something else."""
    text = CHAT_PROBE[0]["content"]
    ours = list(tok.hf(text, add_special_tokens=False)["input_ids"])
    theirs = client.post("/v1/tokenize", {"text": text, "prepend_bos": False})["token_ids"]
    if chat and tok.has_chat_template:
        ours = [ours, list(tok.encode(CHAT_PROBE).ids)]
        theirs = [theirs, client.post("/v1/tokenize", {"messages": CHAT_PROBE})["token_ids"]]
    if ours != theirs:
        raise RemoteError(
            client.url, f"its tokenizer disagrees with ours ({theirs} != {ours}); pass tokenizer="
        )


def _max_context(tokenizer, name: str, server_model: str, limits: dict) -> int:
    """The model's context length (from its config where we can read it), at most what the
    server accepts in one request."""
    limit = limits["max_prompt_tokens"] + limits["max_new_tokens"]
    try:
        from transformers import AutoConfig

        location = _tokenizer_location(tokenizer, name, server_model)
        return min(limit, int(AutoConfig.from_pretrained(location).max_position_embeddings))
    except Exception:  # a tokenizer-only folder, or offline: the server's limits decide
        return limit
