"""Settings that make XLA:CPU run bert_jax faster, applied when `bert_jax` is imported, before JAX starts a backend.

When JAX will run on the CPU (JAX_PLATFORMS=cpu, or no TPU or GPU device file), glibc's malloc keeps the memory a
step freed. XLA:CPU allocates each step's temporaries afresh (1.5 GB for BERT-base 8 x 128) from a worker thread,
and glibc maps such a block anew every time, so every page of it faulted again: 10% of the step's CPU time
(benchmarks/RESULTS.md, "Train step and embeddings on CPU"). One arena for all threads, no separately mapped
blocks and no trimming below 2 GB free keep it mapped. On TPU and GPU hosts nothing changes: their many input threads
keep glibc's per-thread arenas. Nothing happens once JAX has started its backends (its threads hold arenas by then).
"""
from __future__ import annotations

import ctypes
import glob
import os
import sys

# glibc's mallopt parameters (malloc.h) and the values that keep freed memory. The trim threshold is the largest int:
# -1, which the manual says disables trimming, left every page faulting again (glibc 2.36).
M_ARENA_MAX, M_MMAP_MAX, M_TRIM_THRESHOLD = -8, -4, -1
KEEP_FREED_MEMORY = ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, 2**31 - 1))


def runs_on_cpu() -> bool:
    """Whether JAX will pick the CPU: JAX_PLATFORMS says cpu only, or there is no TPU or NVIDIA device file."""
    platforms = os.environ.get("JAX_PLATFORMS", "").strip()
    if platforms:
        return platforms == "cpu"
    return not (glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*") or os.path.exists("/dev/nvidiactl"))


def configure() -> None:
    """Keep freed memory in the process (see above) when JAX will run on the CPU and has not started yet."""
    if not (runs_on_cpu() and sys.platform.startswith("linux")) or _backends_started():
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (e.g. musl): its malloc has no such switches
        return
    for parameter, value in KEEP_FREED_MEMORY:
        libc.mallopt(parameter, value)


def _backends_started() -> bool:
    if "jax" not in sys.modules:
        return False
    from jax._src import xla_bridge

    return xla_bridge.backends_are_initialized()
