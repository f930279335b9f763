"""De-confounded baselines and ablations of WSC-LLM serving.

Four systems cross two hardware platforms with two schedulers, so the table separates the
scheduler's gain from the hardware's:

============================  ================  =====================================================
system                        hardware          scheduler
============================  ================  =====================================================
``A100 + Splitwise``          ``a100-cluster``  TP 8 (one node) for both phases, balanced counts, KV
                                                local to the decode node (Splitwise-style)
``A100 + WSC-LLM sched.``     ``a100-cluster``  WSC-LLM partition search over cluster shapes and TP
                                                strategies; KV may spill to free HBM in the decode
                                                instance's node (the memory scheduler on a cluster)
``wafer + Splitwise sched.``  ``wsc-llm-64g``   TP 8 (2x4 dies) for both phases, balanced counts,
                                                packed placement, KV local to the decode instance
``wafer + WSC-LLM``           ``wsc-llm-64g``   partition search, decode-centred placement, greedy KV
                                                memory scheduler
============================  ================  =====================================================

Scheduler gain on a platform = WSC-LLM / Splitwise on that platform; hardware gain under a
scheduler = wafer / A100 with that scheduler (ratios of goodput, and of mean E2E latency).

Ablations on the wafer (``ablation_wafer``, default the same wafer; same rates): ``no central scheduler`` (naive partition -- the
smallest instance that holds the model, megatron, half the instances prefill -- and packed
placement; memory scheduler kept), ``no memory scheduler`` (WSC-LLM partition and placement,
KV local to the decode instance) and ``neither``.

All systems and ablations of one run see the same synthetic trace at each rate; they are
simulated together by :func:`mocap_jax.wsc.serving.simulate` (one compiled program per die
count and trace size).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import jax.numpy as jnp

from ..specs import SpecError, get_model
from . import serving as sv
from .hardware import get_wafer
from .metrics import ServingResult
from .setup import ServingConfig, build_setup
from .synthetic import resolve_workload_name, synthetic_trace
from .workload import WORKLOAD_PRESETS

DEFAULT_LOADS = (0.4, 0.8, 1.2)

#: (name, hardware role, scheduler, memory policy, placement)
SYSTEMS = (
    ("A100 + Splitwise", "cluster", "splitwise", "local", "packed"),
    ("A100 + WSC-LLM sched.", "cluster", "wsc", "greedy", "packed"),
    ("wafer + Splitwise sched.", "wafer", "splitwise", "local", "packed"),
    ("wafer + WSC-LLM", "wafer", "wsc", "greedy", "decode-centred"),
)
ABLATIONS = (
    ("WSC-LLM (full)", "ablation", "wsc", "greedy", "decode-centred"),
    ("no central scheduler", "ablation", "naive", "greedy", "packed"),
    ("no memory scheduler", "ablation", "wsc", "local", "decode-centred"),
    ("neither", "ablation", "naive", "local", "packed"),
)


@dataclass
class BaselineResult:
    """Rows per (system or ablation, rate), gains, raw results and timing.

    Attributes:
      rows: one dict per (kind, name, load): set-up summary and serving metrics.
      gains: per load, scheduler and hardware gains (goodput ratios and E2E ratios).
      results: ``{(kind, name, load): ServingResult}`` (per-request latencies for CDFs).
      rates: offered rate per load, requests/s.
      reference: name of the system whose capacity defines the loads.
    """

    model: str
    workload: str
    loads: tuple[float, ...]
    rates: list[float]
    reference: str
    rows: list[dict[str, Any]]
    gains: list[dict[str, Any]]
    results: dict[tuple[str, str, float], ServingResult] = field(repr=False, default_factory=dict)
    timing: dict[str, Any] = field(default_factory=dict)


def _ratio(a: float, b: float) -> float:
    if not (math.isfinite(a) and math.isfinite(b)) or b == 0:
        return math.nan
    return a / b


def run_baselines(model: str = "llama3-70b", workload: str = "azure-conv", loads: Sequence[float] = DEFAULT_LOADS,
                  requests: int = 400, wafer: str = "wsc-llm-64g", cluster: str = "a100-cluster",
                  config: ServingConfig | None = None, seed: int = 0, dtype=jnp.float32,
                  ablations: bool = True, ablation_wafer: str | None = None) -> BaselineResult:
    """Simulate the four systems (and the ablations) at common request rates.

    Rates are ``load x`` the partition capacity of ``A100 + Splitwise`` (the baseline), so
    load 1 is where the GPU baseline saturates by its own goodput model.

    Args:
      model, workload: presets.
      loads: multiples of the baseline's capacity.
      requests: requests per simulated point (the same synthetic trace for every system).
      wafer, cluster: hardware presets for the two platforms.
      config: serving knobs.
      seed: trace seed.
      dtype: float dtype of the array program.
      ablations: also run the ablations.
      ablation_wafer: hardware of the ablations (default ``wafer``), e.g. a DRAM-poor
        design point where the memory scheduler matters.

    Raises:
      SpecError: bad names or values; the baseline cannot serve the model.
    """
    config = config or ServingConfig()
    m = get_model(model).name
    w = resolve_workload_name(workload)
    loads = tuple(float(x) for x in loads)
    if not loads or any(not math.isfinite(x) or x <= 0 for x in loads):
        raise SpecError(f"loads must be positive numbers, got {list(loads)}")
    if not isinstance(requests, int) or isinstance(requests, bool) or requests < 2:
        raise SpecError(f"requests must be an integer >= 2, got {requests!r}")
    hw = {"wafer": get_wafer(wafer), "cluster": get_wafer(cluster),
          "ablation": get_wafer(ablation_wafer or wafer)}
    if not hw["wafer"].is_mesh:
        raise SpecError(f"--wafer must be a mesh wafer, got the cluster {wafer!r}")
    if not hw["ablation"].is_mesh:
        raise SpecError(f"--ablation-wafer must be a mesh wafer, got the cluster {ablation_wafer!r}")
    if hw["cluster"].is_mesh:
        raise SpecError(f"--cluster must be a GPU cluster (e.g. a100-cluster), got the wafer {cluster!r}")
    t0 = time.perf_counter()
    wl = WORKLOAD_PRESETS[w]
    entries = [("system", *s) for s in SYSTEMS] + ([("ablation", *a) for a in ABLATIONS] if ablations else [])
    setups = {}
    for kind, name, role, sched, policy, place in entries:
        setups[(kind, name)] = build_setup(m, hw[role], wl, sched, policy, place, config, label=name)
    ref_name = SYSTEMS[0][0]
    base = setups[("system", ref_name)]
    cap = base.served_rps if base.feasible else 0.0
    if not cap > 0:
        others = [s.served_rps for s in setups.values() if s.feasible]
        if not others:
            raise SpecError(f"no system can serve {m}; choose a smaller model")
        ref_name = "largest feasible capacity"
        cap = max(others)
    rates = [l * cap for l in loads]
    traces = [synthetic_trace(w, requests, r, seed + 1000 * k) for k, r in enumerate(rates)]
    points, keys = [], []
    for kind, name, *_ in entries:
        for k, load in enumerate(loads):
            points.append((setups[(kind, name)], traces[k]))
            keys.append((kind, name, load))
    t_setup = time.perf_counter() - t0
    rep = sv.simulate(points, dtype=dtype)
    results = dict(zip(keys, rep.results))
    rows = []
    for (kind, name, load), res in results.items():
        row = {"kind": kind, "system": name, "load": load, "rate_rps": res.trace.rate}
        row.update(res.setup.describe())
        row.update({k: v for k, v in res.metrics.items() if k != "requests"})
        rows.append(row)
    gains = []
    for load in loads:
        g = lambda name, key="goodput_rps": results[("system", name, load)].metrics[key]
        a_sw, a_ws, w_sw, w_ws = (s[0] for s in SYSTEMS)
        gains.append({
            "load": load, "rate_rps": results[("system", a_sw, load)].trace.rate,
            "scheduler_gain_a100": _ratio(g(a_ws), g(a_sw)),
            "scheduler_gain_wafer": _ratio(g(w_ws), g(w_sw)),
            "hardware_gain_splitwise": _ratio(g(w_sw), g(a_sw)),
            "hardware_gain_wsc": _ratio(g(w_ws), g(a_ws)),
            "total_gain": _ratio(g(w_ws), g(a_sw)),
            "e2e_speedup_sched_a100": _ratio(g(a_sw, "e2e_mean_s"), g(a_ws, "e2e_mean_s")),
            "e2e_speedup_sched_wafer": _ratio(g(w_sw, "e2e_mean_s"), g(w_ws, "e2e_mean_s")),
            "e2e_speedup_hw_splitwise": _ratio(g(a_sw, "e2e_mean_s"), g(w_sw, "e2e_mean_s")),
            "e2e_speedup_hw_wsc": _ratio(g(a_ws, "e2e_mean_s"), g(w_ws, "e2e_mean_s")),
        })
    timing = {"setup_s": t_setup, "simulate_s": rep.wall_s, "compile_s": rep.compile_s, "groups": rep.groups,
              "simulated_requests": rep.simulated_requests, "requests_per_wall_s": rep.requests_per_wall_s}
    return BaselineResult(model=m, workload=w, loads=loads, rates=rates, reference=ref_name, rows=rows, gains=gains,
                          results=results, timing=timing)


__all__ = ["SYSTEMS", "ABLATIONS", "DEFAULT_LOADS", "BaselineResult", "run_baselines"]
