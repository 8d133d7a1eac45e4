"""Where the process's large buffers come from (the heap, not fresh pages mapped for each), and what the cyclic
garbage collector walks.

A long conversation's request body is megabytes, and so is the body sent upstream. glibc serves an allocation
over its mmap threshold with pages mapped for it, each faulted in on first touch and unmapped when freed; the
threshold starts at 128 KiB and is raised only to the size of the last such block freed, which a growing
conversation's next body always exceeds. So every request paid ~1,000 page faults for a 4 MB body: 1.3 ms to
read it, against 0.25 ms from memory already mapped (measured on the served proxy). `serve` raises the threshold
once, before it serves: bodies then come from the heap, whose freed memory is reused; what the heap keeps free at
its top is bounded by the trim threshold.
"""

from __future__ import annotations

import ctypes
import gc

LARGE_BUFFER_BYTES = 32 * 1024 * 1024
"""The mmap threshold set: glibc's largest (its heaps are 64 MiB). A body larger still is mapped for itself."""
KEPT_FREE_BYTES = 8 * 1024 * 1024
"""How much freed memory the heap keeps at its top before giving it back (the trim threshold): a body or two. The
memory it keeps shows in the process's RSS (64 MiB kept grew a 1,000-turn Claude Code session's by 1.39× → 1.54×
of its 20th turn's; 4 to 16 MiB cost the same CPU in a 400-turn one)."""
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def keep_large_buffers() -> bool:
    """Serve large buffers from the heap (glibc's `mallopt`); False where the C library has no such setting
    (macOS) or refuses it: the buffers are then allocated as before, only more slowly."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, LARGE_BUFFER_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD, KEPT_FREE_BYTES))


def freeze_loaded() -> None:
    """Leave what exists once the proxy is loaded (its modules' objects and LiteLLM's, ~300,000) out of the cyclic
    garbage collector's full passes (`gc.freeze`), which stop the event loop: each walked them all, ~170 ms on a
    fresh process and ~230 ms once a long session's objects joined them. A pass now walks what came since."""
    gc.collect()
    gc.freeze()
