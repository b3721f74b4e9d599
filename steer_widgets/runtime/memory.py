"""Handing freed memory back to the system.

glibc's allocator keeps what a large computation freed (an attribution's backward pass
frees a few hundred MB of temporaries) in its heaps for reuse, so a kernel's resident memory
only ever grows across a day of clicks. ``malloc_trim`` returns the free pages; it costs a
few milliseconds, so it runs after the rare large computations, not after every step.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _trim():
    """glibc's ``malloc_trim``, or None where the C library has none (macOS, Windows, musl)."""
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    except OSError:
        return None


def release_freed_memory() -> bool:
    """Return the allocator's free pages to the system; False where that cannot be done."""
    trim = _trim()
    if trim is None:
        return False
    trim(0)
    return True
