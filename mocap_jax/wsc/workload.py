"""Serving workload summaries for WSC-LLM (DESIGN §10).

A workload is a request rate plus a small weighted set of representative
``(prompt tokens, output tokens)`` points that summarise the joint length
distribution.  The points come from a two-level equal-count binning of a trace:
requests sorted by prompt length are cut into ``prompt_bins`` groups, each group
sorted by output length is cut at the output quantiles ``output_cuts``; a point is
the mean (prompt, output) of one cell and its weight the cell's share of requests.
Moments such as ``E[S]``, ``E[S^2]`` or ``E[O * S]`` are then weighted sums over the
points, which is what the instance performance models need.

The embedded presets (``azure-code``, ``azure-conv``) are such summaries of the Azure
LLM inference traces (2023) computed by :meth:`WorkloadSpec.from_trace` with the
default binning; the traces themselves are not shipped (pass a path to re-derive).
"""

from __future__ import annotations

import csv
import dataclasses
import difflib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..specs import SpecError

Array = Any

DEFAULT_PROMPT_BINS = 8
DEFAULT_OUTPUT_CUTS = (0.25, 0.5, 0.75, 0.95, 0.99)


@dataclass(frozen=True)
class WorkloadSpec:
    """Request rate and representative (prompt, output) length points.

    Attributes:
      name: preset or trace name.
      rate: mean request arrival rate, requests/s (Poisson by default).
      prompt_tokens: ``[K]`` prompt length of each point, tokens.
      output_tokens: ``[K]`` output length of each point, tokens (>= 1).
      weights: ``[K]`` share of requests at each point (normalised to sum 1).
    """

    name: str
    rate: float
    prompt_tokens: tuple[float, ...]
    output_tokens: tuple[float, ...]
    weights: tuple[float, ...]

    def __post_init__(self):
        if not isinstance(self.rate, (int, float)) or isinstance(self.rate, bool) or not self.rate > 0 \
                or not math.isfinite(self.rate):
            raise SpecError(f"workload {self.name!r}: rate must be a positive number of requests/s, got {self.rate!r}")
        k = len(self.prompt_tokens)
        if k == 0 or len(self.output_tokens) != k or len(self.weights) != k:
            raise SpecError(f"workload {self.name!r}: prompt_tokens, output_tokens and weights need the same "
                            f"non-zero length, got {k}, {len(self.output_tokens)}, {len(self.weights)}")
        p, o, w = (np.asarray(x, dtype=float) for x in (self.prompt_tokens, self.output_tokens, self.weights))
        if not (np.all(np.isfinite(p)) and np.all(p >= 1)):
            raise SpecError(f"workload {self.name!r}: prompt lengths must be >= 1 token")
        if not (np.all(np.isfinite(o)) and np.all(o >= 1)):
            raise SpecError(f"workload {self.name!r}: output lengths must be >= 1 token")
        if not (np.all(np.isfinite(w)) and np.all(w >= 0) and w.sum() > 0):
            raise SpecError(f"workload {self.name!r}: weights must be non-negative with a positive sum")
        object.__setattr__(self, "weights", tuple(float(x) for x in w / w.sum()))

    # ---- moments
    def _arrays(self):
        return (np.asarray(self.prompt_tokens, float), np.asarray(self.output_tokens, float),
                np.asarray(self.weights, float))

    @property
    def mean_prompt(self) -> float:
        p, _, w = self._arrays()
        return float((p * w).sum())

    @property
    def mean_output(self) -> float:
        _, o, w = self._arrays()
        return float((o * w).sum())

    @property
    def max_prompt(self) -> float:
        return float(max(self.prompt_tokens))

    def with_rate(self, rate: float) -> "WorkloadSpec":
        return dataclasses.replace(self, rate=float(rate))

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "rate_rps": self.rate, "points": len(self.weights),
                "mean_prompt": self.mean_prompt, "mean_output": self.mean_output, "max_prompt_point": self.max_prompt}

    def sample(self, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``n`` synthetic requests: Poisson arrivals at ``rate`` and lengths drawn from the points.

        Returns:
          (arrival_s ``[n]``, prompt_tokens ``[n]`` int, output_tokens ``[n]`` int).
        """
        rng = np.random.default_rng(seed)
        arrivals = np.cumsum(rng.exponential(1.0 / self.rate, size=n))
        idx = rng.choice(len(self.weights), size=n, p=np.asarray(self.weights))
        p, o, _ = self._arrays()
        return arrivals, np.maximum(1, np.rint(p[idx])).astype(np.int64), np.maximum(1, np.rint(o[idx])).astype(np.int64)

    @staticmethod
    def from_trace(path: "str | Path", prompt_bins: int = DEFAULT_PROMPT_BINS,
                   output_cuts: tuple[float, ...] = DEFAULT_OUTPUT_CUTS, name: str | None = None) -> "WorkloadSpec":
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


def _seconds(stamp: str) -> float:
    parts = stamp.strip().split(":")
    if not 1 <= len(parts) <= 3:
        raise ValueError(f"bad arrival_timestamp {stamp!r}")
    total = 0.0
    for x in parts:
        total = total * 60 + float(x)
    return total


def summarise_lengths(prompt, output, prompt_bins: int = DEFAULT_PROMPT_BINS,
                      output_cuts: tuple[float, ...] = DEFAULT_OUTPUT_CUTS):
    """Two-level equal-count binning of (prompt, output) pairs into weighted representative points.

    Returns:
      (prompt_tokens, output_tokens, weights): tuples of floats, one entry per non-empty cell.
    """
    prompt, output = np.asarray(prompt, float), np.asarray(output, float)
    if prompt.shape != output.shape or prompt.size == 0:
        raise SpecError("summarise_lengths: prompt and output need the same non-zero length")
    if prompt_bins < 1 or any(not 0 < c < 1 for c in output_cuts) or list(output_cuts) != sorted(output_cuts):
        raise SpecError("summarise_lengths: prompt_bins >= 1 and increasing output_cuts inside (0, 1)")
    n = prompt.size
    ps, os_, ws = [], [], []
    for group in np.array_split(np.argsort(prompt, kind="stable"), prompt_bins):
        if group.size == 0:
            continue
        group = group[np.argsort(output[group], kind="stable")]
        cuts = [int(round(c * group.size)) for c in output_cuts]
        for cell in np.split(group, cuts):
            if cell.size:
                ps.append(round(float(prompt[cell].mean()), 1))
                os_.append(round(float(output[cell].mean()), 1))
                ws.append(cell.size / n)
    return tuple(ps), tuple(os_), tuple(ws)


# --------------------------------------------------------------------------- presets
# Generated by WorkloadSpec.from_trace(<shared/data/azure-llm-inference-2023/*.csv>) with the
# default binning (8 prompt bins x output cuts 0.25/0.5/0.75/0.95/0.99); tests re-derive them when
# the traces are present.

_AZURE = {
    # name: (rate req/s, [(prompt, output, weight), ...])
    "azure-code": (2.4522, [
        (84.1, 7.3, 0.031296), (101.8, 11.4, 0.031296), (94.2, 16.7, 0.031183), (90.3, 37.1, 0.025060),
        (87.1, 108.9, 0.004989), (94.9, 646.5, 0.001247), (336.6, 7.4, 0.031296), (357.6, 11.5, 0.031296),
        (361.2, 19.5, 0.031183), (366.7, 52.5, 0.025060), (366.3, 163.0, 0.004989), (340.9, 318.5, 0.001247),
        (799.2, 7.1, 0.031296), (822.0, 10.7, 0.031296), (808.9, 17.3, 0.031183), (810.5, 46.5, 0.025060),
        (797.5, 150.5, 0.004989), (820.7, 427.2, 0.001247), (1187.9, 7.3, 0.031296), (1236.6, 10.6, 0.031183),
        (1206.7, 16.4, 0.031183), (1225.0, 37.2, 0.025060), (1269.7, 110.5, 0.004989), (1260.9, 293.5, 0.001247),
        (1720.6, 7.3, 0.031296), (1761.0, 10.7, 0.031183), (1761.7, 18.5, 0.031183), (1731.1, 51.1, 0.025060),
        (1764.6, 158.1, 0.004989), (1793.6, 497.3, 0.001247), (2358.1, 6.9, 0.031296), (2355.9, 10.4, 0.031183),
        (2382.9, 15.4, 0.031183), (2413.5, 37.9, 0.025060), (2395.0, 118.4, 0.004989), (2395.0, 479.7, 0.001247),
        (3372.2, 7.1, 0.031296), (3456.7, 10.2, 0.031183), (3415.6, 16.4, 0.031183), (3418.2, 46.6, 0.025060),
        (3526.9, 186.0, 0.004989), (3288.5, 648.8, 0.001247), (6263.8, 7.3, 0.031296), (6369.2, 11.1, 0.031183),
        (6485.8, 17.4, 0.031183), (6390.4, 45.0, 0.025060), (6295.9, 128.9, 0.004989), (6305.0, 381.0, 0.001247),
    ]),
    "azure-conv": (5.3799, [
        (164.2, 64.4, 0.031242), (141.8, 133.5, 0.031242), (180.1, 171.5, 0.031294), (181.6, 208.7, 0.024994),
        (173.0, 234.3, 0.005009), (181.0, 501.5, 0.001239), (338.1, 38.7, 0.031242), (374.7, 73.1, 0.031242),
        (383.5, 89.1, 0.031294), (380.5, 106.8, 0.024994), (373.3, 138.4, 0.005009), (372.4, 202.1, 0.001239),
        (406.9, 82.5, 0.031242), (407.2, 94.6, 0.031242), (407.3, 105.5, 0.031294), (406.4, 130.7, 0.024994),
        (407.6, 162.1, 0.005009), (411.2, 193.0, 0.001239), (710.9, 75.6, 0.031242), (770.4, 197.2, 0.031242),
        (983.3, 397.7, 0.031294), (983.7, 429.4, 0.024994), (982.9, 541.9, 0.005009), (957.7, 650.1, 0.001239),
        (1050.8, 334.9, 0.031242), (1051.1, 398.6, 0.031242), (1051.9, 416.2, 0.031294), (1053.9, 461.9, 0.024994),
        (1050.2, 598.9, 0.005009), (1057.2, 897.0, 0.001239), (1126.5, 298.4, 0.031242), (1125.2, 397.8, 0.031242),
        (1124.4, 416.2, 0.031242), (1123.2, 467.4, 0.024994), (1127.7, 605.9, 0.005009), (1127.7, 838.2, 0.001239),
        (1699.1, 59.8, 0.031242), (1718.3, 103.9, 0.031242), (1410.8, 168.1, 0.031242), (1268.6, 354.0, 0.024994),
        (1264.6, 472.6, 0.005009), (1255.1, 673.9, 0.001239), (3949.7, 36.7, 0.031242), (3872.7, 53.5, 0.031242),
        (3588.2, 78.8, 0.031242), (3472.5, 123.8, 0.024994), (3599.9, 181.9, 0.005009), (3721.5, 403.6, 0.001239),
    ]),
}


def _preset(name, rate, pts) -> WorkloadSpec:
    return WorkloadSpec(name, rate, tuple(p for p, _, _ in pts), tuple(o for _, o, _ in pts),
                        tuple(w for _, _, w in pts))


WORKLOAD_PRESETS: dict[str, WorkloadSpec] = {n: _preset(n, r, pts) for n, (r, pts) in _AZURE.items()}


def get_workload(name_or_spec: "str | Path | WorkloadSpec", rate: float | None = None) -> WorkloadSpec:
    """Resolve a preset name or a trace CSV path (optionally overriding the rate, requests/s)."""
    if isinstance(name_or_spec, WorkloadSpec):
        w = name_or_spec
    else:
        key = str(name_or_spec).lower()
        if key in WORKLOAD_PRESETS:
            w = WORKLOAD_PRESETS[key]
        elif str(name_or_spec).lower().endswith(".csv"):
            w = WorkloadSpec.from_trace(name_or_spec)
        else:
            close = difflib.get_close_matches(key, list(WORKLOAD_PRESETS), n=3, cutoff=0.4)
            hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise SpecError(f"unknown workload {str(name_or_spec)!r}.{hint} Presets: {sorted(WORKLOAD_PRESETS)}, "
                            f"or pass an Azure-format trace .csv path.")
    if rate is not None:
        if not isinstance(rate, (int, float)) or not rate > 0 or not math.isfinite(rate):
            raise SpecError(f"rate must be a positive number of requests/s, got {rate!r}")
        w = w.with_rate(rate)
    return w


# --------------------------------------------------------------------------- traced numbers


def _pytree(cls):
    cls = dataclass(frozen=True)(cls)
    return jax.tree_util.register_dataclass(cls, data_fields=[f.name for f in dataclasses.fields(cls)], meta_fields=[])


@_pytree
class WorkloadParams:
    """Traced form of a :class:`WorkloadSpec`: ``prompt``, ``output``, ``weight`` are ``[K]``, ``rate`` a scalar."""

    rate: Array
    prompt: Array
    output: Array
    weight: Array

    @staticmethod
    def from_spec(w: WorkloadSpec, dtype=jnp.float32) -> "WorkloadParams":
        return WorkloadParams(rate=np.asarray(w.rate, dtype), prompt=np.asarray(w.prompt_tokens, dtype),
                              output=np.asarray(w.output_tokens, dtype), weight=np.asarray(w.weights, dtype))




# =========================================================================== request traces (part 2)
#
# A *trace* is a list of requests (arrival time, prompt and output length), the input of the
# serving simulation (:mod:`mocap_jax.wsc.serving`).  Real traces come from Azure-format CSV files
# (:func:`load_azure_trace`); the embedded default is synthetic (:func:`synthetic_trace`): Poisson
# arrivals with lengths drawn from distributions fitted to the Azure traces (:class:`LengthFit`).

AZURE_COLUMNS = ("arrival_timestamp", "prompt_size", "token_size")
WORKLOAD_ALIASES = {"code": "azure-code", "conv": "azure-conv", "conversation": "azure-conv",
                    "azure-conversation": "azure-conv"}


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
        _check_rate(rate)
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
        """The part-1 summary (rate + representative points) of this trace."""
        pts = summarise_lengths(self.prompt_tokens, self.output_tokens, prompt_bins, output_cuts)
        rate = self.rate if math.isfinite(self.rate) else 1.0
        return WorkloadSpec(self.name, rate, *pts)

    def summary(self) -> dict[str, Any]:
        p, o = self.prompt_tokens, self.output_tokens
        return {"name": self.name, "requests": len(self), "span_s": self.span_s, "rate_rps": self.rate,
                "prompt_mean": float(p.mean()), "prompt_median": float(np.median(p)), "prompt_max": int(p.max()),
                "output_mean": float(o.mean()), "output_median": float(np.median(o)), "output_max": int(o.max()),
                "shared_timestamps": int(np.sum(np.diff(self.arrival_s) == 0))}


def _check_rate(rate) -> None:
    if not isinstance(rate, (int, float, np.floating, np.integer)) or isinstance(rate, bool) \
            or not math.isfinite(float(rate)) or not float(rate) > 0:
        raise SpecError(f"rate must be a positive number of requests/s, got {rate!r}")


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


# --------------------------------------------------------------------------- fitted length distributions

FIT_PROBS = (0.0, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75,
             0.8, 0.85, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 1.0)
FIT_PROMPT_BINS = 8


@dataclass(frozen=True)
class LengthFit:
    """A fitted joint distribution of (prompt, output) lengths.

    Prompt lengths follow the quantile function ``prompt_q`` (knots at ``probs``,
    interpolated linearly in log-length); given a prompt at quantile level ``u``, the
    output follows the quantile function of prompt bin ``floor(u x bins)``
    (``output_q[bin]``): the requests sorted by prompt are cut into ``bins`` equal-count
    bins, each with its own output quantiles, which keeps their dependence.

    Attributes:
      probs: ``[K]`` quantile levels, increasing from 0 to 1.
      prompt_q: ``[K]`` prompt length at each level, tokens.
      output_q: ``[bins][K]`` output length at each level, per prompt bin, tokens.
    """

    probs: tuple[float, ...]
    prompt_q: tuple[float, ...]
    output_q: tuple[tuple[float, ...], ...]

    def __post_init__(self):
        k = len(self.probs)
        pr = np.asarray(self.probs, float)
        if k < 2 or pr[0] != 0 or pr[-1] != 1 or np.any(np.diff(pr) <= 0):
            raise SpecError("LengthFit: probs must increase from 0 to 1")
        if len(self.prompt_q) != k or not self.output_q or any(len(q) != k for q in self.output_q):
            raise SpecError("LengthFit: prompt_q and every output_q row need one value per prob")
        for q in (self.prompt_q, *self.output_q):
            q = np.asarray(q, float)
            if np.any(q < 1) or np.any(np.diff(q) < 0):
                raise SpecError("LengthFit: quantiles must be >= 1 token and non-decreasing")

    @staticmethod
    def fit(prompt, output, probs: tuple[float, ...] = FIT_PROBS, bins: int = FIT_PROMPT_BINS) -> "LengthFit":
        """Fit to observed lengths (``[N]`` each, N >= bins)."""
        p = np.asarray(prompt, float)
        o = np.asarray(output, float)
        if p.shape != o.shape or p.ndim != 1 or p.size < bins:
            raise SpecError(f"LengthFit.fit: need two equal-length 1-D arrays with at least {bins} requests")
        groups = np.array_split(np.argsort(p, kind="stable"), bins)
        rnd = lambda q: tuple(round(float(x), 1) for x in q)
        return LengthFit(tuple(probs), rnd(np.quantile(p, probs)),
                         tuple(rnd(np.quantile(o[g], probs)) for g in groups))

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``n`` (prompt ``[n]``, output ``[n]``) int64 length pairs."""
        pr = np.asarray(self.probs)
        up, uo = rng.random(n), rng.random(n)
        prompt = np.exp(np.interp(up, pr, np.log(np.asarray(self.prompt_q))))
        bins = len(self.output_q)
        b = np.minimum((up * bins).astype(np.int64), bins - 1)
        logq = np.log(np.asarray(self.output_q))
        output = np.empty(n)
        for k in range(bins):
            m = b == k
            output[m] = np.exp(np.interp(uo[m], pr, logq[k]))
        return (np.maximum(1, np.rint(prompt)).astype(np.int64), np.maximum(1, np.rint(output)).astype(np.int64))

    def moments(self, n: int = 200_000, seed: int = 0) -> dict[str, float]:
        """Monte-Carlo mean prompt / output and E[prompt x output] (tokens)."""
        p, o = self.sample(n, np.random.default_rng(seed))
        return {"mean_prompt": float(p.mean()), "mean_output": float(o.mean()), "mean_prompt_x_output": float((p * o).mean())}


# Generated by LengthFit.fit(<shared/data/azure-llm-inference-2023/*.csv>) with the defaults (27 quantile
# levels, 8 prompt bins); tests re-fit them when the traces are present.
LENGTH_FITS: dict[str, LengthFit] = {
    "azure-code": LengthFit(FIT_PROBS,
        (3, 17, 35, 75, 147, 232, 385.6, 578, 770, 938.6, 1075, 1261.1, 1469, 1690, 1909, 2163.7, 2433, 2744.5, 3192.4, 3920.2, 5187.6, 7303.3, 7436, 7436, 7436, 7437, 7437),
        (
            (6, 6, 6, 6, 7, 8, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 19, 21, 24.6, 32, 47.8, 73, 125.8, 210.9, 395, 1225.8, 1899),
            (6, 6, 6, 6, 7, 8, 9, 9, 10, 11, 12, 13, 14, 16, 17, 20, 24, 28, 34, 47.7, 65.8, 108.9, 196, 252.9, 280.9, 331.6, 592),
            (6, 6, 6, 6, 7, 7, 8, 9, 9, 10, 11, 12, 13, 14, 16, 18, 20, 24, 29, 40, 61, 92.8, 166.9, 263.8, 326.7, 634, 841),
            (6, 6, 6, 6, 7, 7.2, 8, 9, 9, 10, 11, 12, 13, 14, 15, 17, 19, 22, 26, 33, 46, 71.9, 128, 172, 237.9, 314.1, 824),
            (6, 6, 6, 6, 7, 8, 8, 9, 9, 10, 11, 12, 13, 15, 16, 19, 22, 27, 34, 47.7, 64, 98.9, 189.9, 263, 386.5, 811.6, 871),
            (6, 6, 6, 6, 7, 7, 8, 8, 9, 10, 11, 12, 12, 13, 14, 15, 18, 21, 26, 34, 46.9, 76, 144.8, 218.8, 316.2, 827.1, 940),
            (6, 6, 6, 6, 7, 7, 8, 9, 9, 10, 11, 11.4, 12.5, 14, 15, 17, 19, 22.8, 27, 37, 58, 114.9, 217.7, 378.6, 595.4, 890.3, 928),
            (6, 6, 6, 6, 7, 8, 9, 9, 10, 11, 12, 12, 13, 14, 16, 18, 21, 25, 31, 41, 55.9, 91, 139, 202, 306, 539.4, 697),
        )),
    "azure-conv": LengthFit(FIT_PROBS,
        (2, 29, 91, 181, 207, 372, 387, 396, 403, 414, 703, 984, 1020, 1045, 1071, 1097, 1130, 1189, 1315, 1875.4, 2732.8, 4083, 4098, 4142, 4830.2, 6101.6, 7930),
        (
            (11, 12, 12, 16, 65, 80, 93, 105, 116, 129, 138, 152, 161, 162, 167, 175, 181, 186, 202, 217, 217, 217, 247.2, 279.4, 334.6, 1000, 1000),
            (7, 14, 14, 18, 18, 52, 59, 63, 67, 72, 75, 79, 82, 85, 88, 90, 93, 96, 100, 105, 112, 127, 145, 156.6, 172.9, 285.6, 436),
            (25, 64, 71, 79, 83, 86, 88, 90, 92, 94, 95, 97, 99, 101, 104, 107, 110, 115, 122, 130, 140, 150, 169, 181.8, 193.7, 200, 200),
            (10, 36.2, 42.4, 56, 78, 86, 91, 97, 104, 115, 137, 375, 387, 393, 395, 398, 403, 411, 415, 426, 438, 482, 567.4, 603.6, 622, 703.1, 921),
            (33, 56.2, 81, 371, 378, 386, 391, 394, 396, 397, 399, 402, 407, 411, 414, 416, 422, 429, 433, 446, 483, 551, 622.6, 667, 939, 977.7, 1000),
            (28, 45, 54.4, 95, 375, 382, 388, 393, 395, 396, 398, 401, 405, 411, 414, 418, 423, 428, 434, 451, 501, 565, 623.9, 660.6, 904.4, 996.6, 1000),
            (15, 36, 42, 48, 55, 66, 73.8, 82, 89, 97, 107, 121, 134, 145, 158, 174, 192, 210, 261, 396, 407, 428, 501, 593.6, 615.5, 916.7, 954),
            (17, 26.2, 27, 31, 36, 39, 42, 46, 48, 51, 55, 59, 64, 69, 74, 81, 88, 98, 109, 121.2, 138, 158, 195.5, 240.6, 336, 610.5, 757),
        )),
}


def resolve_workload_name(name: str) -> str:
    """Canonical preset name (``code`` -> ``azure-code``, ...).

    Raises:
      SpecError: unknown name (with close matches).
    """
    key = str(name).strip().lower()
    key = WORKLOAD_ALIASES.get(key, key)
    if key in LENGTH_FITS:
        return key
    names = sorted(set(LENGTH_FITS) | set(WORKLOAD_ALIASES))
    close = difflib.get_close_matches(key, names, n=3, cutoff=0.4)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    raise SpecError(f"unknown workload {str(name)!r}.{hint} Presets: {', '.join(sorted(LENGTH_FITS))} "
                    f"(aliases {', '.join(sorted(WORKLOAD_ALIASES))}), or an Azure-format trace .csv path.")


def synthetic_trace(workload: str = "azure-conv", requests: int = 1000, rate: float | None = None,
                    seed: int = 0) -> Trace:
    """The embedded default workload: Poisson arrivals, lengths from the fitted distribution.

    Args:
      workload: preset (``azure-code``, ``azure-conv`` or an alias).
      requests: number of requests N.
      rate: arrival rate, requests/s (default: the Azure trace's rate).
      seed: PRNG seed (the same seed gives the same trace).

    Returns:
      A :class:`Trace` whose first request arrives after one exponential gap.
    """
    name = resolve_workload_name(workload)
    rate = WORKLOAD_PRESETS[name].rate if rate is None else rate
    _check_rate(rate)
    if not isinstance(requests, (int, np.integer)) or isinstance(requests, bool) or requests < 1:
        raise SpecError(f"the number of requests must be a positive integer, got {requests!r}")
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / float(rate), size=int(requests)))
    prompt, output = LENGTH_FITS[name].sample(int(requests), rng)
    return Trace(name, arrivals, prompt, output)


