"""Hardware design-space exploration for WSC-LLM serving.

The wafer template trades DRAM per die against D2D bandwidth: a die's shoreline is shared
by its DRAM interface and its die-to-die links.  :func:`template_points` builds the
hardware points -- DRAM capacity per die (32-96 GB) with its bandwidth (by default
1 TB/s per 32 GB, the ratio of the published points 64 GB / 2 TB/s and 96 GB / 3 TB/s),
against D2D bandwidth (1.5-2.5 TB/s), for one or more die grids.

:func:`explore` crosses them with models, workloads and request rates.  Every point gets
the WSC-LLM central scheduler's decisions for its hardware (partition, decode-centred
placement, greedy KV memory scheduler; :func:`mocap_jax.wsc.setup.build_setups`, the
partition's candidates of all hardware points of a grid evaluated in one vmapped call), then
all points are simulated by :func:`mocap_jax.wsc.serving.simulate` as one batched run: one
static shape for every point, one compiled ``jit(vmap(scan))`` program.  Request rates are common to all hardware points of a
(model, workload): ``load x`` the partition capacity of the reference design
(``wsc-llm-64g``), and every hardware point sees the same synthetic trace (common random
numbers).
The best design per workload is chosen by :mod:`mocap_jax.wsc.ranking`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import jax.numpy as jnp

from ..specs import LIMITS, SpecError, checks, files, get_model
from . import serving as sv
from .hardware import WaferSpec, wsc_wafer
from .setup import ServingConfig, build_setup, build_setups
from .synthetic import resolve_workload_name, synthetic_trace
from .ranking import best_designs
from .workload import WORKLOAD_PRESETS, WORKLOAD_TTFT_SLOS

DEFAULT_MODELS = ("llama2-7b", "llama3-70b", "llama3.1-405b")
DEFAULT_WORKLOADS = ("azure-code", "azure-conv")
DEFAULT_LOADS = (0.7, 1.2)
DEFAULT_DRAM_GB = (32.0, 64.0, 96.0)
DEFAULT_D2D_TBPS = (1.5, 2.0, 2.5)
DEFAULT_GRIDS = ((6, 9), (5, 8))
REFERENCE_HARDWARE = "wsc-llm-64g"


@dataclass(frozen=True)
class HardwarePoint:
    """One point of the hardware template.

    Attributes:
      rows, cols: die grid.
      dram_gb: DRAM capacity per die, GB.  dram_tbps: DRAM bandwidth per die, TB/s.
      d2d_tbps: D2D bandwidth per link per direction, TB/s.
    """

    rows: int
    cols: int
    dram_gb: float
    dram_tbps: float
    d2d_tbps: float

    @property
    def label(self) -> str:
        return f"{self.rows}x{self.cols} {self.dram_gb:g}GB {self.dram_tbps:g}TB/s D2D {self.d2d_tbps:g}TB/s"

    def spec(self) -> WaferSpec:
        return wsc_wafer(self.rows, self.cols, self.dram_gb, self.dram_tbps, self.d2d_tbps)

    @property
    def on_shoreline(self) -> bool:
        """On the template's trade-off line ``D2D = 3 - DRAM bandwidth / 2`` (TB/s).

        The line through the published points (2 TB/s DRAM with 2 TB/s D2D, 3 with 1.5)
        and the 1 TB/s / 2.5 TB/s corner: a die's shoreline buys DRAM or D2D bandwidth.
        """
        return abs(self.d2d_tbps + self.dram_tbps / 2.0 - 3.0) < 1e-9

    def as_dict(self) -> dict[str, Any]:
        return {"grid": f"{self.rows}x{self.cols}", "dies": self.rows * self.cols, "dram_gb": self.dram_gb,
                "dram_tbps": self.dram_tbps, "d2d_tbps": self.d2d_tbps, "shoreline": self.on_shoreline}


def _distinct(name: str, values, text=str) -> tuple:
    """``values`` as a tuple, refused if one repeats: a repeated point is simulated twice and can stand
    beside itself as best design and runner-up."""
    values = tuple(values)
    seen = set()
    for v in values:
        if v in seen:
            raise SpecError(f"{name} lists {text(v)} twice; give each value once")
        seen.add(v)
    return values


def _positive_list(name: str, values) -> tuple[float, ...]:
    vals = tuple(float(v) for v in values)
    if not vals:
        raise SpecError(f"{name}: give at least one value")
    for v in vals:
        if not math.isfinite(v) or v <= 0:
            raise SpecError(f"{name} must be positive numbers, got {v:g}")
    return _distinct(name, vals, lambda v: f"{v:g}")


def template_points(grids: Sequence[tuple[int, int]] = DEFAULT_GRIDS, dram_gb: Sequence[float] = DEFAULT_DRAM_GB,
                    d2d_tbps: Sequence[float] = DEFAULT_D2D_TBPS,
                    dram_tbps: Sequence[float] | None = None) -> list[HardwarePoint]:
    """Hardware points: grids x DRAM (capacity, bandwidth) x D2D bandwidth.

    Args:
      grids: die grids ``(rows, cols)``.
      dram_gb: DRAM capacities per die, GB.
      d2d_tbps: D2D bandwidths, TB/s.
      dram_tbps: DRAM bandwidths, TB/s, crossed with the capacities; default ``None``
        ties each capacity to ``capacity / 32`` TB/s (the template's ratio).

    Raises:
      SpecError: empty or non-positive values.
    """
    dram_gb = _positive_list("dram_gb", dram_gb)
    d2d_tbps = _positive_list("d2d_tbps", d2d_tbps)
    if dram_tbps is not None:
        dram_tbps = _positive_list("dram_tbps", dram_tbps)
    grids = tuple(grids)
    if not grids:
        raise SpecError("grids: give at least one die grid")
    for g in grids:
        if len(g) != 2 or any(not isinstance(x, int) or x < 1 for x in g):
            raise SpecError(f"grids must be pairs of positive integers (rows, cols), got {g!r}")
    _distinct("grids", (tuple(g) for g in grids), lambda g: f"{g[0]}x{g[1]}")
    mem = [(c, c / 32.0) for c in dram_gb] if dram_tbps is None else [(c, b) for c in dram_gb for b in dram_tbps]
    return [HardwarePoint(r, c, cap, bw, d2d) for (r, c) in grids for cap, bw in mem for d2d in d2d_tbps]


def parse_grids(text: str) -> tuple[tuple[int, int], ...]:
    """``"6x9,5x8"`` -> ``((6, 9), (5, 8))``."""
    out = []
    for part in [p.strip() for p in str(text).split(",") if p.strip()]:
        try:
            r, c = (int(x) for x in part.lower().split("x"))
        except ValueError:
            raise SpecError(f"die grids are given as RxC, e.g. 6x9,5x8; got {part!r}") from None
        if r < 1 or c < 1:
            raise SpecError(f"die grid {part!r}: rows and cols must be positive")
        out.append((r, c))
    if not out:
        raise SpecError("give at least one die grid, e.g. 6x9")
    return tuple(out)


@dataclass
class ExploreResult:
    """Rows of every simulated point, the best designs and timings.

    Attributes:
      rows: one dict per (hardware, model, workload, load): hardware fields, partition
        summary and serving metrics (see :func:`mocap_jax.wsc.serving.aggregate_metrics`).
      best: per workload, the best hardware point and its per-model scores.
      best_per_model: per (workload, model), the best hardware point.
      rates: ``{(model, workload): [rate per load]}``, requests/s.
      timing: wall seconds of set-up, simulation (and its compile share), groups,
        simulated requests and requests per wall-second.
    """

    rows: list[dict[str, Any]]
    best: list[dict[str, Any]]
    best_per_model: list[dict[str, Any]]
    rates: dict[tuple[str, str], list[float]]
    timing: dict[str, Any] = field(default_factory=dict)

    def write_csv(self, path: "str | Path") -> Path:
        return write_rows(self.rows, path)


def write_rows(rows: Sequence[dict[str, Any]], path: "str | Path") -> Path:
    """Write dict rows as CSV (union of keys, in first-seen order), atomically."""
    return files.write_rows(path, rows)


def workload_config(config: ServingConfig, workload: str, slos: dict[str, float] | None) -> ServingConfig:
    """The serving knobs of one workload: its own TTFT SLO (:data:`~mocap_jax.wsc.workload.WORKLOAD_TTFT_SLOS`)."""
    slos = WORKLOAD_TTFT_SLOS if slos is None else slos
    return dataclasses.replace(config, ttft_slo_s=slos[workload]) if workload in slos else config


def reference_rates(models: Sequence[str], workloads: Sequence[str], loads: Sequence[float],
                    config: ServingConfig, fallback: Sequence[WaferSpec] = (),
                    slos: dict[str, float] | None = None) -> dict[tuple[str, str], list[float]]:
    """Offered rates per (model, workload): ``load x`` the reference design's partition capacity.

    The reference is ``wsc-llm-64g``; when the model does not fit it, the largest capacity
    among ``fallback`` hardware is used.

    Raises:
      SpecError: the model fits none of them.
    """
    out = {}
    for m in models:
        for w in workloads:
            wl, cfg = WORKLOAD_PRESETS[w], workload_config(config, w, slos)
            cap = build_setup(m, REFERENCE_HARDWARE, wl, "wsc", config=cfg).served_rps
            if not cap > 0:
                caps = [s.served_rps for s in build_setups(m, fallback, wl, "wsc", config=cfg)]
                cap = max(caps, default=0.0)
            if not cap > 0:
                raise SpecError(f"model {m} fits none of the explored hardware points for {w}; drop it or add "
                                f"larger DRAM")
            out[(m, w)] = [float(l) * cap for l in loads]
    return out


@dataclass(frozen=True)
class Sweep:
    """What an exploration crosses: hardware points, models, workloads and rates (validated)."""

    models: tuple[str, ...]
    workloads: tuple[str, ...]
    loads: tuple[float, ...]
    hardware: tuple[HardwarePoint, ...]
    requests: int | None = None    # requests per point; None: window_s of arrivals in three size classes
    window_s: float = 8.0
    min_requests: int = 64
    max_requests: int = 1536
    seed: int = 0                  # trace seed (the same trace for every hardware point of a (workload, load))

    def __post_init__(self):
        object.__setattr__(self, "models", _distinct("models", (get_model(m).name for m in self.models)))
        workloads = (resolve_workload_name(w) for w in self.workloads)
        object.__setattr__(self, "workloads", _distinct("workloads", workloads))
        if not self.models or not self.workloads:
            raise SpecError("give at least one model and one workload")
        object.__setattr__(self, "loads", _positive_list("loads", self.loads))
        object.__setattr__(self, "hardware", _distinct("hardware", self.hardware, lambda h: h.label))
        if not self.hardware:
            raise SpecError("give at least one hardware point")
        if self.requests is not None:
            checks.integer("requests", self.requests, 2, LIMITS["requests"])
        checks.positive("window_s", self.window_s, hint=" Give the arrival window in seconds.")
        checks.integer("min_requests", self.min_requests, 2, LIMITS["requests"])
        checks.integer("max_requests", self.max_requests, self.min_requests, LIMITS["requests"])

    def traces(self, rates) -> dict:
        """Per (model, workload, load index) the synthetic trace every hardware point sees."""
        classes = sorted({max(self.min_requests, self.max_requests // 12),
                          max(self.min_requests, self.max_requests // 3), self.max_requests})

        def size(rate):
            if self.requests is not None:
                return self.requests
            return next((c for c in classes if c >= rate * self.window_s), classes[-1])

        return {(m, w, k): synthetic_trace(w, size(rates[(m, w)][k]), rates[(m, w)][k], self.seed + 1000 * k)
                for m in self.models for w in self.workloads for k in range(len(self.loads))}


def sweep_points(sweep: Sweep, specs: Sequence[WaferSpec], traces, rates, config: ServingConfig,
                 slos: dict[str, float] | None = None):
    """The (setup, trace) points of a sweep on the given hardware specs, and what each one is."""
    setups = {}
    for m in sweep.models:
        for w in sweep.workloads:
            built = build_setups(m, specs, WORKLOAD_PRESETS[w], "wsc", config=workload_config(config, w, slos),
                                 labels=[f"{h.label}/{m}/{w}" for h in sweep.hardware])
            setups.update({(k, m, w): s for k, s in enumerate(built)})
    points, meta = [], []
    for k, h in enumerate(sweep.hardware):
        for m in sweep.models:
            for w in sweep.workloads:
                for j, load in enumerate(sweep.loads):
                    points.append((setups[(k, m, w)], traces[(m, w, j)]))
                    meta.append((h, m, w, load, rates[(m, w)][j]))
    return points, meta


def result_rows(meta, results) -> list[dict[str, Any]]:
    """One row per simulated point: hardware, partition summary and serving metrics."""
    rows = []
    for (h, m, w, load, rate), res in zip(meta, results):
        row = dict(h.as_dict())
        row.update(model=m, workload=w, load=load, rate_rps=rate, requests=len(res.trace))
        d = res.setup.describe()
        row.update({k: d.get(k) for k in ("feasible", "prefill", "n_prefill", "decode", "n_decode", "batch_cap",
                                           "served_rps", "dies_used", "contention")})
        row.update({k: v for k, v in res.metrics.items() if k != "requests"})
        row["goodput_per_die"] = row["goodput_rps"] / h.rows / h.cols
        row["reason"] = res.setup.reason
        rows.append(row)
    return rows


def explore(sweep: Sweep | None = None, config: ServingConfig | None = None, slos: dict[str, float] | None = None,
            dtype=jnp.float32, batch_size: int | None = None, progress=None) -> ExploreResult:
    """Sweep hardware x models x workloads x request rates as one batched serving run.

    Args:
      sweep: what to cross (default: :data:`DEFAULT_MODELS` x :data:`DEFAULT_WORKLOADS` x
        :data:`DEFAULT_LOADS` x :func:`template_points`).
      config: serving knobs (chunk, SLOs, batch, window, contention, ...).
      slos: TTFT SLO per workload overriding ``config`` (default
        :data:`~mocap_jax.wsc.workload.WORKLOAD_TTFT_SLOS`; ``{}`` uses ``config`` everywhere).
      dtype: float dtype of the array program.
      batch_size: points per vmap call (see :func:`mocap_jax.wsc.serving.simulate`).
      progress: optional callable given ``(points done, points)`` (:func:`mocap_jax.wsc.serving.simulate`).

    Raises:
      SpecError: bad names, empty lists, non-positive loads or requests (before any simulation).
    """
    config = config or ServingConfig()
    sweep = sweep or Sweep(DEFAULT_MODELS, DEFAULT_WORKLOADS, DEFAULT_LOADS, tuple(template_points()))
    t0 = time.perf_counter()
    specs = [h.spec() for h in sweep.hardware]
    rates = reference_rates(sweep.models, sweep.workloads, sweep.loads, config, specs, slos)
    points, meta = sweep_points(sweep, specs, sweep.traces(rates), rates, config, slos)
    t_setup = time.perf_counter() - t0
    rep = sv.simulate(points, dtype=dtype, batch_size=batch_size, progress=progress)
    rows = result_rows(meta, rep.results)
    best, best_model = best_designs(rows, sweep.hardware, sweep.models, sweep.workloads)
    timing = {"setup_s": t_setup, "simulate_s": rep.wall_s, "compile_s": rep.compile_s, "groups": rep.groups,
              "points": len(points), "simulated_requests": rep.simulated_requests,
              "requests_per_wall_s": rep.requests_per_wall_s, "total_s": time.perf_counter() - t0}
    return ExploreResult(rows=rows, best=best, best_per_model=best_model, rates=rates, timing=timing)


__all__ = ["HardwarePoint", "template_points", "parse_grids", "Sweep", "ExploreResult", "explore", "sweep_points",
           "result_rows", "reference_rates", "workload_config", "write_rows", "DEFAULT_MODELS", "DEFAULT_WORKLOADS",
           "DEFAULT_LOADS", "DEFAULT_DRAM_GB", "DEFAULT_D2D_TBPS", "DEFAULT_GRIDS"]
