"""The one validation layer at the boundary: types, finiteness, ranges and representable limits.

Every entry point -- spec files, the Python API, the command line, sweep files and trace
loaders -- checks its inputs with these functions before anything is traced, so a bad value
gets one :class:`SpecError` (a ``ValueError``) that names the value, says what was expected
and how to fix it.  The rules:

* counts are integers (``bool`` is not a number, ``4096.0`` is accepted as 4096, ``4096.5``
  and ``"4096"`` are not);
* numbers are real and finite (NaN and inf are refused), ``bool`` and strings are not numbers;
* flags are ``bool`` (``"no"`` and ``1`` are not flags);
* every quantity has a documented range (:data:`LIMITS`) inside which the kernels represent it
  exactly enough: per-request token counts and prefix sums stay in int32 and within float32's
  exact integers where they are compared, and every product of counts (request-tokens, bytes,
  FLOPs) is formed in floating point, where the ranges below keep it far from overflow.
"""

from __future__ import annotations

import difflib
import math
import numbers
from typing import Any, Iterable, Sequence


class SpecError(ValueError):
    """Bad user input: a value, spec, preset name or file (a ``ValueError``)."""


#: Largest values the simulator accepts (inclusive), with the reason for each bound.
LIMITS = {
    # prompt tokens per request: prefix sums of chunk sizes are int32 on the device and
    # float32 holds every integer up to 2^24 exactly; 2^27 tokens keeps chunk boundaries
    # (multiples of the granularity) exact to 1/8 token in float32 costs
    "seq_len": 2 ** 27,
    # requests per batch: request-tokens (batch x chunk) are formed in float, 2^20 x 2^27 < 2^53
    "batch": 2 ** 20,
    # chunks per request and items per batch: arrays are padded to a power of two per bucket
    "chunks": 4096,
    # consecutive batches simulated in one timeline
    "num_batches": 256,
    # requests in a serving simulation (one array slot each)
    "requests": 2 ** 20,
    # configurations of a check against the event-driven reference: it runs each one in Python,
    # milliseconds apiece (about 7 ms on a 2-core CPU), so this bound is about two hours
    "reference_configs": 2 ** 20,
    # timed repetitions of a benchmark, each a full run of it
    "repeats": 1000,
    # annealing chains of one search: each is an array row of every step's evaluations (about
    # 5 KB in the MBKR objective, so about 5 GB at this bound)
    "chains": 2 ** 20,
    # annealing steps count a 32-bit loop counter
    "steps": 2 ** 31 - 1,
    # random seeds (NumPy generators and JAX keys take them alike)
    "seed": 2 ** 31 - 1,
    # dies on a mesh (placement and routing tables are [dies, dies])
    "dies": 4096,
    # model dimensions (parameter counts are formed in float64 on the host)
    "model_dim": 2 ** 24,
    "layers": 4096,
    # hardware magnitudes: FLOP/s, bytes, bytes/s; products with the counts above stay
    # below float32's 3.4e38
    "hardware_magnitude": 1e20,
    # smallest hardware magnitude (one FLOP/s, byte or byte/s) and efficiency (the calibration's
    # fitting floor): times are work / (magnitude x efficiency), so slower hardware overflows
    # float32 times on ordinary work
    "hardware_minimum": 1.0,
    "efficiency_minimum": 1e-4,
    # seconds of a fixed per-hop or per-layer latency
    "latency_s": 1.0,
    # request rates, requests/s: at the smallest, the largest trace (2^20 requests) spans about
    # 1e18 s; slower arrivals are not representable as times
    "load_min": 1e-12,
    "load": 1e12,
}


def float_dtype(dtype):
    """float32 or float64 (the latter needs 64-bit JAX): the simulators' only float types (float16 and
    bfloat16 cannot hold their times and byte counts)."""
    import jax
    import numpy as np

    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise SpecError(f"dtype must be 'float32' or 'float64', got {dtype!r}") from None
    if dt not in (np.float32, np.float64):
        raise SpecError(f"dtype must be 'float32' or 'float64', got {dtype!r}")
    if dt == np.float64 and not jax.config.jax_enable_x64:
        raise SpecError("dtype float64 needs 64-bit JAX: set JAX_ENABLE_X64=1 or "
                        "jax.config.update('jax_enable_x64', True) before simulating")
    return dt


