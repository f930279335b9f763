"""``mocap-jax wsc-llm explore|robustness|baselines`` and ``mocap-jax bench wsc-explore``.

The hardware design-space exploration, its robustness to the performance model's errors, the
de-confounded baselines, and the exploration's speed as a benchmark.
"""

from __future__ import annotations

import time
from pathlib import Path

from ..bench.machine import describe_devices, host, local_devices
from ..specs import checks
from ..wsc import baselines as bl
from ..wsc import bursts
from ..wsc import explore as ex
from ..wsc import figures as fg
from ..wsc import robustness as rb
from ..wsc.workload import WORKLOAD_PRESETS, WORKLOAD_TTFT_SLOS
from .common import check_figure_file, check_output_dir, counted, progress_bar
from .wsc_args import (METRIC_COLUMNS, emit_json, floats, metric_cells, names, program_dtype, serving_args,
                       serving_config, table)

EXPLORE_DEFAULTS = {"models": ",".join(ex.DEFAULT_MODELS), "workloads": ",".join(ex.DEFAULT_WORKLOADS),
                    "loads": ",".join(f"{x:g}" for x in ex.DEFAULT_LOADS),
                    "dram_gb": ",".join(f"{x:g}" for x in ex.DEFAULT_DRAM_GB),
                    "d2d_tbps": ",".join(f"{x:g}" for x in ex.DEFAULT_D2D_TBPS),
                    "grids": ",".join(f"{r}x{c}" for r, c in ex.DEFAULT_GRIDS), "max_requests": 1536}
QUICK = {"models": "llama2-7b,llama3-70b,llama3.1-405b", "dram_gb": "32,96", "d2d_tbps": "1.5,2.5", "grids": "6x9",
         "loads": "1.2", "max_requests": 256}
#: The exploration this project recorded before the link-level contention model: the default sweep
#: (216 design points, 152,832 simulated requests) in 140 s on the 2-core development machine of the
#: time.  A faster CPU runs that program faster too, so a same-CPU speed-up needs its time measured
#: on the machine at hand (``bench wsc-explore --baseline-s``; docs/wsc_llm.md, "Performance").
RECORDED_EXPLORE_S = 140.0
#: design points of the recorded sweep (the default one): the speed-ups compare like with like only there
RECORDED_POINTS = 216
#: the commit whose ``mocap-jax wsc-llm explore`` is the contention-free program the 140 s timed
BASELINE_COMMIT = "bdf1291"


def sweep_args(p) -> None:
    """Arguments of a hardware sweep (explore, robustness, bench wsc-explore)."""
    g = p.add_argument_group("sweep")
    g.add_argument("--models", default=EXPLORE_DEFAULTS["models"], help="comma-separated model presets")
    g.add_argument("--workloads", default=EXPLORE_DEFAULTS["workloads"],
                   help=f"comma-separated workload presets ({', '.join(WORKLOAD_PRESETS)})")
    g.add_argument("--loads", default=EXPLORE_DEFAULTS["loads"],
                   help=f"rates as multiples of the reference design's capacity (default {EXPLORE_DEFAULTS['loads']})")
    g.add_argument("--dram-gb", dest="dram_gb", default=EXPLORE_DEFAULTS["dram_gb"],
                   help=f"DRAM capacities per die, GB (default {EXPLORE_DEFAULTS['dram_gb']})")
    g.add_argument("--dram-tbps", help="DRAM bandwidths, TB/s, crossed with the capacities (default: capacity/32)")
    g.add_argument("--d2d-tbps", dest="d2d_tbps", default=EXPLORE_DEFAULTS["d2d_tbps"],
                   help=f"D2D bandwidths, TB/s (default {EXPLORE_DEFAULTS['d2d_tbps']})")
    g.add_argument("--grids", default=EXPLORE_DEFAULTS["grids"], help=f"die grids (default {EXPLORE_DEFAULTS['grids']})")
    g.add_argument("--requests", type=int, help="fixed requests per point (default: --window-s of arrivals)")
    g.add_argument("--window-s", type=float, default=8.0, help="seconds of arrivals per point (default 8)")
    g.add_argument("--max-requests", type=int, default=EXPLORE_DEFAULTS["max_requests"],
                   help=f"cap on requests per point (default {EXPLORE_DEFAULTS['max_requests']})")
    g.add_argument("--quick", action="store_true",
                   help="small sweep: 6x9, 32/96 GB, D2D 1.5/2.5, one rate, <= 256 requests")


