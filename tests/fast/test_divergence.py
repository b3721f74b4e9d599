"""Where a completion departs from the DEFAULT one (what the panes mark)."""

from __future__ import annotations

import pytest

from steer_widgets.widgets.completions import divergence


@pytest.mark.parametrize(
    ("ids", "ref", "ref_done", "want"),
    [
        ((1, 2, 3), (1, 2, 3), True, -1),  # identical
        ((1, 2, 9), (1, 2, 3), False, 2),  # differs at 2
        ((5,), (1, 2, 3), False, 0),
        ((1, 2), (1, 2, 3), False, -1),  # still a prefix of an unfinished reference
        ((1, 2), (1, 2, 3), True, -1),  # shorter than a finished reference: not yet known
        ((1, 2, 3, 4), (1, 2, 3), True, 3),  # runs past where the reference ended
        ((1, 2, 3, 4), (1, 2, 3), False, -1),  # the reference may still produce 4
        ((), (), True, -1),
    ],
)
def test_divergence(ids, ref, ref_done, want):
    assert divergence(ids, ref, ref_done) == want
