"""``mocap-jax validate`` and ``mocap-jax bench reference`` (DESIGN §9).

``validate`` runs both validation checks and prints one report: agreement of the
vectorised simulator with the event-driven reference over random configurations
(float32 and float64), the approximation error of the array program's MBKR against
the event-driven MBKR reference (float64; ``--mbkr-configs``), and calibration of
the §4 cost model against measured execution (MAPE), when the calibration module
is installed.

``validate --profiles DIR`` instead checks the cost model against measured GPU operator
profiles (Vidur CSV layout; :mod:`mocap_jax.validation.profiles`), and ``validate --published
[FILE]`` against published end-to-end prefill measurements
(:mod:`mocap_jax.validation.published`).

``bench reference`` times the same configurations through the reference and through
one ``simulate_batch`` call and reports the speed-up; ``bench peer`` runs a published
simulator side by side (:mod:`mocap_jax.bench.peer`).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from typing import Any

import numpy as np

from .core import positive_int as _positive
from ..validation.agreement import (MBKR_TARGET_MAX, MBKR_TARGET_MEAN, METRICS, random_partition, run_mbkr_agreement,
                        run_reference_agreement, tolerance)

_LABELS = {
    "finish_times": "finish times (every item, stage)",
    "prefill_latency_s": "prefill latency",
    "kv_peak_bytes_per_stage": "peak KV per stage",
    "peak_mem_bytes_per_stage": "peak memory per stage",
    "throughput_rps": "saturation throughput",
    "bubble_fraction": "bubble fraction",
}


def _non_negative(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {v}")
    return v


def register(subparsers, bench_subparsers) -> None:
    """Add ``validate`` to the top-level commands and ``reference`` to ``bench``."""
    p = subparsers.add_parser(
        "validate", help="check the simulator: agreement with the event-driven reference, and calibration MAPE",
        description="Run random configurations through the vectorised simulator (float32 and float64) and the "
                    "event-driven SimPy reference, report the largest relative error per metric; report the "
                    "approximation error (mean and max) of the array program's MBKR against the event-driven "
                    "MBKR reference (target: mean <= 1%%, max <= 5%%), then the calibration MAPE of the cost "
                    "model (DESIGN §9). Exit code 1 if the exact agreement is outside 1e-9 (float64) / 1e-4 "
                    "(float32); the MBKR target is reported, not enforced.")
    p.add_argument("--configs", type=_positive, default=200, help="random configurations to compare (default 200)")
    p.add_argument("--seed", type=int, default=0, help="seed of the configuration generator (default 0)")
    p.add_argument("--mbkr-configs", type=_non_negative, default=1000,
                   help="random MBKR configurations for the approximation error of the array program's MBKR "
                        "against the event-driven MBKR reference (default 1000; 0 skips it)")
    p.add_argument("--no-calibration", action="store_true", help="skip the calibration check")
    p.add_argument("--profiles", metavar="DIR", default=None,
                   help="instead: compare the cost model with GPU operator profiles in the Vidur CSV layout "
                        "(compute/GPU/ORG/MODEL/mlp.csv, network/NAME/*.csv), e.g. ../shared/data/vidur-profiling")
    p.add_argument("--hardware", metavar="SPEC", default=None,
                   help="with --profiles: hardware preset or spec file for the profiled GPU (default: the preset "
                        "named by each GPU folder)")
    p.add_argument("--published", metavar="FILE", nargs="?", const="", default=None,
                   help="instead: predict published end-to-end prefill measurements (default: the table shipped "
                        "in mocap_jax/data/published_prefill.csv; any file in that format)")
    p.add_argument("--figure", metavar="PNG", default=None, help="with --profiles: write predicted vs measured here")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.set_defaults(func=cmd_validate)

    b = bench_subparsers.add_parser(
        "reference", help="speed of the vectorised simulator against the event-driven reference",
        description="Time the same random configurations (one model and mesh; random partitions, batches and "
                    "sequence lengths) through the SimPy reference and through one simulate_batch call "
                    "(after a warm-up call; compile time reported separately).")
    b.add_argument("--configs", type=_positive, default=1000, help="configurations (default 1000)")
    b.add_argument("--model", default="llama3-70b", help="model preset (default llama3-70b)")
    b.add_argument("--hardware", default="mocap-4x4", help="mesh preset (default mocap-4x4)")
    b.add_argument("--chunks", type=_positive, default=16, help="chunks per request (default 16)")
    b.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="vectorised precision")
    b.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    b.add_argument("--json", action="store_true", help="print one JSON object")
    b.set_defaults(func=cmd_bench_reference)

    from ..bench.peer import register_bench

    register_bench(bench_subparsers)


# --------------------------------------------------------------------------- validate


def _enable_x64() -> None:
    import jax

    jax.config.update("jax_enable_x64", True)


def calibration_check(size: str = "small") -> dict[str, Any]:
    """Run the calibration check if its module is installed.

    Returns:
      ``{"available": True, "calibration_mape": ..., "baseline_linear_mape": ..., ...}`` (MAPEs in
      percent, as ``run_calibration`` reports them; scalar fields only), or
      ``{"available": False, "reason": ...}`` when ``mocap_jax.validation.calibrate`` is absent.
    """
    try:
        from ..validation.calibrate import run_calibration
    except ImportError as e:
        if e.name != "mocap_jax.validation.calibrate":
            raise
        return {"available": False, "reason": "mocap_jax.validation.calibrate is not installed"}
    res = run_calibration(size=size)
    out = {"available": True}
    out.update({k: v for k, v in res.items() if isinstance(v, (int, float, str, bool)) or v is None})
    return out


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.floating, float)):
        x = float(x)
        return x if math.isfinite(x) else str(x)
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x


def agreement_ok(report: dict[str, Any]) -> bool:
    """Whether one dtype's agreement report is within the promised tolerance."""
    tol = tolerance(report["dtype"])
    if report["overall_max_rel_err"] > tol:
        return False
    return report["dtype"] != "float64" or report["feasible_mismatches"] == 0


