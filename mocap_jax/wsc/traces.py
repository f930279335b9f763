"""Request traces: the Azure LLM inference trace format, rate scaling, trace-derived workloads.

A *trace* is a list of requests (arrival time, prompt and output length), the input of the
serving simulation.  Real traces come from Azure-format CSV files (:func:`load_azure_trace`);
:func:`workload_from_trace` summarises one into a :class:`~mocap_jax.wsc.workload.WorkloadSpec`
and :func:`get_workload` resolves a preset name or a trace path.  Synthetic traces are in
:mod:`mocap_jax.wsc.synthetic`.
"""

from __future__ import annotations

import csv
import difflib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..specs import SpecError, checks
from .workload import (DEFAULT_OUTPUT_CUTS, DEFAULT_PROMPT_BINS, WORKLOAD_PRESETS, WorkloadSpec,
                       summarise_lengths)

AZURE_COLUMNS = ("arrival_timestamp", "prompt_size", "token_size")


@dataclass(frozen=True, eq=False)
class Trace:
    """Requests sorted by arrival (stable: requests sharing a time keep their order).

    Attributes:
      name: source name (preset or file stem).
      arrival_s: ``[N]`` float64 arrival times, seconds (the first request at or after 0).
      prompt_tokens: ``[N]`` int64 prompt lengths, tokens (>= 1).
      output_tokens: ``[N]`` int64 output lengths, tokens (>= 1; the first comes from the prefill).
    """

    name: str
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray

    def __post_init__(self):
        a = np.asarray(self.arrival_s, dtype=np.float64)
        p = np.asarray(self.prompt_tokens)
        o = np.asarray(self.output_tokens)
        if a.ndim != 1 or a.size == 0 or p.shape != a.shape or o.shape != a.shape:
            raise SpecError(f"trace {self.name!r}: arrival_s, prompt_tokens and output_tokens need the same "
                            f"non-zero length, got {a.shape}, {p.shape}, {o.shape}")
        if not np.all(np.isfinite(a)) or np.any(a < 0):
            raise SpecError(f"trace {self.name!r}: arrival times must be finite and >= 0 seconds")
        for label, x in (("prompt_tokens", p), ("output_tokens", o)):
            if not np.all(np.isfinite(x)) or np.any(x < 1) or np.any(np.asarray(x, float) != np.rint(x)):
                raise SpecError(f"trace {self.name!r}: {label} must be whole numbers >= 1")
        order = np.argsort(a, kind="stable")
        object.__setattr__(self, "arrival_s", a[order])
        object.__setattr__(self, "prompt_tokens", np.asarray(p, np.int64)[order])
        object.__setattr__(self, "output_tokens", np.asarray(o, np.int64)[order])

    def __len__(self) -> int:
        return int(self.arrival_s.size)

    @property
    def span_s(self) -> float:
        """Last minus first arrival, seconds."""
        return float(self.arrival_s[-1] - self.arrival_s[0])

    @property
    def rate(self) -> float:
        """Mean arrival rate ``N / span``, requests/s (inf when every request arrives at once)."""
        return len(self) / self.span_s if self.span_s > 0 else math.inf

    def with_rate(self, rate: float) -> "Trace":
        """The same requests with inter-arrival times rescaled so that :attr:`rate` is ``rate`` req/s."""
        checks.load("rate", rate)
        if not self.span_s > 0:
            raise SpecError(f"trace {self.name!r}: every request arrives at the same time; its rate cannot be scaled")
        a0 = self.arrival_s[0]
        scaled = a0 + (self.arrival_s - a0) * (self.rate / float(rate))
        return Trace(self.name, scaled, self.prompt_tokens, self.output_tokens)

    def head(self, n: int) -> "Trace":
        """The first ``n`` requests (all if ``n`` is larger)."""
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
            raise SpecError(f"the number of requests must be a positive integer, got {n!r}")
        return Trace(self.name, self.arrival_s[:n], self.prompt_tokens[:n], self.output_tokens[:n])

    def shifted(self) -> "Trace":
        """The same trace with the first arrival at t = 0."""
        return Trace(self.name, self.arrival_s - self.arrival_s[0], self.prompt_tokens, self.output_tokens)

    def to_workload(self, prompt_bins: int = DEFAULT_PROMPT_BINS,
                    output_cuts: tuple[float, ...] = DEFAULT_OUTPUT_CUTS) -> WorkloadSpec:
        """The workload summary (rate + representative points) of this trace."""
        pts = summarise_lengths(self.prompt_tokens, self.output_tokens, prompt_bins, output_cuts)
        rate = self.rate if math.isfinite(self.rate) else 1.0
        return WorkloadSpec(self.name, rate, *pts)

    def summary(self) -> dict[str, Any]:
        p, o = self.prompt_tokens, self.output_tokens
        return {"name": self.name, "requests": len(self), "span_s": self.span_s, "rate_rps": self.rate,
                "prompt_mean": float(p.mean()), "prompt_median": float(np.median(p)), "prompt_max": int(p.max()),
                "output_mean": float(o.mean()), "output_median": float(np.median(o)), "output_max": int(o.max()),
                "shared_timestamps": int(np.sum(np.diff(self.arrival_s) == 0))}


