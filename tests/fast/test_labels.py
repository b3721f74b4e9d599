"""Feature labels keep words a reader recognises, the most distinctive context words first."""

from __future__ import annotations

import pytest

from steer_widgets.sae.feature_index import feature_label

pytest.importorskip("wordfreq")


def _context(word_pieces: list[str], at: int) -> dict:
    return {"tokens": word_pieces, "max_pos": at}


def test_code_tokens_and_word_pieces_are_dropped():
    contexts = [_context([" the", " vessels"], 1), _context([" a", " vessel"], 1)]
    label = feature_label(contexts, [" indexerror", " runtimeerror", " ship", " auton"])
    assert label == "vessels, vessel → ship"


def test_only_noise_gives_no_label():
    assert feature_label([], [" shutil", " miscon", " torchvision"]) == ""


def test_distinctive_context_words_come_first():
    contexts = [_context([" water"], 0), _context([" water"], 0), _context([" schooner"], 0)]
    contexts += [_context([" made"], 0)]
    # "schooner" (rare) once and "water" twice beat "made" (frequent) once
    assert feature_label(contexts, []) == "schooner, water"