def cmd_validate(args) -> int:
    if args.profiles is not None or args.published is not None:
        return cmd_measurements(args)
    if args.hardware is not None or args.figure is not None:
        raise ValueError("--hardware and --figure go with --profiles")
    calibration = {"available": False, "reason": "skipped (--no-calibration)"} if args.no_calibration \
        else calibration_check("small")
    reports = {"float32": run_reference_agreement(args.configs, args.seed, "float32")}
    _enable_x64()
    reports["float64"] = run_reference_agreement(args.configs, args.seed, "float64")
    ok = all(agreement_ok(r) for r in reports.values())
    mbkr = run_mbkr_agreement(args.mbkr_configs, args.seed, "float64") if args.mbkr_configs > 0 else None
    if args.json:
        out = dict(
            reference_configs=args.configs, reference_seed=args.seed,
            reference_max_rel_err={d: r["max_rel_err"] for d, r in reports.items()},
            reference_tolerance={d: tolerance(d) for d in reports},
            reference_feasible_mismatches={d: r["feasible_mismatches"] for d, r in reports.items()},
            reference_ok=ok, reference=reports,
            **mbkr_summary(mbkr, args.mbkr_configs),
            calibration_mape=calibration.get("calibration_mape"),
            baseline_linear_mape=calibration.get("baseline_linear_mape"),
            calibration=calibration,
        )
        print(json.dumps(_jsonable(out), indent=2))
    else:
        print(format_validate(reports, calibration, args.configs, ok, mbkr))
    return 0 if ok else 1


def mbkr_summary(report: dict[str, Any] | None, configs: int) -> dict[str, Any]:
    """The ``mbkr_*`` fields of ``validate --json`` (None values when the MBKR check was skipped)."""
    keys = ("latency_rel_err_mean", "latency_rel_err_max", "peak_mem_rel_err_mean", "peak_mem_rel_err_max",
            "spilling_share", "feasible_mismatches", "within_target")
    out: dict[str, Any] = {"mbkr_configs": configs}
    out.update({f"mbkr_{k}": (None if report is None else report[k]) for k in keys})
    out["mbkr_target"] = {"mean": MBKR_TARGET_MEAN, "max": MBKR_TARGET_MAX}
    out["mbkr"] = report
    return out


def _pct(v) -> str:
    """A MAPE as reported by calibration (already in percent)."""
    return "n/a" if v is None else f"{float(v):.1f}%"