def suggest(word: str, choices: Iterable[str], cutoff: float = 0.6) -> str:
    """`` Did you mean 'x'?`` for the closest choice, or an empty string."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=3, cutoff=cutoff)
    return f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""


def _is_integer(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_real(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def integer(name: str, v: Any, lo: int = 1, hi: int | None = None, hint: str = "", *, above: str = "") -> int:
    """``v`` as an ``int`` in ``[lo, hi]``; integral floats (``4096.0``) are accepted.

    ``hint`` ends every message; ``above`` ends only the message for a value over ``hi`` (advice
    such as "use fewer chains" that would mislead for a value that is too small).
    """
    if _is_real(v) and not _is_integer(v):
        f = float(v)
        if not math.isfinite(f) or not f.is_integer():
            raise SpecError(f"{name} must be an integer, got {v!r}.{hint}")
        if abs(f) > 2 ** 62:
            raise SpecError(f"{name} = {v!r} is too large: the largest accepted value is {hi}.{hint}{above}")
        v = int(f)
    if not _is_integer(v):
        raise SpecError(f"{name} must be an integer, got {type(v).__name__} {v!r}.{hint}")
    v = int(v)
    if v < lo:
        what = "a positive integer" if lo == 1 else f"an integer >= {lo}"
        raise SpecError(f"{name} must be {what}, got {v}.{hint}")
    if hi is not None and v > hi:
        raise SpecError(f"{name} = {v} exceeds the largest value accepted, {hi:,}.{hint}{above}")
    return v


def number(name: str, v: Any, lo: float | None = None, hi: float | None = None, *, lo_open: bool = False,
           hint: str = "") -> float:
    """``v`` as a finite ``float`` in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``)."""
    if not _is_real(v):
        raise SpecError(f"{name} must be a number, got {type(v).__name__} {v!r}.{hint}")
    try:
        f = float(v)
    except OverflowError:
        raise SpecError(f"{name} = {v!r} is too large to represent.{hint}") from None
    if not math.isfinite(f):
        raise SpecError(f"{name} must be a finite number, got {v!r}.{hint}")
    if lo is not None and (f <= lo if lo_open else f < lo):
        raise SpecError(f"{name} must be {'>' if lo_open else '>='} {lo:g}, got {v!r}.{hint}")
    if hi is not None and f > hi:
        raise SpecError(f"{name} = {v!r} exceeds the largest accepted value, {hi:g}.{hint}")
    return f


def positive(name: str, v: Any, hi: float = LIMITS["hardware_magnitude"], hint: str = "",
             lo: float | None = None) -> float:
    """A finite number in ``(0, hi]`` and at least ``lo`` (default ``1 / hi``, so that its reciprocal stays finite)."""
    f = number(name, v, 0.0, hi, lo_open=True, hint=hint)
    lo = 1.0 / hi if lo is None else lo
    if f < lo:
        raise SpecError(f"{name} = {v!r} is below the smallest accepted value, {lo:g}.{hint}")
    return f


def load(name: str, v: Any) -> float:
    """A request rate, requests/s, in ``[LIMITS["load_min"], LIMITS["load"]]``."""
    lo, hi = LIMITS["load_min"], LIMITS["load"]
    return positive(name, v, hi, lo=lo, hint=f" Pass a request rate in requests/s, from {lo:g} (slower arrivals are "
                                             f"not representable as times) to {hi:g}.")


def fraction(name: str, v: Any, *, open_low: bool = False, hint: str = "") -> float:
    """A number in ``[0, 1]`` (``(0, 1]`` with ``open_low``)."""
    return number(name, v, 0.0, 1.0, lo_open=open_low, hint=hint)


def flag(name: str, v: Any) -> bool:
    """A ``bool`` (strings such as ``"no"`` and numbers such as ``1`` are refused)."""
    if not isinstance(v, bool):
        raise SpecError(f"{name} must be true or false, got {type(v).__name__} {v!r}")
    return v


def choice(name: str, v: Any, choices: Sequence[str]) -> str:
    """One of ``choices`` (strings), with a suggestion for a near miss."""
    if not isinstance(v, str) or v not in choices:
        raise SpecError(f"unknown {name} {v!r}; choose one of {', '.join(choices)}.{suggest(str(v), choices)}")
    return v


def text(name: str, v: Any) -> str:
    """A non-empty string."""
    if not isinstance(v, str) or not v:
        raise SpecError(f"{name} must be a non-empty string, got {v!r}")
    return v


def integers(name: str, values: Any, lo: int = 1, hi: int | None = None):
    """An array of integers in ``[lo, hi]`` (NumPy ``int64``); integral floats are accepted."""
    import numpy as np

    try:
        arr = np.asarray(values)
    except (ValueError, TypeError, OverflowError):
        raise SpecError(f"{name} must be an array of integers, got {values!r}") from None
    if arr.dtype == bool or arr.dtype == object or arr.dtype.kind in "USV":
        raise SpecError(f"{name} must hold integers, got {arr.dtype} values")
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
            raise SpecError(f"{name} must hold integers, got non-integral values")
        if arr.size and np.max(np.abs(arr)) > 2.0 ** 62:
            raise SpecError(f"{name} holds values too large to represent (largest accepted: {hi})")
    elif arr.dtype.kind not in "iu":
        raise SpecError(f"{name} must hold integers, got {arr.dtype} values")
    if arr.dtype.kind == "u" and arr.size and int(arr.max()) > 2 ** 62:
        raise SpecError(f"{name} holds values too large to represent (largest accepted: {hi})")
    arr = arr.astype(np.int64)
    if arr.size and int(arr.min()) < lo:
        raise SpecError(f"{name} must hold integers >= {lo}, got {int(arr.min())}")
    if hi is not None and arr.size and int(arr.max()) > hi:
        raise SpecError(f"{name} holds {int(arr.max()):,}, above the largest value accepted, {hi:,}")
    return arr