def sweep_from_args(args) -> ex.Sweep:
    if args.quick:
        for k, v in QUICK.items():
            if getattr(args, k) == EXPLORE_DEFAULTS[k]:
                setattr(args, k, v)
    checks.positive("--window-s", args.window_s, hint=" Give the arrival window in seconds.")
    checks.integer("--max-requests", args.max_requests, 2)
    if args.requests is not None:
        checks.integer("--requests", args.requests, 2)
    hw = ex.template_points(ex.parse_grids(args.grids), floats(args.dram_gb, "--dram-gb"),
                            floats(args.d2d_tbps, "--d2d-tbps"),
                            None if args.dram_tbps is None else floats(args.dram_tbps, "--dram-tbps"))
    return ex.Sweep(tuple(names(args.models, "--models")), tuple(names(args.workloads, "--workloads")),
                    tuple(floats(args.loads, "--loads")), tuple(hw), requests=args.requests, window_s=args.window_s,
                    min_requests=min(64, args.max_requests), max_requests=args.max_requests, seed=args.seed)


def slo_text(config, workloads, args) -> str:
    if args.ttft_slo_s is not None:
        return f"{config.ttft_slo_s:g} s"
    return ", ".join(f"{w} {WORKLOAD_TTFT_SLOS.get(w, config.ttft_slo_s):g} s" for w in workloads)