def get_trace(source: "str | Path | Trace", requests: int | None = None, rate: float | None = None,
              seed: int = 0) -> Trace:
    """Resolve a workload to requests.

    Args:
      source: a preset name (synthetic, :func:`synthetic_trace`), an Azure-format ``.csv``
        path (:func:`load_azure_trace`) or a :class:`Trace`.
      requests: keep the first N requests (default: 1000 for a preset, all for a file).
      rate: rescale to this arrival rate, requests/s (default: as generated / as recorded).
      seed: PRNG seed of the synthetic generator.

    Raises:
      SpecError: unknown preset, unreadable or malformed file, non-positive rate or count.
    """
    if rate is not None:
        _check_rate(rate)
    if requests is not None and (not isinstance(requests, (int, np.integer)) or isinstance(requests, bool)
                                 or requests < 1):
        raise SpecError(f"the number of requests must be a positive integer, got {requests!r}")
    if isinstance(source, Trace):
        tr = source
    elif str(source).lower().endswith(".csv"):
        tr = load_azure_trace(source)
    else:
        return synthetic_trace(str(source), 1000 if requests is None else int(requests), rate, seed)
    if requests is not None:
        tr = tr.head(int(requests))
    if rate is not None:
        tr = tr.with_rate(rate)
    return tr


__all__ = ["WorkloadSpec", "WorkloadParams", "WORKLOAD_PRESETS", "get_workload", "summarise_lengths",
           "Trace", "load_azure_trace", "parse_timestamp", "LengthFit", "LENGTH_FITS", "FIT_PROBS",
           "synthetic_trace", "get_trace", "resolve_workload_name", "WORKLOAD_ALIASES"]

