"""Process-wide settings for a process that traces and compiles many JAX programs.

Tracing a program allocates hundreds of thousands of short-lived Python objects (tracers, equations,
abstract values, lowering contexts), almost all freed by their reference counts.  At Python's default
first-generation threshold (700 allocations) the cyclic garbage collector still runs thousands of times
during one compile, each pass walking the young objects that tracing keeps alive for a while; on the
project's benchmarks and tests that was 3-8% of the wall time (docs/performance.md, "Compilation").
A threshold of 50,000 allocations keeps the collector's passes for the cycles that need them; the
objects it lets wait are a few megabytes at most.

The command line sets this for its own process; research code that imports the package keeps its
own collector settings unless it calls :func:`collect_garbage_less_often` itself.
"""

from __future__ import annotations

import gc

#: allocations (minus deallocations) between first-generation collections, against Python's 700
FIRST_GENERATION_THRESHOLD = 50_000


def collect_garbage_less_often() -> None:
    """Raise the first generation's threshold of the cyclic garbage collector to
    :data:`FIRST_GENERATION_THRESHOLD`, keeping the older generations' thresholds."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(FIRST_GENERATION_THRESHOLD, older, oldest)


__all__ = ["FIRST_GENERATION_THRESHOLD", "collect_garbage_less_often"]
