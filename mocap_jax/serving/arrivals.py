"""Request arrivals: Poisson, fixed interval, all at once (offline), or a trace."""

from __future__ import annotations

import numpy as np

from ..specs import LIMITS, SpecError, checks

ARRIVALS = ("poisson", "fixed", "offline", "trace")


def arrival_times(kind: str, rate: float | None, count: int, seed: int = 0, trace=None) -> np.ndarray:
    """``[count]`` sorted arrival times in seconds.

    Args:
      kind: ``poisson`` (rate ``rate`` per second), ``fixed`` (every ``1 / rate`` s), ``offline`` (all
        at 0) or ``trace`` (the first ``count`` times of ``trace``, shifted to start at 0 and, if
        ``rate`` is given, rescaled to that mean rate).
      rate: requests per second.
      count: requests.
      seed: Poisson seed.
    """
    checks.choice("arrival process", kind, ARRIVALS)
    count = checks.integer("requests", count, 1, LIMITS["requests"])
    if kind in ("poisson", "fixed") or (kind == "trace" and rate is not None):
        rate = checks.load("load", rate)
    if kind == "offline":
        return np.zeros(count)
    if kind == "fixed":
        return np.arange(count) / rate
    if kind == "poisson":
        return np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, count))
    t = np.sort(np.asarray(trace, dtype=np.float64))[:count]
    if len(t) < count:
        raise SpecError(f"the trace has {len(t)} requests, fewer than the {count} asked for")
    if not np.all(np.isfinite(t)):
        raise SpecError("the trace holds non-finite arrival times")
    t = t - t[0]
    if rate is not None:
        span = t[-1] if t[-1] > 0 else 1.0
        t = t * ((count - 1) / span) / rate
    return t
