"""Robustness of the design-space answer to errors of the performance model.

A :class:`Perturbation` scales the efficiencies of GEMMs, attention, DRAM and links (each by a
factor in ``1 +- spread``) and the hop latency (by a factor log-uniform in ``latency_range``),
and picks the placement's shared-link factor alpha and the contention rule.  Perturbations are a
Latin hypercube over the continuous factors (seeded), with alpha and the rule drawn uniformly
from their sets.  :func:`run_robustness` re-runs the same sweep (same traces, same rates) under
every perturbation -- all perturbed design points through the one batched serving program -- and
reports, per workload and per (workload, model):

* the nominal best design (unperturbed model) and its margin over the runner-up;
* the share of perturbations under which the nominal best is still the best;
* per perturbation, the best design and the runner-up's margin (``1 - runner-up score / best
  score``), and the nominal best's score relative to that perturbation's best.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import jax.numpy as jnp
import numpy as np

from ..specs import SpecError, checks
from . import serving as sv
from .explore import Sweep, reference_rates, result_rows, sweep_points
from .hardware import WaferSpec
from .layout import check_alpha
from .ranking import best_designs, scores
from .setup import CONTENTION, ServingConfig

EFFICIENCIES = ("eff_gemm", "eff_attention", "eff_dram", "eff_link")
ALPHAS = (1.0, 1.5, 2.0, 3.0)


@dataclass(frozen=True)
class Perturbation:
    """Multipliers of the performance model's constants, and the discrete choices."""

    eff_gemm: float = 1.0        # multiplier of the GEMM efficiency
    eff_attention: float = 1.0   # multiplier of the attention efficiency
    eff_dram: float = 1.0        # multiplier of the DRAM efficiency
    eff_link: float = 1.0        # multiplier of the link efficiency
    hop_latency: float = 1.0     # multiplier of the per-hop latency
    alpha: float = 1.5           # shared-link factor of the decode-centred placement
    contention: str = "max-min"  # link and DRAM sharing rule

    def apply(self, spec: WaferSpec) -> WaferSpec:
        """The hardware point with its efficiencies (capped at 1) and hop latency scaled."""
        changes = {f: min(1.0, getattr(spec, f) * getattr(self, f)) for f in EFFICIENCIES}
        return spec.replace(link_latency_s=spec.link_latency_s * self.hop_latency, **changes)

    def config(self, base: ServingConfig) -> ServingConfig:
        return dataclasses.replace(base, alpha=self.alpha, contention=self.contention)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def sample_perturbations(n: int, seed: int = 0, spread: float = 0.15, latency_range: tuple[float, float] = (0.5, 2.0),
                         alphas: Sequence[float] = ALPHAS, rules: Sequence[str] = ("max-min", "proportional")
                         ) -> list[Perturbation]:
    """``n`` perturbations: a Latin hypercube over the five continuous factors, uniform discrete choices.

    Raises:
      SpecError: ``n < 1``, a spread outside ``[0, 1)``, a latency range that is not increasing
        and positive, an alpha below 1, or an unknown contention rule.
    """
    n = checks.integer("perturbations", n, 1, 100_000)
    checks.number("spread", spread, 0.0, 0.99)
    lo, hi = (checks.positive("latency range", v) for v in latency_range)
    if not lo <= hi:
        raise SpecError(f"latency range must be increasing, got {latency_range}")
    for a in alphas:
        check_alpha(a)
    for r in rules:
        if r == "off":
            raise SpecError("robustness perturbs the contention rule; choose from max-min, proportional")
        checks.choice("contention rule", r, CONTENTION)
    rng = np.random.default_rng(seed)
    u = (rng.permuted(np.tile(np.arange(n), (5, 1)), axis=1) + rng.random((5, n))) / n   # [5, n] Latin hypercube
    scale = 1.0 - spread + 2.0 * spread * u[:4]
    latency = np.exp(np.log(lo) + (np.log(hi) - np.log(lo)) * u[4])
    alpha = rng.choice(np.asarray(alphas, float), n)
    rule = rng.choice(np.asarray(rules), n)
    return [Perturbation(*(float(x) for x in scale[:, k]), float(latency[k]), float(alpha[k]), str(rule[k]))
            for k in range(n)]


@dataclass
class RobustnessResult:
    """Nominal answer, answers under each perturbation, and their summary."""

    nominal_best: list[dict[str, Any]]           # best designs of the unperturbed model (ranking rows)
    perturbations: list[Perturbation]
    per_perturbation: list[dict[str, Any]]       # one row per (perturbation, scope): best, runner-up, margin
    summary: list[dict[str, Any]]                # one row per scope: share the nominal best stays best, margins
    timing: dict[str, Any] = field(default_factory=dict)


