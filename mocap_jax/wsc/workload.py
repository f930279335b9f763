"""Serving workload summaries for WSC-LLM: a request rate and representative length points.

A workload is a request rate plus a small weighted set of representative
``(prompt tokens, output tokens)`` points that summarise the joint length
distribution.  The points come from a two-level equal-count binning of a trace:
requests sorted by prompt length are cut into ``prompt_bins`` groups, each group
sorted by output length is cut at the output quantiles ``output_cuts``; a point is
the mean (prompt, output) of one cell and its weight the cell's share of requests.
Moments such as ``E[S]``, ``E[S^2]`` or ``E[O * S]`` are then weighted sums over the
points, which is what the instance performance models need.

The embedded presets (``azure-code``, ``azure-conv``) are such summaries of the Azure
LLM inference traces (2023) computed by :func:`mocap_jax.wsc.traces.workload_from_trace`
with the default binning; the traces themselves are not shipped.  The ``long-context``
preset summarises the synthetic long-context distribution of
:mod:`mocap_jax.wsc.synthetic`.  :func:`mocap_jax.wsc.traces.get_workload` resolves names
and trace files.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
import numpy as np

from ..costs import pytree
from ..specs import SpecError, checks

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
        checks.load(f"workload {self.name!r}: rate", self.rate)
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
# Generated by mocap_jax.wsc.traces.workload_from_trace(<shared/data/azure-llm-inference-2023/*.csv>) with the
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


#: The synthetic long-context workload: prompts and answers independent and log-uniform over these
#: ranges (tokens), Poisson arrivals at a nominal 1 request/s (the exploration sets rates as multiples
#: of a design's capacity).  Long-document question answering and summarisation with 32K-128K-token
#: contexts and short answers.
LONG_CONTEXT_PROMPT = (32768.0, 131072.0)
LONG_CONTEXT_OUTPUT = (16.0, 512.0)
LONG_CONTEXT_RATE = 1.0


def log_uniform_points(name: str, rate: float, prompt_range: tuple[float, float],
                       output_range: tuple[float, float], prompt_bins: int = DEFAULT_PROMPT_BINS,
                       output_cuts: tuple[float, ...] = DEFAULT_OUTPUT_CUTS) -> WorkloadSpec:
    """The binning of :func:`summarise_lengths` applied to independent log-uniform lengths, exactly.

    A log-uniform length on ``[a, b]`` between quantile levels ``u0 < u1`` has mean
    ``(b/a)^u`` integrated: ``a ((b/a)^u1 - (b/a)^u0) / ((u1 - u0) ln(b/a))``.
    """
    def cell_means(lo, hi, levels):
        r = hi / lo
        return [lo * (r ** u1 - r ** u0) / ((u1 - u0) * math.log(r)) for u0, u1 in zip(levels[:-1], levels[1:])]

    p_levels = [k / prompt_bins for k in range(prompt_bins + 1)]
    o_levels = [0.0, *output_cuts, 1.0]
    p_mean, o_mean = cell_means(*prompt_range, p_levels), cell_means(*output_range, o_levels)
    o_share = [u1 - u0 for u0, u1 in zip(o_levels[:-1], o_levels[1:])]
    ps, os_, ws = [], [], []
    for p in p_mean:
        for o, w in zip(o_mean, o_share):
            ps.append(round(p, 1))
            os_.append(round(o, 1))
            ws.append(w / prompt_bins)
    return WorkloadSpec(name, rate, tuple(ps), tuple(os_), tuple(ws))


#: TTFT SLO of a workload whose prompts make the serving default (2 s) unreachable, seconds.  The
#: long-context SLO is about 3x the time a mean (71K-token) prompt takes alone on a llama3-70b prefill
#: instance of the reference wafer (22 s on 2x2 dies of wsc-llm-64g): SLOs as a small multiple of the
#: single-request latency, as DistServe states them.
WORKLOAD_TTFT_SLOS: dict[str, float] = {"long-context": 60.0}

WORKLOAD_PRESETS: dict[str, WorkloadSpec] = {n: _preset(n, r, pts) for n, (r, pts) in _AZURE.items()}
WORKLOAD_PRESETS["long-context"] = log_uniform_points("long-context", LONG_CONTEXT_RATE, LONG_CONTEXT_PROMPT,
                                                      LONG_CONTEXT_OUTPUT)




@pytree
class WorkloadParams:
    """Traced form of a :class:`WorkloadSpec`."""

    rate: Array     # [] requests/s
    prompt: Array   # [K] prompt tokens of each representative point
    output: Array   # [K] output tokens of each representative point
    weight: Array   # [K] share of requests at each point (sums to 1)

    @staticmethod
    def from_spec(w: WorkloadSpec, dtype=jnp.float32) -> "WorkloadParams":
        return WorkloadParams(rate=np.asarray(w.rate, dtype), prompt=np.asarray(w.prompt_tokens, dtype),
                              output=np.asarray(w.output_tokens, dtype), weight=np.asarray(w.weights, dtype))


__all__ = ["WorkloadSpec", "WorkloadParams", "WORKLOAD_PRESETS", "summarise_lengths", "log_uniform_points",
           "DEFAULT_PROMPT_BINS", "DEFAULT_OUTPUT_CUTS", "LONG_CONTEXT_PROMPT", "LONG_CONTEXT_OUTPUT", "LONG_CONTEXT_RATE",
           "WORKLOAD_TTFT_SLOS"]