def format_mbkr(m: dict[str, Any]) -> list[str]:
    """Lines of the MBKR approximation-error block of the ``validate`` report."""
    pct = lambda v: f"{100 * v:.3f}%"
    lines = [f"MBKR approximation: {m['configs']} random configurations, array program vs event-driven MBKR "
             f"reference ({m['dtype']}; {m['spilling_configs']} spill = {100 * m['spilling_share']:.0f}%, "
             f"{m['infeasible_configs']} infeasible)",
             f"  {'relative error':34s} {'mean':>10s} {'max':>10s}",
             f"  {'prefill latency':34s} {pct(m['latency_rel_err_mean']):>10s} {pct(m['latency_rel_err_max']):>10s}",
             f"  {'peak memory per stage':34s} {pct(m['peak_mem_rel_err_mean']):>10s} "
             f"{pct(m['peak_mem_rel_err_max']):>10s}",
             f"  {'  (configurations that spill)':34s} {pct(m['spilling_peak_mem_rel_err_mean']):>10s} "
             f"{pct(m['spilling_peak_mem_rel_err_max']):>10s}",
             f"  {'  (feasible on both sides)':34s} {pct(m['feasible_peak_mem_rel_err_mean']):>10s} "
             f"{pct(m['feasible_peak_mem_rel_err_max']):>10s}",
             f"  {'peak KV per stage':34s} {pct(m['kv_peak_rel_err_mean']):>10s} {pct(m['kv_peak_rel_err_max']):>10s}",
             f"  {'feasibility mismatches':34s} {m['feasible_mismatches']:10d}",
             f"  target mean <= {pct(m['target_mean'])}, max <= {pct(m['target_max'])}: "
             f"{'PASS' if m['within_target'] else 'MISSED'}"]
    for p, b in m.get("by_pairing", {}).items():
        lines.append(f"    {p:14s} {b['configs']:4d} configs, {b['spilling']:4d} spill: latency "
                     f"{pct(b['latency_rel_err_mean'])} / {pct(b['latency_rel_err_max'])}, peak memory "
                     f"{pct(b['peak_mem_rel_err_mean'])} / {pct(b['peak_mem_rel_err_max'])} (mean / max)")
    if not m["within_target"]:
        lines.append(f"  worst latency: {m['worst_latency']}")
        lines.append(f"  worst peak memory: {m['worst_peak_mem']}")
    return lines


def format_validate(reports: dict[str, dict], calibration: dict[str, Any], configs: int, ok: bool,
                    mbkr: dict[str, Any] | None = None) -> str:
    """The human-readable ``validate`` report (``mbkr``: the MBKR approximation report, if run)."""
    r32, r64 = reports["float32"], reports["float64"]
    lines = [f"reference agreement: {configs} random configurations, vectorised simulator vs event-driven "
             f"reference (max relative error)",
             f"  {'metric':34s} {'float32':>10s} {'float64':>10s}"]
    for m in METRICS:
        lines.append(f"  {_LABELS[m]:34s} {r32['max_rel_err'][m]:10.2e} {r64['max_rel_err'][m]:10.2e}")
    lines.append(f"  {'feasibility mismatches':34s} {r32['feasible_mismatches']:10d} {r64['feasible_mismatches']:10d}")
    lines.append(f"  {'infeasible configurations':34s} {r32['infeasible_configs']:10d} {r64['infeasible_configs']:10d}")
    lines.append(f"  tolerance 1e-4 (float32), 1e-9 (float64): {'PASS' if ok else 'FAIL'}")
    if not ok:
        for d, r in reports.items():
            worst = max(r["max_rel_err"], key=r["max_rel_err"].get)
            if worst in r["worst"]:
                lines.append(f"  worst {d} {worst}: {r['worst'][worst]}")
            for cfg in r["mismatched"][:3]:
                lines.append(f"  {d} feasibility differs: {cfg}")
    if mbkr is not None:
        lines.extend(format_mbkr(mbkr))
    if calibration.get("available"):
        lines.append(f"calibration (small): MAPE {_pct(calibration.get('calibration_mape'))} on held-out points "
                     f"(linear baseline {_pct(calibration.get('baseline_linear_mape'))})")
    else:
        lines.append(f"calibration: unavailable ({calibration.get('reason')})")
    return "\n".join(lines)


# --------------------------------------------------------------------------- measured GPUs


def cmd_measurements(args) -> int:
    """``validate --profiles`` and/or ``--published``: exit 1 when the profiles' GEMM target is missed."""
    out: dict[str, Any] = {}
    ok = True
    if args.profiles is not None:
        from ..validation.profiles import profiles_report

        out["profiles"] = profiles_report(args.profiles, args.hardware)
        ok = out["profiles"]["target"]["met"]
        if args.figure:
            from ..figures.profiles import plot_profiles

            plot_profiles(out["profiles"], args.figure)
    elif args.hardware is not None or args.figure is not None:
        raise ValueError("--hardware and --figure go with --profiles")
    if args.published is not None:
        from ..validation.published import published_report

        out["published"] = published_report(args.published or None)
    if args.json:
        if "profiles" in out:
            out["profiles"] = {k: v for k, v in out["profiles"].items() if k != "points"}
        print(json.dumps(_jsonable(out), indent=2))
    else:
        from .measurements import format_profiles, format_published

        text = []
        if "profiles" in out:
            text.append(format_profiles(out["profiles"]))
        if "published" in out:
            text.append(format_published(out["published"]))
        print("\n\n".join(text))
    return 0 if ok else 1


# --------------------------------------------------------------------------- bench reference


def bench_configs(n: int, seed: int, chunks: int) -> dict[str, np.ndarray]:
    """``n`` random (sequence length, batch, partition) points with ``chunks`` chunks each.

    Returns:
      ``seq_len [n]``, ``batch [n]`` and ``partition [n, chunks]`` int arrays.
    """
    rng = np.random.default_rng(seed)
    seq = np.round(2 ** rng.uniform(max(10, math.log2(chunks)), 17, size=n)).astype(np.int64)
    batch = rng.integers(1, 9, size=n)
    part = np.stack([random_partition(rng, int(s), chunks) for s in seq])
    return dict(seq_len=seq, batch=batch.astype(np.int64), partition=part.astype(np.int64))


