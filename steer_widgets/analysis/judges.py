"""Judges: did a text turn toward the concept? A judge maps a text to a score.

A keyword judge (the steering benchmark's, after AxBench's concept score with words instead
of an LLM) is the default because it is exact, free and needs no network: a word form counts
as a whole word, case-insensitive, or with a plain inflection (-s, -es, -ing, -ed, -er, -ers),
so "creatures" counts for "creature" and "cooked" for "cook". Any callable ``text -> bool |
float`` can replace it (an LLM judge, a classifier).
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import RequestError

SUFFIXES = "(?:s|es|ing|ed|er|ers)?"
MIN_LABEL_WORD = 3  # label words shorter than this ("a", "of", "to") say nothing of a topic
# Longer words that say nothing of a topic either: function words, and the words feature
# explanations are written with ("references to cats and kittens", "mentions of rivers").
NOT_TOPICS = frozenset(
    "and the for with from that this these those into onto about its are was were their them "
    "they other such like related relating references reference referring mentions mention "
    "mentioning terms term words word phrases phrase text texts concepts concept contexts "
    "context especially including various often when which also use used using tokens token "
    "specific particular different things thing".split()
)


def mentions(text: str, forms: Sequence[str]) -> bool:
    """A word form (or it with a plain inflection) as a whole word, case-insensitive."""
    return any(re.search(rf"\b{re.escape(f)}{SUFFIXES}\b", text, re.IGNORECASE) for f in forms)


def label_words(label: str) -> list[str]:
    """The whole words of a feature label (``"trees, forest -> leaves"``, or an explanation
    such as ``"references to cats and kittens"``), once each, function and explanation words
    left out: what a text steered by that feature should say."""
    words = (w.lower() for w in re.findall(r"[A-Za-z]+", label or ""))
    return list(dict.fromkeys(w for w in words if len(w) >= MIN_LABEL_WORD and w not in NOT_TOPICS))


@dataclass(frozen=True)
class Judge:
    """A named scoring function; ``forms`` is set for a keyword judge (records keep it, so
    a keyword evaluation replays with its judge)."""

    name: str
    fn: Callable[[str], bool | float]
    forms: tuple[str, ...] | None = None

    def score(self, text: str, prompt_name: str) -> float:
        """The judge's score of ``text`` as a float (True: 1.0); any failure is a named
        ``JudgeError`` saying which judge and which prompt."""
        try:
            value = self.fn(text)
        except Exception as err:  # the user's code: name it, never let it escape bare
            raise JudgeError(self.name, prompt_name, f"raised {type(err).__name__}: {err}") from err
        if isinstance(value, bool):
            return float(value)
        if not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise JudgeError(self.name, prompt_name, f"returned {value!r}, not a bool or number")
        return float(value)


class JudgeError(RequestError):
    """A judge failed on a text; ``evaluation`` keeps the rows finished before it."""

    def __init__(self, judge: str, prompt: str, problem: str) -> None:
        self.judge, self.prompt = judge, prompt
        self.evaluation = None
        super().__init__("judge", f"{judge!r} on prompt {prompt!r} {problem}")


def make_judge(judge, default_forms: Sequence[str] | None) -> Judge:
    """``judge`` as a ``Judge``: a list of word forms, a callable, or ``None`` (the
    steering's own words, ``default_forms``). Checked before any decoding."""
    if judge is None:
        if not default_forms:
            raise RequestError(
                "judge",
                "this steering has no words to judge by (a custom vector, or a feature "
                "without a label): pass judge=[word forms] or a callable text -> bool | float",
            )
        return words_judge(default_forms)
    if isinstance(judge, Judge):
        return judge
    if isinstance(judge, (str, bytes)):
        raise RequestError("judge", f"must be a list of word forms or a callable, got {judge!r}")
    if callable(judge):
        return Judge(getattr(judge, "__name__", type(judge).__name__), judge)
    if isinstance(judge, Sequence):
        return words_judge(judge)
    raise RequestError("judge", f"must be a list of word forms or a callable, got {judge!r}")


def words_judge(forms: Sequence) -> Judge:
    checked = []
    for i, f in enumerate(forms):
        if not isinstance(f, str) or not f.strip():
            raise RequestError(f"judge[{i}]", f"must be a non-empty word, got {f!r}")
        checked.append(f.strip())
    if not checked:
        raise RequestError("judge", "is an empty list of word forms")
    forms_t = tuple(dict.fromkeys(checked))
    return Judge("words: " + ", ".join(forms_t), lambda text: mentions(text, forms_t), forms_t)
