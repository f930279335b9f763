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

        ``arrival_timestamp`` may be seconds, ``MM:SS.s`` or ``HH:MM:SS.s``; the rate is
        requests / (last - first arrival).  A UTF-8 byte-order mark is accepted.
        """
        path = Path(path)
        try:
            with path.open(encoding="utf-8-sig", newline="") as fh:
                rows = list(csv.DictReader(fh))
        except OSError as e:
            raise SpecError(f"cannot read trace {str(path)!r}: {e.strerror}") from None
        need = {"arrival_timestamp", "prompt_size", "token_size"}
        if not rows or not need <= set(rows[0]):
            raise SpecError(f"trace {str(path)!r}: need a header with columns {sorted(need)} and at least one row")
        try:
            t = np.asarray([_seconds(r["arrival_timestamp"]) for r in rows])
            p = np.asarray([float(r["prompt_size"]) for r in rows])
            o = np.asarray([float(r["token_size"]) for r in rows])
        except ValueError as e:
            raise SpecError(f"trace {str(path)!r}: {e}") from None
        span = float(t.max() - t.min())
        if len(rows) < 2 or span <= 0:
            raise SpecError(f"trace {str(path)!r}: need at least two distinct arrival times to estimate a rate")
        pts = summarise_lengths(p, np.maximum(o, 1), prompt_bins, output_cuts)
        return WorkloadSpec(name or path.stem, len(rows) / span, *pts)


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


__all__ = ["WorkloadSpec", "WorkloadParams", "WORKLOAD_PRESETS", "get_workload", "summarise_lengths"]
