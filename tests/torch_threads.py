"""``at_threads(n)``: torch (and the native kernels, which follow torch's count) at ``n``
threads for a block, the count before it restored afterwards, however the block ends."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def at_threads(n: int) -> Iterator[int]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield n
    finally:
        torch.set_num_threads(before)