def cmd_explore(args) -> int:
    config = serving_config(args)
    sweep = sweep_from_args(args)
    if args.burst_factor != 0:
        checks.integer("--burst-factor", args.burst_factor, 2, hint=" Give 0 to skip the check.")
    hw = sweep.hardware
    models, workloads, loads = sweep.models, sweep.workloads, sweep.loads
    check_output_dir(args.out)
    if not args.no_figure:
        check_figure_file(args.figure)
    slos = {} if args.ttft_slo_s is not None else None
    with progress_bar("simulating design points", "point", args.quiet) as advance:
        res = ex.explore(sweep, config, slos, program_dtype(args), progress=advance)
    out = Path(args.out)
    csv_path = res.write_csv(out / "wsc_explore.csv")
    best_path = ex.write_rows(res.best + res.best_per_model, out / "wsc_explore_best.csv")
    check = bursts_path = None
    if args.burst_factor:
        with progress_bar(f"checking the best designs with {args.burst_factor}x longer bursts", "point",
                          args.quiet) as advance:
            check = bursts.check_bursts(res, sweep, config, slos, args.burst_factor, program_dtype(args),
                                        progress=advance)
        bursts_path = ex.write_rows([dict(v, kind="verdict") for v in check.verdicts] +
                                    [dict(r, kind="point") for r in check.rows], out / "wsc_explore_bursts.csv")
    fig = None
    if not args.no_figure:
        fig = str(fg.plot_design_space(fg.run_design_space(res), args.figure))
    if args.json:
        emit_json({"best": res.best, "best_per_model": res.best_per_model, "timing": res.timing, "csv": str(csv_path),
                    "best_csv": str(best_path), "figure": fig, "rows": res.rows,
                    "bursts": None if check is None else {"factor": check.factor, "verdicts": check.verdicts,
                                                          "rows": check.rows, "timing": check.timing,
                                                          "csv": str(bursts_path)}})
        return 0
    t = res.timing
    print(f"WSC-LLM design-space exploration: {counted(len(hw), 'hardware point')} x {counted(len(models), 'model')} x "
          f"{counted(len(workloads), 'workload')} x {counted(len(loads), 'rate')} = {counted(t['points'], 'point')}, "
          f"{counted(t['simulated_requests'], 'request')}")
    print(f"rates (req/s) = load x the partition capacity of {ex.REFERENCE_HARDWARE}; SLOs TTFT "
          f"{slo_text(config, workloads, args)}, TPOT {config.tpot_slo_s * 1e3:g} ms; contention {config.contention}")
    print()
    print("best design per workload (score: geometric mean over models of SLO goodput summed over rates, "
          "normalised to the best point per model):")
    print("(subset 'shoreline': only points on the template trade-off D2D = 3 - DRAM TB/s / 2)")
    print(table(["workload", "subset", "best hardware", "score", "runner-up", "score "],
                [[b["workload"], b["subset"], b["hardware"], b["score_geomean"], b["runner_up"] or "-",
                  b["runner_up_score"] if b["runner_up_score"] is not None else float("nan")] for b in res.best]))
    print()
    print("best per workload and model:")
    print(table(["workload", "model", "subset", "best hardware", "goodput sum req/s", "E2E mean s", "every SLO met"],
                [[b["workload"], b["model"], b["subset"], b["hardware"], b["goodput_sum_rps"], b["e2e_mean_s"],
                  f"{b['points_meeting_every_slo']}/{b['points']}"] for b in res.best_per_model]))
    unsaturated = sorted({(b["model"], b["workload"]) for b in res.best_per_model if b["points_meeting_every_slo"] > 1})
    if unsaturated:
        print(f"\n'every SLO met': design points whose bursts met every SLO at every rate, so their goodput is the "
              f"offered rate and cannot rank them (mean E2E does). For {', '.join(f'{m} on {w}' for m, w in unsaturated)} "
              f"several are; longer bursts (--burst-factor, --max-requests, --window-s) or higher --loads show where "
              f"they saturate (docs/wsc_llm.md, 'What a finite burst measures').")
    if check is not None:
        print()
        print(burst_table(check, loads))
    print(f"\nresults: {csv_path}, {best_path}" + (f", {bursts_path}" if bursts_path else "") +
          (f"; figure: {fig}" if fig else ""))
    print(f"set-up {t['setup_s']:.1f} s, simulation {t['simulate_s']:.1f} s ({t['groups']} compiled program, compile "
          f"{t['compile_s']:.1f} s), {t['requests_per_wall_s']:.0f} simulated requests per wall-second" +
          ("" if check is None else f"; burst check {check.timing['total_s']:.1f} s "
           f"({counted(check.timing['points'], 'point')}, {counted(check.timing['simulated_requests'], 'request')})"))
    return 0


def burst_table(check: bursts.BurstCheck, loads) -> str:
    """The burst check as text: per (workload, model) the verdict and both contenders' goodput."""
    pair = lambda a, b: "-" if a is None else f"{a:.4g} -> {b:.4g}"
    heads = ["workload", "model", "verdict", "best (exploration)", "goodput req/s", "rival", "goodput req/s ",
             "best after"]
    rows = [[v["workload"], v["model"], v["verdict"], v["best"], pair(v["best_goodput_rps"], v["best_goodput_longer_rps"]),
             v["rival"] or "-", pair(v["rival_goodput_rps"], v["rival_goodput_longer_rps"]), v["best_after"]]
            for v in check.verdicts]
    return (f"does the best design hold for {check.factor}x longer bursts? Per workload and model the best, the "
            f"runner-up and the best point of other die grids and DRAMs, re-simulated at the highest rate "
            f"({max(loads):g}x); rival: the strongest of another grid or DRAM after the longer bursts; goodput at "
            f"that rate with the exploration's burst -> the longer one; 'tied': within "
            f"{bursts.TIE_RTOL:.0%} again\n" + table(heads, rows))


