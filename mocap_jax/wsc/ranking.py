"""Ranking of hardware points by serving goodput: scores, the best design and its runner-up.

**Best design.**  Per (model, workload) a point's score is its goodput (requests meeting
the TTFT and TPOT SLOs per second) summed over the swept rates; per workload the best
hardware point maximises the geometric mean over models of the score normalised by the
best score of that model (ties: lower mean E2E latency).  Points that cannot serve a model
score 0 for it (and are ranked last when any model cannot be served).

A point whose bursts meet every SLO at every rate scores the offered rates, whatever its
capacity: goodput cannot rank such points against each other (only mean E2E then does), so
each (workload, model) also counts them (``points_meeting_every_slo`` of ``points``).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np


def scores(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, float]]:
    """Per (hardware label, model, workload): goodput summed over loads, mean E2E over loads, and whether
    every request of every load met the SLOs."""
    acc: dict = {}
    for r in rows:
        key = (hardware_key(r), r["model"], r["workload"])
        a = acc.setdefault(key, {"score": 0.0, "e2e": [], "feasible": bool(r.get("feasible")), "attainment": 1.0})
        a["score"] += float(r.get("goodput_rps") or 0.0)
        a["attainment"] = min(a["attainment"], float(r.get("slo_attainment") or 0.0))
        e = r.get("e2e_mean_s")
        a["e2e"].append(float(e) if e is not None and math.isfinite(float(e)) else math.inf)
    return {k: {"score": v["score"], "e2e_mean_s": float(np.mean(v["e2e"])), "feasible": v["feasible"],
                "every_slo_met": v["feasible"] and v["attainment"] >= 1.0} for k, v in acc.items()}


def hardware_key(r: dict[str, Any]) -> str:
    """The label of a row's hardware point (:attr:`mocap_jax.wsc.explore.HardwarePoint.label`)."""
    return f"{r['grid']} {r['dram_gb']:g}GB {r['dram_tbps']:g}TB/s D2D {r['d2d_tbps']:g}TB/s"


def best_designs(rows, hardware: Sequence[Any], models: Sequence[str], workloads: Sequence[str]):
    """Best hardware point per workload (geometric mean of normalised scores) and per (workload, model).

    Returned twice per workload when some points lie on the template's shoreline trade-off
    (:attr:`mocap_jax.wsc.explore.HardwarePoint.on_shoreline`): over all points (``subset`` ``all``) and over
    those only (``shoreline``).
    """
    sc = scores(rows)
    label = lambda h: h.label
    best, per_model = [], []
    subsets = [("all", list(dict.fromkeys(label(h) for h in hardware)))]
    shore = list(dict.fromkeys(label(h) for h in hardware if h.on_shoreline))
    if shore and len(shore) < len(subsets[0][1]):
        subsets.append(("shoreline", shore))
    for subset, labels in subsets:
        b, pm = _best_of(sc, labels, models, workloads)
        best += [dict(x, subset=subset) for x in b]
        per_model += [dict(x, subset=subset) for x in pm]
    return best, per_model


def model_order(sc, labels: Sequence[str], model: str, workload: str) -> list[str]:
    """``labels`` best first for one (model, workload) of :func:`scores`: higher score, then lower mean E2E."""
    missing = {"score": 0.0, "e2e_mean_s": math.inf}
    return sorted(labels, key=lambda l: (-sc.get((l, model, workload), missing)["score"],
                                         sc.get((l, model, workload), missing)["e2e_mean_s"]))


def _best_of(sc, labels, models, workloads):
    best, per_model = [], []
    for w in workloads:
        norm = {}
        for m in models:
            top = max((sc[(l, m, w)]["score"] for l in labels if (l, m, w) in sc), default=0.0)
            for l in labels:
                s = sc.get((l, m, w), {"score": 0.0})["score"]
                norm[(l, m)] = s / top if top > 0 else 0.0
            ranked = model_order(sc, labels, m, w)
            b, second = ranked[0], ranked[1] if len(ranked) > 1 else None
            here = [sc[(l, m, w)] for l in labels if (l, m, w) in sc and sc[(l, m, w)]["feasible"]]
            per_model.append({"workload": w, "model": m, "hardware": b, "goodput_sum_rps": sc[(b, m, w)]["score"],
                              "e2e_mean_s": sc[(b, m, w)]["e2e_mean_s"], "points": len(here),
                              "points_meeting_every_slo": sum(x["every_slo_met"] for x in here),
                              "runner_up": second,
                              "runner_up_goodput_sum_rps": sc.get((second, m, w), {"score": 0.0})["score"] if second
                              else None})
        def key(l):
            vals = [norm[(l, m)] for m in models]
            geo = float(np.exp(np.mean(np.log(np.maximum(vals, 1e-12))))) if all(v > 0 for v in vals) else 0.0
            e2e = float(np.mean([sc.get((l, m, w), {"e2e_mean_s": math.inf})["e2e_mean_s"] for m in models]))
            return (-geo, e2e), geo
        ranked = sorted(labels, key=lambda l: key(l)[0])
        b = ranked[0]
        best.append({"workload": w, "hardware": b, "score_geomean": key(b)[1],
                     **{f"score_{m}": norm[(b, m)] for m in models},
                     "runner_up": ranked[1] if len(ranked) > 1 else None,
                     "runner_up_score": key(ranked[1])[1] if len(ranked) > 1 else None})
    return best, per_model


__all__ = ["scores", "best_designs", "model_order", "hardware_key"]
