"""``mocap-jax wsc-llm trace|serve`` and ``mocap-jax bench wsc-serving``.

Workload statistics, the batched serving simulation of one design point (optionally checked
against the event-driven reference), and the array program's speed against the reference.
"""

from __future__ import annotations

import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from ..bench.machine import describe_devices, host, local_devices
from ..specs import SpecError, checks, get_model
from ..wsc import reference as ref
from ..wsc.explore import write_rows
from ..wsc.metrics import agreement
from ..wsc.memory import POLICIES
from ..wsc.serving import simulate
from ..wsc.setup import CONTENTION, PLACEMENTS, SCHEDULERS, ServingConfig, build_setup, workload_for
from ..wsc.synthetic import LENGTH_FITS, get_trace, resolve_workload_name, synthetic_trace
from ..wsc.workload import WORKLOAD_PRESETS
from .common import check_csv_file, seed
from .wsc_args import (METRIC_COLUMNS, design_point_args, emit_json, hardware_line, metric_cells, program_dtype,
                       serving_args, serving_config, table, wafer_from_args)


def cmd_trace(args) -> int:
    if args.requests is not None:
        checks.integer("--requests", args.requests, 1, checks.LIMITS["requests"],
                       " Pass how many requests of the trace to read, e.g. 1000.")
    tr = get_trace(args.workload, args.requests, args.rate, args.seed)
    summ = tr.summary()
    fit = None
    if tr.name in LENGTH_FITS and not str(args.workload).lower().endswith(".csv"):
        fit = dict(LENGTH_FITS[tr.name].moments(), summary_mean_prompt=WORKLOAD_PRESETS[tr.name].mean_prompt,
                   summary_mean_output=WORKLOAD_PRESETS[tr.name].mean_output)
    if args.json:
        emit_json({"trace": summ, "fitted_distribution": fit})
        return 0
    src = "synthetic (Poisson, fitted lengths)" if fit is not None else "trace file"
    print(f"workload {tr.name}: {src}")
    print(table(["requests", "span s", "rate req/s", "shared stamps", "prompt mean", "prompt p50", "prompt max",
                 "output mean", "output p50", "output max"],
                [[summ["requests"], summ["span_s"], summ["rate_rps"], summ["shared_timestamps"], summ["prompt_mean"],
                  summ["prompt_median"], summ["prompt_max"], summ["output_mean"], summ["output_median"],
                  summ["output_max"]]]))
    if fit:
        print(f"\nfitted distribution (Monte Carlo): mean prompt {fit['mean_prompt']:.0f}, mean output "
              f"{fit['mean_output']:.1f}, E[prompt x output] {fit['mean_prompt_x_output']:.0f} tokens^2")
    return 0


def cmd_serve(args) -> int:
    from_file = str(args.workload).lower().endswith(".csv")
    config = serving_config(args, None if from_file else resolve_workload_name(args.workload, traces=True))
    if args.rate is not None:
        checks.load("--rate", args.rate)
    if args.load is not None and (not args.load > 0 or not math.isfinite(args.load)):
        raise SpecError(f"--load must be a positive number, got {args.load}")
    if args.rate is not None and args.load is not None:
        raise SpecError("give --rate or --load, not both")
    if args.out:
        check_csv_file(args.out)
    dtype = program_dtype(args)
    if args.check_reference:
        jax.config.update("jax_enable_x64", True)
    model = get_model(args.model)
    wafer = wafer_from_args(args)
    trace0 = get_trace(args.workload, args.requests, None, args.seed)
    setup = build_setup(model, wafer, workload_for(trace0), args.scheduler, args.memory, args.placement, config)
    if not setup.feasible:
        raise SpecError(f"{model.name} cannot be served on {wafer.name} with the {args.scheduler} scheduler: "
                        f"{setup.reason}")
    rate = args.rate if args.rate is not None else (args.load or 0.8) * setup.served_rps
    trace = get_trace(args.workload, args.requests, rate, args.seed)
    rep = simulate([(setup, trace)], dtype=dtype)
    res = rep.results[0]
    check = None
    if args.check_reference:
        r64 = simulate([(setup, trace)], dtype=jnp.float64).results[0] if dtype != jnp.float64 else res
        rres, rout = ref.reference_result(setup, trace)
        check = {"float64": agreement(r64, rres), "reference_wall_s": rout.wall_s, "reference_events": rout.events}
        if dtype != jnp.float64:
            check["float32_vs_reference"] = agreement(res, rres)
    if args.out:
        write_rows([res.row()], args.out)
    if args.json:
        emit_json({"setup": setup.describe(), "trace": trace.summary(), "metrics": res.metrics,
                    "reference_check": check, "wall_s": rep.wall_s, "compile_s": rep.compile_s})
        return 0
    d = setup.describe()
    print(f"WSC-LLM serving: {model.name} on {wafer.name} ({hardware_line(wafer)})")
    print(f"scheduler {setup.scheduler} (placement {setup.placement}, memory {setup.memory_policy}): "
          f"{d['n_prefill']} x prefill {d['prefill']}, {d['n_decode']} x decode {d['decode']}, batch cap "
          f"{d['batch_cap']}, partition capacity {d['served_rps']:.1f} req/s")
    print(f"workload {trace.name}: {len(trace)} requests at {trace.rate:.4g} req/s; SLOs TTFT {config.ttft_slo_s:g} s, "
          f"TPOT {config.tpot_slo_s * 1e3:g} ms")
    print()
    print(table([c for _, c in METRIC_COLUMNS], [metric_cells(res.metrics)]))
    print(f"\nfinished {res.metrics['finished']} / {len(trace)} (dropped {res.metrics['dropped']}), makespan "
          f"{res.metrics['makespan_s']:.1f} s, {res.metrics['events']} events (+{res.metrics['leaped']} "
          f"fast-forwarded decode iterations); simulation {rep.wall_s:.2f} s (compile {rep.compile_s:.2f} s)")
    if check:
        a = check["float64"]
        print(f"reference check (float64 array vs event-driven reference, {check['reference_events']} events, "
              f"{check['reference_wall_s']:.2f} s): same finished set {'yes' if a['same_finished'] else 'NO'}; "
              f"max relative error TTFT {a['ttft_max_rel_err']:.1e}, TPOT {a['tpot_max_rel_err']:.1e}, "
              f"E2E {a['e2e_max_rel_err']:.1e}")
        if "float32_vs_reference" in check:
            b = check["float32_vs_reference"]
            print(f"float32 array vs reference: mean relative error E2E {b['e2e_mean_rel_err']:.1e} (max "
                  f"{b['e2e_max_rel_err']:.1e})")
    return 0


