"""Does the exploration's answer hold for longer bursts?

The exploration scores a design by its goodput, the offered rate times the share of a finite
burst's requests within the SLOs (docs/wsc_llm.md, assumption 23).  A burst that ends before a
design's queue outgrows the TTFT SLO therefore scores the full offered rate whether or not the
design sustains that rate, and designs that all do so tie.  :func:`check_bursts` re-simulates,
per (workload, model), the contenders for the best design -- the exploration's best, its
runner-up and the best point of each of up to :data:`MAX_KINDS` other die grids and DRAMs (the
choice the exploration is asked to make) -- at the exploration's highest rate with a burst
``factor`` times as long (the same rate and trace seed), and ranks them again by the exploration's
own rule (:mod:`mocap_jax.wsc.ranking`) with that rate's row replaced.  The verdict compares the
best with its *rival*, the strongest contender of another die grid or DRAM after the longer
bursts: the best's choice *holds* when it still scores higher, *flips* when the rival scores
higher, and the two stay *tied* when their scores are within :data:`TIE_RTOL` (mean E2E then
decides, as in the exploration).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import jax.numpy as jnp

from ..specs import LIMITS, checks
from . import serving as sv
from .explore import ExploreResult, Sweep, result_rows, workload_config
from .ranking import model_order, scores
from .setup import ServingConfig, build_setups
from .synthetic import synthetic_trace
from .workload import WORKLOAD_PRESETS

#: How much longer the checked bursts are.  At the exploration's 1.2x rate llama2-7b on conversation
#: meets every SLO on wsc-llm-64g with 1,536 and 3,072 requests (attainment 1.0 and 0.998) and only
#: saturates with 6,144 (0.655): a design's KV memory and decode batch absorb a burst for several
#: seconds before its queue shows, so a check must run well past the exploration's burst.
DEFAULT_FACTOR = 4
#: Scores closer than this share are a tie: one request of a 128-request burst is 0.8 % of its goodput.
TIE_RTOL = 0.01
#: Other die grids and DRAMs checked per (workload, model), each by its best point.
MAX_KINDS = 3


@dataclass
class BurstCheck:
    """The longer bursts' rows and, per (workload, model), whether the best design holds.

    Attributes:
      rows: one per re-simulated point, as the exploration's rows (``requests`` the longer burst's).
      verdicts: per (workload, model): the exploration's ``best`` and ``best_after`` the longer
        bursts, the strongest contender of another die grid or DRAM (``rival``), the ``verdict``
        (``holds``, ``flips``, ``tied`` or ``no rival``), each one's goodput at the
        highest rate with the exploration's burst and with the longer one (req/s) and its SLO
        attainment with the longer one, the contenders checked, the rate (req/s) and both burst
        sizes (requests).
      factor: the bursts' length against the exploration's.
      timing: wall seconds of set-up and simulation (and its compile share), points, simulated requests.
    """

    rows: list[dict[str, Any]]
    verdicts: list[dict[str, Any]]
    factor: int
    timing: dict[str, Any] = field(default_factory=dict)


def contenders(result: ExploreResult, sweep: Sweep, max_kinds: int = MAX_KINDS) -> dict[tuple[str, str], list[str]]:
    """Per (workload, model) the labels to re-simulate, best first (feasible points only): the best, the
    runner-up, and the best point of each of up to ``max_kinds`` other die grids and DRAMs, by score."""
    sc = scores(result.rows)
    kind = {h.label: _kind(h) for h in sweep.hardware}
    labels = list(kind)
    out = {}
    for w in sweep.workloads:
        for m in sweep.models:
            order = [l for l in model_order(sc, labels, m, w) if sc.get((l, m, w), {}).get("feasible")]
            if not order:
                continue
            chosen, kinds = order[:2], {kind[order[0]]}
            for l in order[1:]:
                if len(kinds) > max_kinds:
                    break
                if kind[l] not in kinds:
                    kinds.add(kind[l])
                    if l not in chosen:
                        chosen.append(l)
            out[(w, m)] = chosen
    return out


def check_bursts(result: ExploreResult, sweep: Sweep, config: ServingConfig | None = None,
                 slos: dict[str, float] | None = None, factor: int = DEFAULT_FACTOR, dtype=jnp.float32,
                 max_kinds: int = MAX_KINDS, progress=None) -> BurstCheck:
    """Re-simulate the contenders for each best design with ``factor`` times longer bursts.

    Args:
      result, sweep: an exploration and what it crossed (:func:`mocap_jax.wsc.explore.explore`).
      config, slos: the exploration's serving knobs and TTFT SLOs per workload.
      factor: burst length against the exploration's (at most :data:`LIMITS` ``requests`` requests).
      dtype: float dtype of the array program.
      max_kinds: other die grids and DRAMs checked (each by its best point).
      progress: optional callable given ``(points done, points)``.

    Raises:
      SpecError: a factor below 2 or ``max_kinds`` below 0.
    """
    factor = checks.integer("factor", factor, 2, LIMITS["requests"], " The longer bursts are factor x the "
                            "exploration's.")
    max_kinds = checks.integer("max_kinds", max_kinds, 0, 1024)
    config = config or ServingConfig()
    t0 = time.perf_counter()
    top_load = max(range(len(sweep.loads)), key=lambda k: sweep.loads[k])
    load = sweep.loads[top_load]
    hardware = {h.label: h for h in sweep.hardware}
    short = {_row_key(r): r for r in result.rows if r["load"] == load}
    short_row = lambda w, m, label: short[_key(w, m, hardware[label])]

    chosen = contenders(result, sweep, max_kinds)
    points, meta = [], []
    for (w, m), labels in chosen.items():
        rate = result.rates[(m, w)][top_load]
        requests = min(factor * short_row(w, m, labels[0])["requests"], LIMITS["requests"])
        trace = synthetic_trace(w, requests, rate, sweep.seed + 1000 * top_load)
        setups = build_setups(m, [hardware[l].spec() for l in labels], WORKLOAD_PRESETS[w], "wsc",
                              config=workload_config(config, w, slos), labels=[f"{l}/{m}/{w}" for l in labels])
        points += [(s, trace) for s in setups]
        meta += [(hardware[l], m, w, load, rate) for l in labels]
    t_setup = time.perf_counter() - t0
    rep = sv.simulate(points, dtype=dtype, progress=progress)
    rows = result_rows(meta, rep.results)
    longer = {_row_key(r): r for r in rows}
    replaced = [longer.get(k, r) for k, r in short.items()] + [r for r in result.rows if r["load"] != load]
    sc_after = scores(replaced)
    verdicts = []
    for (w, m), labels in chosen.items():
        after = model_order(sc_after, labels, m, w)
        best, best_after = labels[0], after[0]
        rival = next((l for l in after if _kind(hardware[l]) != _kind(hardware[best])), None)
        entry = {"workload": w, "model": m, "best": best, "best_after": best_after,
                 "verdict": _verdict(sc_after, (w, m), best, rival), "rival": rival, "contenders": len(labels),
                 "rate_rps": result.rates[(m, w)][top_load], "requests": short_row(w, m, best)["requests"],
                 "requests_longer": longer[_key(w, m, hardware[best])]["requests"]}
        for role, label in (("best", best), ("rival", rival)):
            before = short_row(w, m, label) if label else {}
            now = longer[_key(w, m, hardware[label])] if label else {}
            entry[f"{role}_goodput_rps"] = before.get("goodput_rps")
            entry[f"{role}_goodput_longer_rps"] = now.get("goodput_rps")
            entry[f"{role}_attainment_longer"] = now.get("slo_attainment")
        verdicts.append(entry)
    timing = {"setup_s": t_setup, "simulate_s": rep.wall_s, "compile_s": rep.compile_s, "points": len(points),
              "simulated_requests": rep.simulated_requests, "total_s": time.perf_counter() - t0}
    return BurstCheck(rows=rows, verdicts=verdicts, factor=factor, timing=timing)


def _verdict(sc, case: tuple[str, str], best: str, rival: str | None) -> str:
    """``holds`` (the best scores higher than its rival), ``flips`` (the rival scores higher), ``tied``
    (within :data:`TIE_RTOL`: the longer bursts do not separate them either) or ``no rival`` (no other
    die grid or DRAM serves the model)."""
    if rival is None:
        return "no rival"
    w, m = case
    mine, theirs = sc[(best, m, w)]["score"], sc[(rival, m, w)]["score"]
    if abs(mine - theirs) <= TIE_RTOL * max(mine, theirs):
        return "tied"
    return "holds" if mine > theirs else "flips"


def _kind(h) -> tuple:
    """What the exploration chooses besides D2D bandwidth: the die grid and the DRAM."""
    return (h.rows, h.cols, h.dram_gb, h.dram_tbps)


def _key(w: str, m: str, h) -> tuple:
    """A design point's identity among rows: workload, model and hardware point ``h``."""
    return (w, m, f"{h.rows}x{h.cols}", h.dram_gb, h.dram_tbps, h.d2d_tbps)


def _row_key(r: dict[str, Any]) -> tuple:
    return (r["workload"], r["model"], r["grid"], r["dram_gb"], r["dram_tbps"], r["d2d_tbps"])


__all__ = ["BurstCheck", "check_bursts", "contenders", "DEFAULT_FACTOR", "TIE_RTOL", "MAX_KINDS"]