def cmd_baselines(args) -> int:
    config = serving_config(args)
    loads = floats(args.loads, "--loads")
    dtype = program_dtype(args)
    check_output_dir(args.out)
    if not args.no_figures:
        check_output_dir(args.figures_dir)
    res = bl.run_baselines(args.model, args.workload, loads, args.requests, args.wafer, args.cluster, config,
                           args.seed, dtype, ablations=not args.no_ablations, ablation_wafer=args.ablation_wafer)
    out = Path(args.out)
    rows_path = ex.write_rows(res.rows, out / "wsc_baselines.csv")
    gains_path = ex.write_rows(res.gains, out / "wsc_baselines_gains.csv")
    figs = []
    if not args.no_figures:
        fdir = Path(args.figures_dir)
        figs.append(str(fg.plot_latency_cdf(fg.run_latency_cdf(res), fdir / "wsc_latency_cdf.png")))
        if not args.no_ablations:
            figs.append(str(fg.plot_ablation(fg.run_ablation(res), fdir / "wsc_ablation.png")))
    if args.json:
        emit_json({"model": res.model, "workload": res.workload, "loads": list(res.loads), "rates": res.rates,
                    "reference": res.reference, "rows": res.rows, "gains": res.gains, "timing": res.timing,
                    "csv": [str(rows_path), str(gains_path)], "figures": figs})
        return 0
    print(f"WSC-LLM baselines: {res.model}, {res.workload}; {args.requests} requests per point; rates = load x "
          f"the partition capacity of {res.reference}; SLOs TTFT {config.ttft_slo_s:g} s, TPOT "
          f"{config.tpot_slo_s * 1e3:g} ms")
    heads = ["kind", "system", "load", "req/s", "prefill", "decode"] + [c for _, c in METRIC_COLUMNS]
    rows = []
    for r in res.rows:
        pre = f"{r.get('n_prefill', '-')}x{r['prefill']}" if r.get("feasible") else "infeasible"
        dec = f"{r.get('n_decode', '-')}x{r['decode']}" if r.get("feasible") else "-"
        rows.append([r["kind"], r["system"], r["load"], r["rate_rps"], pre, dec] + metric_cells(r))
    print(table(heads, rows))
    print("\ngains (goodput ratios; E2E speed-up = ratio of mean E2E latencies):")
    print(table(["load", "req/s", "sched. A100", "sched. wafer", "hw Splitwise", "hw WSC-LLM", "total",
                 "E2E sched. A100", "E2E sched. wafer", "E2E hw Splitwise", "E2E hw WSC-LLM"],
                [[g["load"], g["rate_rps"], g["scheduler_gain_a100"], g["scheduler_gain_wafer"],
                  g["hardware_gain_splitwise"], g["hardware_gain_wsc"], g["total_gain"], g["e2e_speedup_sched_a100"],
                  g["e2e_speedup_sched_wafer"], g["e2e_speedup_hw_splitwise"], g["e2e_speedup_hw_wsc"]]
                 for g in res.gains]))
    t = res.timing
    print(f"\nresults: {rows_path}, {gains_path}" + (f"; figures: {', '.join(figs)}" if figs else ""))
    print(f"simulation {t['simulate_s']:.1f} s ({t['groups']} compiled groups, compile {t['compile_s']:.1f} s), "
          f"{t['requests_per_wall_s']:.0f} simulated requests per wall-second")
    return 0


def cmd_robustness(args) -> int:
    config = serving_config(args)
    sweep = sweep_from_args(args)
    perts = rb.sample_perturbations(args.perturbations, args.seed, args.spread, (args.latency_min, args.latency_max))
    check_output_dir(args.out)
    if not args.no_figure:
        check_figure_file(args.figure)
    with progress_bar("simulating design points", "point", args.quiet) as advance:
        res = rb.run_robustness(sweep, perts, config, {} if args.ttft_slo_s is not None else None,
                                program_dtype(args), args.group, progress=advance)
    out = Path(args.out)
    paths = [str(ex.write_rows(res.summary, out / "wsc_robustness.csv")),
             str(ex.write_rows(res.per_perturbation, out / "wsc_robustness_runs.csv"))]
    fig = None if args.no_figure else str(fg.plot_robustness(fg.run_robustness_figure(res), args.figure))
    if args.json:
        emit_json({"summary": res.summary, "nominal": res.nominal_best, "timing": res.timing, "csv": paths,
                   "figure": fig})
        return 0
    print(f"WSC-LLM robustness: {len(perts)} perturbations of the performance model (efficiencies x "
          f"[{1 - args.spread:g}, {1 + args.spread:g}], hop latency x [{args.latency_min:g}, {args.latency_max:g}], "
          f"alpha in {', '.join(f'{a:g}' for a in rb.ALPHAS)}, contention max-min / proportional); "
          f"{len(sweep.hardware)} hardware points")
    print(table(["workload", "model", "nominal best", "runner-up", "margin", "stays best", "margin p10",
                 "margin median", "nominal best min rel."],
                [[r["workload"], r["model"], r["nominal_best"], r["nominal_runner_up"] or "-", r["nominal_margin"],
                  r["share_best_stays_best"], r["margin_p10"], r["margin_median"], r["nominal_best_relative_min"]]
                 for r in res.summary]))
    print(f"\nresults: {', '.join(paths)}" + (f"; figure: {fig}" if fig else ""))
    print(f"{res.timing['runs']} runs, {res.timing['simulated_requests']} simulated requests, "
          f"{res.timing['total_s']:.0f} s")
    return 0