def bench_serving(model: str = "llama3-70b", hardware: str = "wsc-llm-64g", workload: str = "azure-conv",
                  points: int = 32, requests: int = 200, reference_points: int | None = None, load: float = 0.8,
                  seed: int = 0, dtype=None, config=None) -> dict:
    """Simulated requests per wall-second of the batched array program vs the event-driven reference.

    ``points`` design points (the same set-up, different traces: seeds ``seed..seed+points-1``)
    run as one ``jit(vmap)`` batch (timed after a warm-up call, compile reported separately);
    the reference runs ``reference_points`` of the same points (default all) one by one.
    """
    dtype = jnp.float32 if dtype is None else dtype
    if points < 1 or requests < 2:
        raise SpecError("--points must be >= 1 and --requests >= 2")
    reference_points = points if reference_points is None else reference_points
    if not 1 <= reference_points <= points:
        raise SpecError(f"--reference-points must be between 1 and --points ({points}), got {reference_points}")
    w = resolve_workload_name(workload)
    machine = host()
    setup = build_setup(model, hardware, WORKLOAD_PRESETS[w], "wsc", config=config)
    if not setup.feasible:
        raise SpecError(f"{model} cannot be served on {hardware}: {setup.reason}")
    pts = [(setup, synthetic_trace(w, requests, load * setup.served_rps, seed + k)) for k in range(points)]
    first = simulate(pts, dtype=dtype)          # includes compilation
    warm = simulate(pts, dtype=dtype)
    t0 = time.perf_counter()
    refs = [ref.reference_result(s, t) for s, t in pts[:reference_points]]
    ref_s = time.perf_counter() - t0
    errs = [agreement(a, r) for a, (r, _) in zip(warm.results, refs)]
    n_arr = points * requests
    n_ref = reference_points * requests
    arr_rps = n_arr / warm.wall_s
    ref_rps = n_ref / ref_s
    return {"benchmark": "wsc-serving", "model": setup.model.name, "hardware": setup.wafer.name, "workload": w,
            "points": points, "requests_per_point": requests, "rate_rps": load * setup.served_rps,
            "dtype": str(np.dtype(dtype)), "array_wall_s": warm.wall_s, "array_first_call_s": first.wall_s,
            "compile_s": first.compile_s, "array_requests_per_wall_s": arr_rps,
            "array_requests_per_wall_s_incl_compile": n_arr / first.wall_s, "reference_points": reference_points,
            "reference_wall_s": ref_s, "reference_requests_per_wall_s": ref_rps, "speedup": arr_rps / ref_rps,
            "speedup_incl_compile": (n_arr / first.wall_s) / ref_rps,
            "e2e_mean_rel_err_max": max(e["e2e_mean_rel_err"] for e in errs),
            "e2e_max_rel_err_max": max(e["e2e_max_rel_err"] for e in errs),
            "same_finished_all": all(e["same_finished"] for e in errs), **local_devices(), **machine}