def parse_timestamp(stamp: str) -> float:
    """Seconds from an Azure ``arrival_timestamp``.

    Accepts ``MM:SS.s`` (minutes and seconds within the hour, as in the circulated copies),
    ``HH:MM:SS.s``, plain seconds, or an ISO date-time (``2023-11-16 18:15:46.6543``, the
    originals; returned as seconds since the epoch, naive times read as UTC).

    Raises:
      ValueError: anything else (the message quotes the stamp).
    """
    s = stamp.strip()
    if not s:
        raise ValueError("empty arrival_timestamp")
    if "-" in s[1:] and (" " in s or "T" in s):
        from datetime import datetime, timezone

        try:
            dt = datetime.fromisoformat(s)
        except ValueError:
            raise ValueError(f"bad arrival_timestamp {stamp!r} (not an ISO date-time)") from None
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=timezone.utc)
        return dt.timestamp()
    parts = s.split(":")
    if len(parts) > 3:
        raise ValueError(f"bad arrival_timestamp {stamp!r} (expected MM:SS.s, HH:MM:SS.s or seconds)")
    try:
        nums = [float(x) for x in parts]
    except ValueError:
        raise ValueError(f"bad arrival_timestamp {stamp!r} (expected MM:SS.s, HH:MM:SS.s or seconds)") from None
    if any(not math.isfinite(x) or x < 0 for x in nums):
        raise ValueError(f"bad arrival_timestamp {stamp!r} (fields must be non-negative numbers)")
    if len(nums) > 1 and (nums[-1] >= 60 or any(x != int(x) for x in nums[:-1])
                          or (len(nums) == 3 and nums[1] >= 60)):
        raise ValueError(f"bad arrival_timestamp {stamp!r} (minutes and seconds must be < 60, "
                         f"hours and minutes whole)")
    total = 0.0
    for x in nums:
        total = total * 60 + x
    return total


def _whole(text: str, column: str, minimum: int) -> int:
    t = text.strip()
    try:
        v = float(t)
    except ValueError:
        raise ValueError(f"{column} {text!r} is not a number") from None
    if not math.isfinite(v) or v != int(v):
        raise ValueError(f"{column} {text!r} is not a whole number of tokens")
    if v < minimum:
        raise ValueError(f"{column} {text!r} must be >= {minimum}")
    return int(v)