def _field(result, name: str):
    """A field of a batched result, whether it is a mapping or an object with attributes."""
    return result[name] if isinstance(result, dict) else getattr(result, name)


def run_bench_reference(configs: int = 1000, model: str = "llama3-70b", hardware: str = "mocap-4x4",
                        chunks: int = 16, dtype: str = "float32", seed: int = 0, repeats: int = 11) -> dict[str, Any]:
    """Time ``configs`` points through the reference and through one ``simulate_batch`` call.

    Returns:
      ``configs``; ``reference_wall_s`` (all points, one by one); ``vectorised_wall_s``
      (one ``simulate_batch`` call over all points after a warm-up call, median of
      ``repeats``; ``vectorised_best_s`` the fastest); ``compile_s`` (warm-up call
      minus timed call: tracing and compilation); ``speedup`` (reference / vectorised median);
      ``per_config_us`` for both; ``max_rel_err_latency`` between the two as a sanity check.
    """
    import mocap_jax
    from ..validation.reference import reference_simulate

    if chunks > 2 ** 10:
        raise ValueError(f"--chunks must be at most 1024, got {chunks}")
    pts = bench_configs(configs, seed, chunks)
    kw = dict(scheme="terapipe", chunks=chunks, release="stage", admission="streaming", num_batches=1)
    t0 = time.perf_counter()
    first = mocap_jax.simulate_batch(model, hardware, pts["seq_len"], batch=pts["batch"], partition=pts["partition"],
                                     dtype=dtype, **kw)
    np.asarray(_field(first, "prefill_latency_s"))
    warm = time.perf_counter() - t0
    walls = []
    for _ in range(repeats):
        t1 = time.perf_counter()
        vec = mocap_jax.simulate_batch(model, hardware, pts["seq_len"], batch=pts["batch"],
                                       partition=pts["partition"], dtype=dtype, **kw)
        lat_vec = np.asarray(_field(vec, "prefill_latency_s"), np.float64)
        walls.append(time.perf_counter() - t1)
    vec_wall = float(np.median(walls))
    lat_ref = np.empty(configs)
    t3 = time.perf_counter()
    for i in range(configs):
        r = reference_simulate(model, hardware, int(pts["seq_len"][i]), batch=int(pts["batch"][i]),
                               partition=pts["partition"][i], **kw)
        lat_ref[i] = r.prefill_latency_s
    ref_wall = time.perf_counter() - t3
    both_inf = np.isinf(lat_ref) & np.isinf(lat_vec)
    err = np.where(both_inf, 0.0, np.abs(lat_vec - lat_ref) / np.abs(lat_ref))
    err = np.where(np.isnan(err), np.inf, err)
    return dict(configs=configs, model=model, hardware=hardware, chunks=chunks, dtype=dtype,
                reference_wall_s=ref_wall, vectorised_wall_s=vec_wall, vectorised_best_s=float(min(walls)),
                compile_s=max(warm - vec_wall, 0.0),
                warmup_call_s=warm, speedup=ref_wall / vec_wall,
                reference_per_config_us=1e6 * ref_wall / configs, vectorised_per_config_us=1e6 * vec_wall / configs,
                max_rel_err_latency=float(err.max()), feasible_configs=int(np.isfinite(lat_ref).sum()))


def cmd_bench_reference(args) -> int:
    res = run_bench_reference(args.configs, args.model, args.hardware, args.chunks, args.dtype, args.seed)
    if args.json:
        print(json.dumps(_jsonable(res), indent=2))
        return 0
    print(f"bench reference: {res['configs']} configurations of {res['model']} on {res['hardware']} "
          f"({res['chunks']} random chunks, random batch and sequence length), {res['dtype']}")
    print(f"  event-driven reference  {res['reference_wall_s']:9.3f} s  ({res['reference_per_config_us']:10.1f} us/config)")
    print(f"  vectorised (one call)   {res['vectorised_wall_s']:9.3f} s  ({res['vectorised_per_config_us']:10.1f} us/config)")
    print(f"  compile (warm-up call)  {res['compile_s']:9.3f} s")
    print(f"  speed-up                {res['speedup']:9.1f} x")
    print(f"  latency agreement       {res['max_rel_err_latency']:9.2e} max relative error "
          f"({res['feasible_configs']} feasible)")
    return 0


__all__ = ["register", "cmd_validate", "cmd_bench_reference", "calibration_check", "run_bench_reference",
           "bench_configs", "format_validate", "format_mbkr", "mbkr_summary", "agreement_ok"]