def cmd_bench_serving(args) -> int:
    for name in ("points", "requests", "reference_points"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise SpecError(f"--{name.replace('_', '-')} must be a positive integer, got {v}")
    if not args.load > 0:
        raise SpecError(f"--load must be positive, got {args.load}")
    if args.max_batch < 1:
        raise SpecError(f"--max-batch must be a positive integer, got {args.max_batch}")
    contention = checks.choice("contention rule", args.contention, CONTENTION)
    res = bench_serving(args.model, args.hardware, args.workload, args.points, args.requests, args.reference_points,
                        args.load, args.seed, program_dtype(args),
                        ServingConfig(max_batch=args.max_batch, contention=contention))
    if args.json:
        emit_json(res)
        return 0
    print(f"wsc-serving: {res['model']} on {res['hardware']}, {res['workload']} at {res['rate_rps']:.1f} req/s; "
          f"{res['points']} design points x {res['requests_per_point']} requests ({res['dtype']}); "
          f"{describe_devices(res)}")
    print(table(["simulator", "points", "wall s", "requests / wall-s"],
                [["array jit(vmap(scan)), warm", res["points"], res["array_wall_s"], res["array_requests_per_wall_s"]],
                 ["array, first call (incl. compile)", res["points"], res["array_first_call_s"],
                  res["array_requests_per_wall_s_incl_compile"]],
                 ["event-driven reference", res["reference_points"], res["reference_wall_s"],
                  res["reference_requests_per_wall_s"]]]))
    print(f"speed-up {res['speedup']:.1f}x warm ({res['speedup_incl_compile']:.1f}x incl. compile); agreement: same "
          f"finished sets {'yes' if res['same_finished_all'] else 'NO'}, E2E max relative error "
          f"{res['e2e_max_rel_err_max']:.1e}")
    return 0


def register_serving(sub, bench_sub) -> None:
    """``wsc-llm trace|serve`` and ``bench wsc-serving``."""
    tr = sub.add_parser("trace", help="statistics of a workload: synthetic preset or Azure-format trace .csv")
    tr.add_argument("--workload", default="azure-conv",
                    help=f"{', '.join(WORKLOAD_PRESETS)} (aliases code, conv) or an Azure-format trace .csv")
    tr.add_argument("--requests", type=int, help="first N requests (default: 1000 for a preset, all for a file)")
    tr.add_argument("--rate", type=float, help="rescale to this arrival rate, req/s")
    tr.add_argument("--seed", type=seed, default=0)
    tr.add_argument("--json", action="store_true", help="print JSON instead of tables")
    tr.set_defaults(func=cmd_trace)

    sv_ = sub.add_parser("serve", help="simulate serving one design point (array program; optional reference check)")
    g = design_point_args(sv_)
    g.add_argument("--rate", type=float, help="offered rate, req/s (default 0.8 x the partition capacity)")
    g.add_argument("--load", type=float, help="offered rate as a multiple of the partition capacity")
    s = sv_.add_argument_group("scheduler")
    s.add_argument("--scheduler", default="wsc", help=f"{', '.join(SCHEDULERS)} (default wsc)")
    s.add_argument("--memory", help=f"KV memory policy: {', '.join(POLICIES)} (default: greedy for wsc)")
    s.add_argument("--placement", help=f"instance placement: {', '.join(PLACEMENTS)}")
    sv_.add_argument("--check-reference", action="store_true",
                     help="also run the event-driven reference and report the agreement")
    sv_.add_argument("--out", metavar="CSV", help="write the metrics row to this CSV file")
    serving_args(sv_, requests=300)
    sv_.set_defaults(func=cmd_serve)

    bs = bench_sub.add_parser("wsc-serving", help="WSC-LLM serving: array program vs event-driven reference")
    bs.add_argument("--model", default="llama3-70b")
    bs.add_argument("--hardware", default="wsc-llm-64g")
    bs.add_argument("--workload", default="azure-conv")
    bs.add_argument("--points", type=int, default=32, help="design points in the batch (default 32)")
    bs.add_argument("--requests", type=int, default=200, help="requests per point (default 200)")
    bs.add_argument("--reference-points", type=int, help="points the reference runs (default all)")
    bs.add_argument("--load", type=float, default=0.8, help="rate as a multiple of the partition capacity")
    bs.add_argument("--max-batch", type=int, default=256, help="largest decode batch (default 256)")
    bs.add_argument("--seed", type=seed, default=0)
    bs.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    bs.add_argument("--contention", default="max-min", help=f"{', '.join(CONTENTION)} (default max-min)")
    bs.add_argument("--json", action="store_true")
    bs.set_defaults(func=cmd_bench_serving)


__all__ = ["register_serving", "bench_serving"]