def _baseline(name: str, seconds):
    """A same-machine wall time of the contention-free program, checked (None stays None)."""
    if seconds is None:
        return None
    return checks.positive(name, seconds, hint=" Give the contention-free program's wall time in seconds "
                           f"(commit {BASELINE_COMMIT}'s `mocap-jax wsc-llm explore` on this machine).")


def bench_explore(sweep: ex.Sweep, config, repeat: int = 1, progress=None, baseline_s: float | None = None) -> dict:
    """Wall time of the exploration (set-up, compilation and simulation), against the recorded 140 s
    and, given ``baseline_s``, against the contention-free program's wall time measured on this machine.
    ``progress``: optional callable given ``(points done, points)`` over all runs."""
    runs = []
    repeat = checks.integer("repeat", repeat, 1)
    baseline_s = _baseline("baseline_s", baseline_s)
    machine = host()
    for i in range(repeat):
        t0 = time.perf_counter()
        run_progress = None if progress is None else (lambda done, total, i=i: progress(i * total + done, repeat * total))
        res = ex.explore(sweep, config, progress=run_progress)
        runs.append(dict(res.timing, wall_s=time.perf_counter() - t0))
    best = min(r["wall_s"] for r in runs)
    same_cpu = {} if baseline_s is None else {"baseline_s": baseline_s, "speedup_vs_baseline": baseline_s / best}
    return {"benchmark": "wsc-explore", "points": runs[0]["points"], "simulated_requests": runs[0]["simulated_requests"],
            "contention": config.contention, "runs": runs, "wall_s_min": best,
            "recorded_s": RECORDED_EXPLORE_S, "speedup_vs_recorded": RECORDED_EXPLORE_S / best, **same_cpu,
            **local_devices(), **machine}


def cmd_bench_explore(args) -> int:
    config = serving_config(args)
    sweep = sweep_from_args(args)
    baseline_s = _baseline("--baseline-s", args.baseline_s)       # refused before the progress bar shows
    with progress_bar("simulating design points", "point", args.quiet) as advance:
        res = bench_explore(sweep, config, args.repeat, progress=advance, baseline_s=baseline_s)
    if args.json:
        emit_json(res)
        return 0
    print(f"wsc-explore: {res['points']} design points, {res['simulated_requests']} simulated requests, contention "
          f"{res['contention']}; {describe_devices(res)}")
    print(table(["run", "wall s", "set-up s", "simulation s", "compile s", "requests / wall-s"],
                [[i, r["wall_s"], r["setup_s"], r["simulate_s"], r["compile_s"], r["simulated_requests"] / r["wall_s"]]
                 for i, r in enumerate(res["runs"])]))
    line = (f"fastest {res['wall_s_min']:.1f} s: {res['speedup_vs_recorded']:.1f}x the {RECORDED_EXPLORE_S:g} s "
            f"recorded on the development machine when the target was set")
    if "baseline_s" in res:
        line += (f"; {res['speedup_vs_baseline']:.1f}x the contention-free program's {res['baseline_s']:g} s "
                 f"on this machine")
    else:
        line += (f" (a faster CPU runs that program faster too: time commit {BASELINE_COMMIT}'s `mocap-jax wsc-llm "
                 f"explore` here and pass --baseline-s for a same-CPU speed-up)")
    if res["points"] != RECORDED_POINTS:
        line += (f"; the recorded and baseline times are of the default {RECORDED_POINTS}-point sweep, not of this "
                 f"{res['points']}-point one")
    print(line)
    return 0


