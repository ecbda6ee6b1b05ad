"""This test process's resident memory, for tests that bound what a hostile
client can make the gateway hold."""

from __future__ import annotations

import ctypes
import ctypes.util


def resident_bytes() -> int:
    """Resident memory after handing freed heap memory back to the system
    (malloc_trim): what is still in use, not what malloc kept for later."""
    libc_name = ctypes.util.find_library("c")
    if libc_name:
        trim = getattr(ctypes.CDLL(libc_name), "malloc_trim", None)
        if trim is not None:
            trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
