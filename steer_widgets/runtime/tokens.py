"""Prompts to token ids, with a flag per token saying whether it is special.

A chat prompt is rendered with the model's chat template (``add_generation_prompt=True``) and
tokenized without adding special tokens again, so there is never a double BOS. Every token
that does not come from a message's own content (BOS, role headers, the template's default
system prompt) is flagged special: that is what ``steer_special_tokens=False`` leaves alone
and what activation heatmaps grey out.

An assistant message may carry the ``token_ids`` a model generated for it (a chat's earlier
reply, ``steering/chat.py``): those ids are spliced in as they were generated, never
re-tokenised from text, and flagged ``generated``; the template's text around them is
tokenised piece by piece.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import RequestError

ROLES = ("system", "user", "assistant")
Prompt = str | Sequence[dict]


@dataclass(frozen=True)
class EncodedPrompt:
    ids: tuple[int, ...]
    special: tuple[bool, ...]
    chat: bool
    generated: tuple[bool, ...] = ()  # per position: an earlier reply's own token (else none)

    def generated_at(self) -> tuple[bool, ...]:
        """Per position, whether it is a generated token of an earlier reply."""
        return self.generated or (False,) * len(self.ids)


class Tokenizer:
    """Thin wrapper over a transformers fast tokenizer.

    ``prepend_bos``: put BOS before a completion prompt when the tokenizer does not, as
    TransformerLens does for models with ``default_prepend_bos`` (GPT-2): SAEs trained with
    ``prepend_bos`` saw every text after a BOS, and their features depend on it.
    """

    def __init__(self, hf_tokenizer, prepend_bos: bool = False) -> None:
        self.hf = hf_tokenizer
        self.prepend_bos = prepend_bos
        self.special_ids = frozenset(hf_tokenizer.all_special_ids)
        self.eos_id = hf_tokenizer.eos_token_id
        self.bos_id = hf_tokenizer.bos_token_id

    @classmethod
    def from_folder(cls, folder: Path, prepend_bos: bool = False) -> Tokenizer:
        """The folder's tokenizer as ``AutoTokenizer`` builds it. A plain ``tokenizer.json``
        tokenizer (every GGUF's, converted) is built by its class directly: ``AutoTokenizer``
        imports transformers' model registry for it, 140 MB and seconds more."""
        import json

        try:
            config = json.loads((Path(folder) / "tokenizer_config.json").read_text())
        except (OSError, ValueError):
            config = {}
        if config.get("tokenizer_class") in ("TokenizersBackend", "PreTrainedTokenizerFast"):
            from transformers import PreTrainedTokenizerFast

            return cls(PreTrainedTokenizerFast.from_pretrained(folder), prepend_bos)
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(folder), prepend_bos)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.hf, "chat_template", None))

    def decode(self, ids: Sequence[int]) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=True)

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        """Each token as the text it contributes (for heatmaps)."""
        return self.hf.batch_decode([[i] for i in ids])

    def encode(self, prompt: Prompt, max_len: int | None = None) -> EncodedPrompt:
        """Encode a completion prompt (str) or chat messages; validate before any work."""
        check_prompt(prompt)
        if isinstance(prompt, str):
            enc = self._encode_text(prompt)
        else:
            enc = self._encode_chat(prompt)
        if max_len is not None and len(enc.ids) > max_len:
            raise RequestError(
                "prompt", f"is {len(enc.ids)} tokens; the model's context allows {max_len}"
            )
        return enc

    def _encode_text(self, text: str) -> EncodedPrompt:
        if not text.strip():
            raise RequestError("prompt", "is empty")
        ids = self.hf(text, add_special_tokens=True)["input_ids"]
        if self.prepend_bos and self.bos_id is not None and ids[:1] != [self.bos_id]:
            ids = [self.bos_id, *ids]
        return EncodedPrompt(tuple(ids), tuple(i in self.special_ids for i in ids), chat=False)

    def _encode_chat(self, messages: Sequence[dict]) -> EncodedPrompt:
        if not self.has_chat_template:
            raise RequestError(
                "prompt", "is a chat (list of messages) but this model has no chat template"
            )
        replies = [n for n, m in enumerate(messages) if "token_ids" in m]
        marks = {n: f"\ue000{k}\ue001" for k, n in enumerate(replies)}  # never in user text
        shown = [{"role": m["role"], "content": marks.get(n, m["content"])}
                 for n, m in enumerate(messages)]  # fmt: skip
        text = self.hf.apply_chat_template(shown, add_generation_prompt=True, tokenize=False)
        pieces = _split_at(text, [marks[n] for n in replies], replies)
        bounds = [-1, *replies, len(messages)]
        ids: list[int] = []
        special: list[bool] = []
        generated: list[bool] = []
        for k, piece in enumerate(pieces):
            if k:  # the reply before this piece, as it was generated
                reply = [int(i) for i in messages[replies[k - 1]]["token_ids"]]
                ids += reply
                special += [i in self.special_ids for i in reply]
                generated += [True] * len(reply)
            between = [m["content"] for m in messages[bounds[k] + 1 : bounds[k + 1]]]
            piece_ids, piece_special = self._template_piece(piece, between)
            ids += piece_ids
            special += piece_special
            generated += [False] * len(piece_ids)
        return EncodedPrompt(tuple(ids), tuple(special), True, tuple(generated) if replies else ())

    def _template_piece(self, text: str, contents: list[str]) -> tuple[list[int], list[bool]]:
        """A rendered template's text tokenised, each token flagged special unless it comes
        from one of the messages' ``contents``."""
        enc = self.hf(text, add_special_tokens=False, return_offsets_mapping=True)
        spans = _content_spans(text, contents)
        special = [
            i in self.special_ids or not _inside(a, b, spans)
            for i, (a, b) in zip(enc["input_ids"], enc["offset_mapping"], strict=True)
        ]
        return list(enc["input_ids"]), special