def register_explore(sub, bench_sub) -> None:
    """``wsc-llm explore|robustness|baselines`` and ``bench wsc-explore``."""
    e = sub.add_parser("explore", help="hardware design-space exploration (batched serving simulation)")
    sweep_args(e)
    e.add_argument("--out", default="results", help="directory of the CSV results (default results/)")
    e.add_argument("--figure", default="figures/wsc_design_space.png", help="design-space figure path")
    e.add_argument("--no-figure", action="store_true")
    e.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    e.add_argument("--burst-factor", type=int, default=bursts.DEFAULT_FACTOR,
                   help=f"re-simulate each best design and its contenders at the highest rate with bursts this many "
                        f"times longer, and say whether it holds (default {bursts.DEFAULT_FACTOR}; 0 skips)")
    serving_args(e, requests=None)
    e.set_defaults(func=cmd_explore)

    r = sub.add_parser("robustness", help="does the best design stay best when the performance model errs?")
    sweep_args(r)
    r.add_argument("--perturbations", type=int, default=100, help="perturbations of the model (default 100)")
    r.add_argument("--spread", type=float, default=0.15, help="efficiencies vary by +- this share (default 0.15)")
    r.add_argument("--latency-min", type=float, default=0.5, help="smallest hop-latency factor (default 0.5)")
    r.add_argument("--latency-max", type=float, default=2.0, help="largest hop-latency factor (default 2)")
    r.add_argument("--group", type=int, default=10, help="perturbations simulated together (default 10)")
    r.add_argument("--out", default="results", help="directory of the CSV results (default results/)")
    r.add_argument("--figure", default="figures/wsc_robustness.png", help="robustness figure path")
    r.add_argument("--no-figure", action="store_true")
    r.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    serving_args(r, requests=None)
    r.set_defaults(func=cmd_robustness)

    b = sub.add_parser("baselines", help="Splitwise vs WSC-LLM on the A100 cluster and the wafer, plus ablations")
    b.add_argument("--model", default="llama3-70b", help="model preset (default llama3-70b)")
    b.add_argument("--workload", default="azure-conv", help="workload preset (default azure-conv)")
    b.add_argument("--loads", default="0.5,1,1.5,2",
                   help="rates as multiples of the A100 + Splitwise capacity (default 0.5,1,1.5,2)")
    b.add_argument("--wafer", default="wsc-llm-64g", help="wafer preset (default wsc-llm-64g)")
    b.add_argument("--cluster", default="a100-cluster", help="GPU cluster preset (default a100-cluster)")
    b.add_argument("--no-ablations", action="store_true")
    b.add_argument("--ablation-wafer", help="hardware of the ablations (default: --wafer), e.g. wsc-llm-32g")
    b.add_argument("--out", default="results", help="directory of the CSV results (default results/)")
    b.add_argument("--figures-dir", default="figures", help="directory of the figures (default figures/)")
    b.add_argument("--no-figures", action="store_true")
    serving_args(b, requests=800)
    b.set_defaults(func=cmd_baselines)

    be = bench_sub.add_parser("wsc-explore", help="WSC-LLM design-space exploration: wall time of the whole sweep")
    sweep_args(be)
    be.add_argument("--repeat", type=int, default=1, help="runs (the fastest is reported; default 1)")
    be.add_argument("--baseline-s", dest="baseline_s", type=float,
                    help=f"wall time in seconds of the contention-free program (commit {BASELINE_COMMIT}'s `mocap-jax "
                         f"wsc-llm explore`) on this machine: the speed-up is also reported against it")
    be.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    serving_args(be, requests=None)
    be.set_defaults(func=cmd_bench_explore)


__all__ = ["register_explore", "bench_explore", "RECORDED_EXPLORE_S", "RECORDED_POINTS", "BASELINE_COMMIT"]