def _scopes(rows, sweep: Sweep):
    """Ranking of one run: ``{scope: (best label, runner-up label, margin, {label: relative score})}``.

    Scopes: ``(workload, None)`` -- the geometric mean over models -- and ``(workload, model)``.
    """
    labels = [h.label for h in sweep.hardware]
    sc = scores(rows)
    out = {}
    best, _ = best_designs(rows, sweep.hardware, sweep.models, sweep.workloads)
    for b in best:
        if b["subset"] != "all":
            continue
        rel = {l: 0.0 for l in labels}
        out[(b["workload"], None)] = (b["hardware"], b["runner_up"],
                                      1.0 - (b["runner_up_score"] or 0.0) / max(b["score_geomean"], 1e-12), rel)
    for w in sweep.workloads:
        for m in sweep.models:
            vals = {l: sc.get((l, m, w), {"score": 0.0})["score"] for l in labels}
            order = sorted(labels, key=lambda l: (-vals[l], sc.get((l, m, w), {"e2e_mean_s": math.inf})["e2e_mean_s"]))
            top = vals[order[0]]
            rel = {l: vals[l] / top if top > 0 else 0.0 for l in labels}
            margin = 1.0 - (vals[order[1]] / top if top > 0 and len(order) > 1 else 0.0)
            out[(w, m)] = (order[0], order[1] if len(order) > 1 else None, margin, rel)
    return out


def run_robustness(sweep: Sweep, perturbations: Sequence[Perturbation], config: ServingConfig | None = None,
                   slos: dict[str, float] | None = None, dtype=jnp.float32, group: int = 10,
                   progress=None) -> RobustnessResult:
    """Re-run ``sweep`` under the nominal model and every perturbation.

    The offered rates are the nominal model's (the same requests for every perturbation), so the
    perturbations change only how well each design serves them.  Perturbations run ``group`` at
    a time through :func:`mocap_jax.wsc.serving.simulate` (one compiled program).  ``progress``:
    optional callable given ``(design points done, design points)`` over all the runs.
    """
    config = config or ServingConfig()
    if config.contention == "off":
        raise SpecError("robustness perturbs the contention rule; run it with contention on")
    perturbations = list(perturbations)
    if not perturbations:
        raise SpecError("give at least one perturbation")
    checks.integer("group", group, 1)
    t0 = time.perf_counter()
    specs = [h.spec() for h in sweep.hardware]
    rates = reference_rates(sweep.models, sweep.workloads, sweep.loads, config, specs, slos)
    traces = sweep.traces(rates)
    runs = [Perturbation(alpha=config.alpha, contention=config.contention)] + perturbations
    rankings, simulated, finished = [], 0, 0
    for start in range(0, len(runs), group):
        batch = runs[start:start + group]
        points, metas = [], []
        for pert in batch:
            pts, meta = sweep_points(sweep, [pert.apply(s) for s in specs], traces, rates, pert.config(config), slos)
            points += pts
            metas.append(meta)
        total = len(runs) * len(metas[0])                 # every run simulates the same design points
        report = None if progress is None else (lambda done, _, before=finished: progress(before + done, total))
        rep = sv.simulate(points, dtype=dtype, progress=report)
        finished += len(points)
        simulated += rep.simulated_requests
        k = 0
        for meta in metas:
            rows = result_rows(meta, rep.results[k:k + len(meta)])
            k += len(meta)
            rankings.append(_scopes(rows, sweep))
    nominal, perturbed = rankings[0], rankings[1:]
    per_pert, summary = [], []
    for scope, (best, runner, margin, _) in nominal.items():
        w, m = scope
        same, margins, kept = 0, [], []
        for i, r in enumerate(perturbed):
            b, ru, mg, rel = r[scope]
            same += b == best
            margins.append(mg)
            kept.append(rel.get(best, 0.0) if m is not None else float(b == best))
            per_pert.append({"perturbation": i, "workload": w, "model": m or "all", "best": b, "runner_up": ru,
                             "margin": mg, "nominal_best": best, "nominal_best_relative": kept[-1],
                             **perturbations[i].as_dict()})
        summary.append({"workload": w, "model": m or "all", "nominal_best": best, "nominal_runner_up": runner,
                        "nominal_margin": margin, "share_best_stays_best": same / len(perturbed),
                        "margin_median": float(np.median(margins)), "margin_p10": float(np.percentile(margins, 10)),
                        "nominal_best_relative_min": float(np.min(kept))})
    nominal_rows = [{"workload": w, "model": m or "all", "best": b, "runner_up": r, "margin": mg}
                    for (w, m), (b, r, mg, _) in nominal.items()]
    timing = {"total_s": time.perf_counter() - t0, "runs": len(runs), "simulated_requests": simulated}
    return RobustnessResult(nominal_best=nominal_rows, perturbations=perturbations, per_perturbation=per_pert,
                            summary=summary, timing=timing)


__all__ = ["EFFICIENCIES", "ALPHAS", "Perturbation", "sample_perturbations", "RobustnessResult", "run_robustness"]