def check_prompt(prompt) -> None:
    """A prompt's shape, without a tokenizer: a string, or a list of {role, content} dicts."""
    if isinstance(prompt, str):
        _check_unicode("prompt", prompt)
        return
    if isinstance(prompt, bytes) or not isinstance(prompt, Sequence):
        raise RequestError(
            "prompt", f"must be a string or a list of {{role, content}} dicts, got {prompt!r}"
        )
    _check_messages(prompt)


def _check_messages(messages: Sequence[dict]) -> None:
    if len(messages) == 0:
        raise RequestError("prompt", "is an empty list of messages")
    for n, m in enumerate(messages):
        if not isinstance(m, dict) or set(m) - {"token_ids"} != {"role", "content"}:
            raise RequestError(
                f"prompt[{n}]",
                "must be a dict with exactly 'role' and 'content' (and, for an earlier "
                "reply, its generated 'token_ids')",
            )
        if m["role"] not in ROLES:
            raise RequestError(f"prompt[{n}].role", f"is {m['role']!r}; expected one of {ROLES}")
        if not isinstance(m["content"], str):
            raise RequestError(f"prompt[{n}].content", "must be a string")
        _check_unicode(f"prompt[{n}].content", m["content"])
        if "token_ids" in m:
            _check_reply_ids(n, m)
    if not any(m["content"].strip() for m in messages):
        raise RequestError("prompt", "has no message with content")


def _check_reply_ids(n: int, m: dict) -> None:
    """An earlier reply's generated ids: an assistant message's, a list of token ids."""
    if m["role"] != "assistant":
        raise RequestError(f"prompt[{n}].token_ids", "belongs to an assistant message only")
    ids = m["token_ids"]
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise RequestError(f"prompt[{n}].token_ids", f"must be a list of token ids, got {ids!r}")
    for i, token in enumerate(ids):
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise RequestError(f"prompt[{n}].token_ids[{i}]", f"is not a token id: {token!r}")


def _check_unicode(field: str, text: str) -> None:
    """Text a tokenizer can read: a lone surrogate (say, from a bad decode) is not."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise RequestError(field, f"is not valid Unicode text ({err.reason})") from None


def _split_at(text: str, marks: list[str], replies: list[int]) -> list[str]:
    """``text`` cut at each mark, in order: the template's pieces around the replies."""
    pieces, rest = [], text
    for mark, n in zip(marks, replies, strict=True):
        before, found, rest = rest.partition(mark)
        if not found:
            raise RequestError(
                f"prompt[{n}].token_ids",
                "cannot be placed: this model's chat template does not write an assistant "
                "message's content as given",
            )
        pieces.append(before)
    return [*pieces, rest]


def _content_spans(text: str, contents: list[str]) -> list[tuple[int, int]]:
    """Character spans of each message's content, found in order in the rendered template."""
    spans, pos = [], 0
    for c in contents:
        at = text.find(c, pos) if c else -1
        if at >= 0:
            spans.append((at, at + len(c)))
            pos = at + len(c)
    return spans


def _inside(a: int, b: int, spans: list[tuple[int, int]]) -> bool:
    return b > a and any(s <= a and b <= e for s, e in spans)


def generation_stop_ids(folder: Path) -> frozenset[int]:
    """The ids ``generation_config.json`` stops at: instruction-tuned models end a turn with
    a token that is not the tokenizer's EOS (Gemma's ``<end_of_turn>``, Llama 3's
    ``<|eot_id|>``), so stopping at EOS alone runs past the answer."""
    import json

    try:
        eos = json.loads((folder / "generation_config.json").read_text()).get("eos_token_id")
    except (OSError, ValueError, AttributeError):
        return frozenset()
    ids = eos if isinstance(eos, list) else [eos]
    return frozenset(int(i) for i in ids if isinstance(i, int) and not isinstance(i, bool))