def load_azure_trace(path: "str | Path", name: str | None = None) -> Trace:
    """Read an Azure LLM inference trace CSV (``arrival_timestamp,prompt_size,token_size,...``).

    Handles the quirks of the circulated copies: a UTF-8 byte-order mark, CRLF line ends,
    ``MM:SS.s`` timestamps (see :func:`parse_timestamp`), several requests per timestamp.
    Extra columns are ignored; blank lines are skipped; times are made relative to the
    earliest request; rows out of order are sorted stably.  ``token_size`` 0 is read as
    one output token (the prefill always emits the first token).

    Args:
      path: the CSV file.
      name: trace name (default: the file stem).

    Returns:
      The :class:`Trace`.

    Raises:
      SpecError (a ValueError): unreadable file, missing columns, or a malformed row (the
        message names the file and its line number).
    """
    path = Path(path)
    label = str(path)
    try:
        fh = path.open(encoding="utf-8-sig", newline="")
    except OSError as e:
        raise SpecError(f"cannot read trace {label!r}: {e.strerror or e}") from None
    times: list[float] = []
    prompts: list[int] = []
    outputs: list[int] = []
    with fh:
        reader = csv.reader(fh)
        try:
            header = next(reader)
        except StopIteration:
            raise SpecError(f"trace {label!r} is empty; expected a header line with columns "
                            f"{', '.join(AZURE_COLUMNS)}") from None
        except (UnicodeDecodeError, csv.Error) as e:
            raise SpecError(f"{label}:1: cannot parse the header ({e})") from None
        cols = [h.strip().lower() for h in header]
        missing = [c for c in AZURE_COLUMNS if c not in cols]
        if missing:
            raise SpecError(f"{label}:1: the header lacks column(s) {', '.join(missing)}; an Azure LLM inference "
                            f"trace has {', '.join(AZURE_COLUMNS)}, ... (got {', '.join(cols) or 'nothing'})")
        it, ip, io = (cols.index(c) for c in AZURE_COLUMNS)
        width = len(cols)
        try:
            for row in reader:
                line = reader.line_num
                if not row or all(not x.strip() for x in row):
                    continue
                if len(row) != width:
                    raise SpecError(f"{label}:{line}: expected {width} comma-separated fields, got {len(row)} "
                                    f"({','.join(row)!r})")
                try:
                    t = parse_timestamp(row[it])
                    p = _whole(row[ip], "prompt_size", 1)
                    o = _whole(row[io], "token_size", 0)
                except ValueError as e:
                    raise SpecError(f"{label}:{line}: {e}") from None
                times.append(t)
                prompts.append(p)
                outputs.append(max(o, 1))
        except (UnicodeDecodeError, csv.Error) as e:
            raise SpecError(f"{label}:{reader.line_num}: cannot parse the row ({e})") from None
    if not times:
        raise SpecError(f"trace {label!r} has a header but no requests")
    a = np.asarray(times, dtype=np.float64)
    return Trace(name or path.stem, a - a.min(), np.asarray(prompts, np.int64), np.asarray(outputs, np.int64))


def workload_from_trace(path: "str | Path", prompt_bins: int = DEFAULT_PROMPT_BINS,
                        output_cuts: tuple[float, ...] = DEFAULT_OUTPUT_CUTS, name: str | None = None) -> WorkloadSpec:
    """Summarise an Azure-format trace CSV (``arrival_timestamp,prompt_size,token_size,...``).

    Read with :func:`load_azure_trace` (``MM:SS.s``, ``HH:MM:SS.s``, seconds or ISO
    timestamps; byte-order mark; CRLF); the rate is requests / (last - first arrival).
    """
    path = Path(path)
    tr = load_azure_trace(path, name)  # malformed rows: SpecError naming the file and line
    if len(tr) < 2 or not tr.span_s > 0:
        raise SpecError(f"trace {str(path)!r}: need at least two distinct arrival times to estimate a rate")
    pts = summarise_lengths(tr.prompt_tokens, tr.output_tokens, prompt_bins, output_cuts)
    return WorkloadSpec(name or path.stem, tr.rate, *pts)


def get_workload(name_or_spec: "str | Path | WorkloadSpec", rate: float | None = None) -> WorkloadSpec:
    """Resolve a preset name or a trace CSV path (optionally overriding the rate, requests/s)."""
    if isinstance(name_or_spec, WorkloadSpec):
        w = name_or_spec
    else:
        key = str(name_or_spec).lower()
        if key in WORKLOAD_PRESETS:
            w = WORKLOAD_PRESETS[key]
        elif str(name_or_spec).lower().endswith(".csv"):
            w = workload_from_trace(name_or_spec)
        else:
            close = difflib.get_close_matches(key, list(WORKLOAD_PRESETS), n=3, cutoff=0.4)
            hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise SpecError(f"unknown workload {str(name_or_spec)!r}.{hint} Presets: {sorted(WORKLOAD_PRESETS)}, "
                            f"or pass an Azure-format trace .csv path.")
    if rate is not None:
        checks.load("rate", rate)
        w = w.with_rate(rate)
    return w


__all__ = ["Trace", "AZURE_COLUMNS", "parse_timestamp", "load_azure_trace", "workload_from_trace", "get_workload"]
