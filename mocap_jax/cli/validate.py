"""``mocap-jax validate`` and ``mocap-jax bench reference``.

``validate`` prints one report: the agreement of the vectorised evaluator with the event-driven
reference over random configurations where their semantics are identical (largest relative
error per metric, float32 and float64, and feasibility mismatches); the approximation error of
the array program's MBKR against the reference over configurations near the memory limit (mean
and max, against the targets); and the calibration of the cost model against measured execution
(MAPE), when available.  Exit code 1 when the exact agreement misses its tolerance (1e-9 in
float64 with no feasibility mismatch, 1e-4 in float32); the MBKR targets are reported.

``validate --profiles DIR`` instead checks the cost model against measured GPU operator
profiles (Vidur CSV layout; :mod:`mocap_jax.validation.profiles`), and ``validate --published
[FILE]`` against published end-to-end prefill measurements
(:mod:`mocap_jax.validation.published`).

``bench reference`` times the same configurations through the reference and through
one ``simulate_batch`` call and reports the speed-up; ``bench peer`` runs a published
simulator side by side (:mod:`mocap_jax.bench.peer`).
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from .common import check_figure_file, counted, non_negative_int, positive_int, seed

_LABELS = {
    "finish_times": "finish times (every item, stage)",
    "start_times": "start times (every item, stage)",
    "raw_latency_s": "prefill latency",
    "peak_mem_bytes_per_stage": "peak memory per stage",
    "kv_peak_bytes_per_stage": "peak KV per stage",
    "throughput_rps": "saturation throughput",
    "period_s": "saturation period",
    "bubble_fraction": "bubble fraction",
}


def register(subparsers, bench_subparsers) -> None:
    """Add ``validate`` to the top-level commands and ``reference`` to ``bench``."""
    p = subparsers.add_parser(
        "validate", help="check the simulator against the event-driven reference, and calibration MAPE",
        description="Run random configurations through the vectorised evaluator (float32 and float64) and the "
                    "event-driven reference and report the largest relative error per metric; report the mean "
                    "and max error of the array program's MBKR against the reference over configurations near "
                    "the memory limit (targets: mean <= 1%%, max <= 5%%); then the calibration MAPE of the cost "
                    "model. Exit code 1 if the exact agreement misses 1e-9 (float64) / 1e-4 (float32).")
    p.add_argument("--configs", type=positive_int, default=200, help="random configurations to compare (default 200)")
    p.add_argument("--seed", type=seed, default=0, help="seed of the configuration generators (default 0)")
    p.add_argument("--mbkr-configs", type=non_negative_int, default=1000,
                   help="MBKR configurations near the memory limit (default 1000; 0 skips the MBKR check)")
    p.add_argument("--mbkr-programs", type=positive_int, default=12,
                   help="compiled MBKR programs the MBKR configurations share (default 12)")
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
        "reference", help="speed of the vectorised evaluator against the event-driven reference",
        description="Time random TeraPipe configurations of one model and mesh (random partitions, batches and "
                    "sequence lengths) through one simulate_batch call (median of --repeats calls after a "
                    "warm-up call that compiles) and through the event-driven reference.")
    b.add_argument("--configs", type=positive_int, default=1000, help="configurations (default 1000)")
    b.add_argument("--model", default="llama3-70b", help="model preset (default llama3-70b)")
    b.add_argument("--hardware", default="mocap-4x4", help="mesh preset (default mocap-4x4)")
    b.add_argument("--chunks", type=positive_int, default=16, help="chunks per request (default 16)")
    b.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="vectorised precision")
    b.add_argument("--repeats", type=positive_int, default=5, help="timed vectorised calls (default 5)")
    b.add_argument("--seed", type=seed, default=0, help="seed (default 0)")
    b.add_argument("--json", action="store_true", help="print one JSON object")
    b.set_defaults(func=cmd_bench_reference)

    from ..bench.peer import register_bench

    register_bench(bench_subparsers)


# --------------------------------------------------------------------------- validate


def calibration_check(size: str = "small") -> dict[str, Any]:
    """The calibration check, if its module is installed: ``{"available": True, "calibration_mape": ...}``
    (MAPEs in percent; scalar fields only), else ``{"available": False, "reason": ...}``."""
    try:
        from ..validation.calibration import run_calibration
    except ImportError as e:
        if e.name != "mocap_jax.validation.calibration":
            raise
        return {"available": False, "reason": "mocap_jax.validation.calibration is not installed"}
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
        return float(x) if math.isfinite(float(x)) else str(float(x))
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x


def cmd_validate(args) -> int:
    if args.profiles is not None or args.published is not None:
        return cmd_measurements(args)
    if args.hardware is not None or args.figure is not None:
        raise ValueError("--hardware and --figure go with --profiles")

    import jax

    from ..validation.agreement import check_configs, run_reference_agreement
    from ..validation.agreement_mbkr import run_mbkr_agreement

    check_configs("--configs", args.configs)
    check_configs("--mbkr-configs", args.mbkr_configs, 0)

    calibration = {"available": False, "reason": "skipped (--no-calibration)"} if args.no_calibration \
        else calibration_check("small")
    reports = {"float32": run_reference_agreement(args.configs, args.seed, "float32")}
    jax.config.update("jax_enable_x64", True)
    reports["float64"] = run_reference_agreement(args.configs, args.seed, "float64")
    ok = all(r["within_tolerance"] for r in reports.values())
    mbkr = run_mbkr_agreement(args.mbkr_configs, args.seed, "float64", programs=args.mbkr_programs) \
        if args.mbkr_configs > 0 else None
    if args.json:
        out = dict(reference_ok=ok, reference=reports, mbkr=mbkr, calibration=calibration)
        print(json.dumps(_jsonable(out), indent=2))
    else:
        print(format_validate(reports, ok, mbkr, calibration))
    return 0 if ok else 1


def format_agreement(reports: dict[str, dict], ok: bool) -> list[str]:
    """Lines of the exact-agreement block (``reports``: float32 and float64 agreement reports)."""
    r32, r64 = reports["float32"], reports["float64"]
    lines = [f"reference agreement: {r64['configs']} random configurations, vectorised evaluator vs event-driven "
             f"reference (largest relative error)",
             f"  {'metric':34s} {'float32':>10s} {'float64':>10s}"]
    for m in r64["max_rel_err"]:
        lines.append(f"  {_LABELS.get(m, m):34s} {r32['max_rel_err'][m]:10.2e} {r64['max_rel_err'][m]:10.2e}")
    lines.append(f"  {'feasibility mismatches':34s} {r32['feasible_mismatches']:10d} {r64['feasible_mismatches']:10d}")
    lines.append(f"  {'infeasible configurations':34s} {r32['infeasible_configs']:10d} {r64['infeasible_configs']:10d}")
    lines.append(f"  tolerance 1e-4 (float32), 1e-9 (float64): {'PASS' if ok else 'FAIL'}")
    if not ok:
        for d, r in reports.items():
            worst = max(r["max_rel_err"], key=r["max_rel_err"].get)
            lines.append(f"  worst {d} {worst}: {r['worst'].get(worst, '')}")
            lines.extend(f"  {d} feasibility differs: {c}" for c in r["mismatched"][:3])
    return lines


def format_mbkr(m: dict[str, Any]) -> list[str]:
    """Lines of the MBKR approximation block."""
    pct = lambda v: f"{100 * v:.3f}%"
    row = lambda label, s: (f"    {label:26s} {s['configs']:5d} configs, {s['spilling']:5d} spill: latency "
                            f"{pct(s['latency_rel_err_mean'])} / {pct(s['latency_rel_err_max'])}, peak memory "
                            f"{pct(s['peak_mem_rel_err_mean'])} / {pct(s['peak_mem_rel_err_max'])}, "
                            f"{s['feasible_mismatches']} feasibility mismatches")
    programs = counted(m['programs'], 'program')
    lines = [f"MBKR approximation: {m['configs']} configurations near the memory limit ({programs}), "
             f"array program vs event-driven reference ({m['dtype']}; {m['spilling']} spill = "
             f"{100 * m['spilling_share']:.0f}%, {m['infeasible']} infeasible)",
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
    lines.extend(row(f"pairing {p}", s) for p, s in m["by_pairing"].items())
    lines.extend(row(f"spill {p}", s) for p, s in m["by_spill"].items() if s["configs"])
    if not m["within_target"]:
        lines.append(f"  worst latency: {m['worst_latency']}")
        lines.append(f"  worst peak memory: {m['worst_peak_mem']}")
    lines.extend(f"  feasibility differs: {c}" for c in m["mismatched"][:3])
    return lines


def format_validate(reports: dict[str, dict], ok: bool, mbkr: dict[str, Any] | None,
                    calibration: dict[str, Any]) -> str:
    """The human-readable ``validate`` report."""
    lines = format_agreement(reports, ok)
    if mbkr is not None:
        lines.extend(format_mbkr(mbkr))
    if calibration.get("available"):
        mape = lambda v: "n/a" if v is None else f"{float(v):.1f}%"
        lines.append(f"calibration (small): MAPE {mape(calibration.get('calibration_mape'))} on held-out points "
                     f"(linear baseline {mape(calibration.get('baseline_linear_mape'))})")
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

        if args.figure:
            check_figure_file(args.figure)

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


def cmd_bench_reference(args) -> int:
    from ..bench.machine import describe
    from ..validation.benchmark import run_bench_reference

    res = run_bench_reference(args.configs, args.model, args.hardware, args.chunks, args.dtype, args.seed,
                              args.repeats)
    if args.json:
        print(json.dumps(_jsonable(res), indent=2))
        return 0
    print(f"bench reference: {res['configs']} configurations of {res['model']} on {res['hardware']} "
          f"({res['chunks']} random chunks, random batch and sequence length, {res['num_batches']} batch), "
          f"{res['dtype']}, on {describe(res)}")
    print(f"  event-driven reference  {res['reference_wall_s']:10.3f} s  ({res['reference_per_config_us']:10.1f} us/config)")
    print(f"  vectorised (one call)   {res['vectorised_wall_s']:10.3f} s  ({res['vectorised_per_config_us']:10.1f} us/config,"
          f" median of {args.repeats}; best {res['vectorised_best_s']:.3f} s; {res['devices']} of "
          f"{res['local_devices']} x {res['device_kind']})")
    print(f"  compile (warm-up call)  {res['compile_s']:10.3f} s")
    print(f"  speed-up                {res['speedup']:10.1f} x")
    print(f"  latency agreement       {res['max_rel_err_latency']:10.2e} max relative error "
          f"({res['feasible_configs']} feasible)")
    return 0


__all__ = ["calibration_check", "cmd_bench_reference", "cmd_validate", "format_agreement", "format_mbkr",
           "format_validate", "register"]
