"""``mocap-jax wsc-llm hardware|partition|place|memory`` and ``mocap-jax bench wsc-partition``.

The offline decisions of WSC-LLM: hardware presets, the resource partition, decode-centred
placement with its TransferCost, and the KV memory scheduler against local-only KV and an LP
optimum.
"""

from __future__ import annotations

import math
import time

import numpy as np

from ..specs import LIMITS, SpecError, checks
from ..wsc import memory as mem
from ..wsc import memory_optimal as mopt
from ..wsc import memory_sim as msim
from ..wsc import partition as part
from ..wsc import placement as plc
from ..wsc.placement_compare import MAX_RANDOM_SAMPLES, compare_placements
from ..wsc.figures_wafer import plot_placement
from ..wsc.hardware import WAFER_PRESETS
from ..wsc.layout import check_alpha
from .common import check_figure_file, seed
from .wsc_args import common_args, emit_json, hardware_line, instance_args, offline_setup, resolve_instances, table


def cmd_hardware(args) -> int:
    rows = [w.summary() for w in WAFER_PRESETS.values()]
    if args.json:
        emit_json(rows)
        return 0
    print(table(["name", "topology", "grid", "TFLOP/s/die", "DRAM GB", "DRAM TB/s", "link TB/s", "description"],
                [[r["name"], r["topology"], r["grid"], r["tflops_per_die"], r["dram_gb_per_die"],
                  r["dram_tbps_per_die"], r["link_tbps"], r["description"]] for r in rows]))
    print("\nAlso: wsc-RxC (any die grid, 64 GB / 2 TB/s / 2 TB/s dies) and a100-cluster-NxG; override fields with "
          "--rows --cols --dram-gb --dram-tbps --d2d-tbps.")
    return 0


def _cand_row(c: part.Candidate, phase: str):
    if phase == "prefill":
        return ["prefill", f"{c.config.rows}x{c.config.cols}", c.config.strategy, c.config.dies, c.weight_gb_per_die,
                c.prefill_rps, c.prefill_rps_per_die, c.prefill_iter_s * 1e3, c.ttft_s, "-"]
    return ["decode", f"{c.config.rows}x{c.config.cols}", c.config.strategy, c.config.dies, c.weight_gb_per_die,
            c.decode_rps, c.decode_rps_per_die, c.tpot_s * 1e3 if c.decode_batch else float("nan"), "-",
            c.decode_batch]


def cmd_partition(args) -> int:
    if args.top < 1:
        raise SpecError(f"--top must be a positive integer, got {args.top}")
    model, wafer, workload, strategies = offline_setup(args)
    res = part.partition(model, wafer, workload, strategies=strategies, chunk_tokens=args.chunk,
                         tpot_slo_s=args.tpot_slo_ms / 1e3, ttft_slo_s=args.ttft_slo_s, max_batch=args.max_batch)
    if args.json:
        d = res.to_dict()
        d["hardware"] = wafer.summary()
        d["workload_summary"] = workload.summary()
        emit_json(d)
        return 0
    print(f"WSC-LLM partition: {model.name} on {wafer.name} ({hardware_line(wafer)})")
    print(f"workload {workload.name}: {workload.rate:.2f} req/s, mean prompt {workload.mean_prompt:.0f} / output "
          f"{workload.mean_output:.0f} tokens; chunk {args.chunk} tokens, TPOT SLO {args.tpot_slo_ms:g} ms, "
          f"TTFT SLO {args.ttft_slo_s:g} s; strategies {', '.join(strategies)}")
    print()
    heads = ["phase", "instance", "strategy", "dies", "weights GB/die", "req/s", "req/s/die", "iter ms", "TTFT s",
             "batch"]
    rows = []
    for phase, key in (("prefill", "prefill_rps_per_die"), ("decode", "decode_rps_per_die")):
        ok = sorted([c for c in res.candidates if getattr(c, key) > 0], key=lambda c: -getattr(c, key))
        rows += [_cand_row(c, phase) for c in ok[:args.top]]
        n_bad = sum(1 for c in res.candidates if getattr(c, key) <= 0)
        if n_bad:
            rows.append([phase, f"({n_bad} infeasible)", "", "", "", "", "", "", "", ""])
    print(f"candidates (best {args.top} per phase by goodput per die; iter = prefill iteration / decode TPOT):")
    print(table(heads, rows))
    print()
    print("choice:")
    print(table(["phase", "instance", "strategy", "count", "req/s each", "capacity req/s"],
                [["prefill", f"{res.prefill.config.rows}x{res.prefill.config.cols}", res.prefill.config.strategy,
                  res.n_prefill, res.prefill.prefill_rps, res.prefill_capacity_rps],
                 ["decode", f"{res.decode.config.rows}x{res.decode.config.cols}", res.decode.config.strategy,
                  res.n_decode, res.decode.decode_rps, res.decode_capacity_rps]]))
    verdict = "met" if res.meets_rate else "NOT met"
    print(f"dies used {res.dies_used} / {res.dies_total}; served {res.served_rps:.1f} req/s; offered "
          f"{res.offered_rps:.2f} req/s {verdict} (needs at least {res.min_prefill_for_rate} prefill and "
          f"{res.min_decode_for_rate} decode instances)")
    print(f"partition runtime {res.runtime_s:.2f} s (candidate evaluation {res.evaluate_s:.2f} s, "
          f"{len(res.candidates)} candidates)")
    return 0


def _parse_alphas(text: str) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SpecError(f"--alphas expects comma-separated numbers >= 1, got {text!r}") from None
    if not vals:
        raise SpecError("--alphas needs at least one value")
    return [check_alpha(a, "--alphas") for a in vals]


def cmd_place(args) -> int:
    check_alpha(args.alpha, "--alpha")
    alphas = _parse_alphas(args.alphas)
    bounds = (("random_samples", MAX_RANDOM_SAMPLES), ("chains", LIMITS["chains"]), ("steps", LIMITS["steps"]))
    for name, hi in bounds:
        checks.integer(f"--{name.replace('_', '-')}", getattr(args, name), 1, hi)
    if args.figure:
        check_figure_file(args.figure)
    model, wafer, workload, strategies = offline_setup(args)
    if not wafer.is_mesh:
        raise SpecError(f"placement is defined on a mesh wafer; {wafer.name} is a GPU cluster")
    pc, n_p, dc, n_d, _ = resolve_instances(args, model, wafer, workload, strategies)
    pshape, dshape = (pc.config.rows, pc.config.cols), (dc.config.rows, dc.config.cols)
    t0 = time.perf_counter()
    layout = plc.decode_centred_placement(wafer, pshape, n_p, dshape, n_d, args.alpha)
    rep = plc.transfer_cost(wafer, layout, args.alpha)
    rows, best = compare_placements(wafer, pshape, n_p, dshape, n_d, alphas, args.random_samples, args.chains,
                                        args.steps, args.seed)
    elapsed = time.perf_counter() - t0
    fig = None
    if args.figure:
        which = layout if args.figure_layout == "decode-centred" else best.get(args.alpha) or \
            plc.anneal_placement(wafer, layout, args.alpha, args.chains, args.steps, args.seed).layout
        fig = str(plot_placement(wafer, which, args.figure, args.alpha,
                                     title=f"{model.name} on {wafer.name}: {args.figure_layout} placement, "
                                           f"TransferCost {plc.transfer_cost(wafer, which, args.alpha).cost:.1f} "
                                           f"(alpha={args.alpha:g})"))
    if args.json:
        emit_json({"wafer": wafer.name, "model": model.name, "alpha": args.alpha,
                    "prefill": {"rows": pshape[0], "cols": pshape[1], "count": n_p, "strategy": pc.config.strategy},
                    "decode": {"rows": dshape[0], "cols": dshape[1], "count": n_d, "strategy": dc.config.strategy},
                    "layout": layout.to_dict(), "transfer_cost": rep.cost, "hop_sum": rep.hop_sum,
                    "shared_links": rep.shared_links, "max_link_use": rep.max_link_use,
                    "nearest_decode": rep.nearest, "alpha_sensitivity": [r.to_dict() for r in rows],
                    "searched_layouts": {str(a): l.to_dict() for a, l in best.items()}, "figure": fig,
                    "runtime_s": elapsed})
        return 0
    print(f"WSC-LLM placement: {model.name} on {wafer.name} ({hardware_line(wafer)})")
    print(f"{n_p} x prefill {pshape[0]}x{pshape[1]} ({pc.config.strategy}), {n_d} x decode {dshape[0]}x{dshape[1]} "
          f"({dc.config.strategy}); P = prefill, D = decode, . = idle die")
    print()
    print(layout.ascii())
    print()
    print(f"TransferCost (decode-centred, alpha {args.alpha:g}): {rep.cost:.1f}  (sum of hops {rep.hop_sum}, "
          f"shared links {rep.shared_links}, busiest link used {rep.max_link_use}x)")
    print()
    print(f"alpha sensitivity ({args.random_samples} random layouts; searched = "
          f"{rows[0].search_method if rows else '-'}):")
    print(table(["alpha", "decode-centred", "random mean", "random std", "random min", "searched",
                 "decode-centred / searched"],
                [[r.alpha, r.decode_centred, r.random_mean, r.random_std, r.random_min, r.searched,
                  r.decode_centred / r.searched if r.searched > 0 else float("nan")] for r in rows]))
    if fig:
        print(f"\nfigure: {fig}")
    print(f"placement runtime {elapsed:.2f} s")
    return 0


def cmd_memory(args) -> int:
    checks.integer("--requests", args.requests, 1, LIMITS["requests"])
    if args.decode_batch is not None and args.decode_batch < 1:
        raise SpecError(f"--decode-batch must be a positive integer, got {args.decode_batch}")
    check_alpha(args.alpha, "--alpha")
    model, wafer, workload, strategies = offline_setup(args)
    if not wafer.is_mesh:
        raise SpecError(f"the memory scheduler places KV on a mesh wafer's DRAM; {wafer.name} is a GPU cluster "
                        f"(there KV stays local to the decode GPUs)")
    pc, n_p, dc, n_d, _ = resolve_instances(args, model, wafer, workload, strategies)
    pshape, dshape = (pc.config.rows, pc.config.cols), (dc.config.rows, dc.config.cols)
    layout = plc.decode_centred_placement(wafer, pshape, n_p, dshape, n_d, args.alpha)
    budget = mem.die_budget(model, wafer, layout, pc.config, dc.config, args.chunk, args.max_batch,
                            workload.max_prompt)
    batch = args.decode_batch or max(dc.decode_batch_slo, 1)
    arrivals, prompt, output = workload.sample(args.requests, args.seed)
    kv_per_token = model.kv_bytes_per_token_layer(wafer.kv_bytes) * model.layers
    tpot = dc.tpot_s if math.isfinite(dc.tpot_s) else args.tpot_slo_ms / 1e3
    reqs = msim.synthetic_requests(layout, prompt, output, arrivals, pc.prefill_iter_s, args.chunk, kv_per_token, tpot)
    t0 = time.perf_counter()
    sims = {p: msim.simulate_kv(wafer, layout, budget, reqs, batch, p) for p in mem.POLICIES}
    t_sim = time.perf_counter() - t0
    g = sims["greedy"]
    ids = g.resident_at(g.peak_kv_s)
    snapshot = []
    if not args.no_optimal and len(ids):
        snapshot = mopt.compare_snapshot(wafer, layout, budget.free, reqs.prefill[ids], g.request_decode[ids],
                                        reqs.kv_bytes[ids])
    grid = lambda a: np.asarray(a).reshape(wafer.rows, wafer.cols)
    if args.json:
        emit_json({"wafer": wafer.name, "model": model.name, "workload": workload.name, "rate_rps": workload.rate,
                    "requests": args.requests, "decode_batch": batch, "layout": layout.to_dict(),
                    "free_gb_per_die": grid(budget.free / 1e9),
                    "policies": {p: dict(s.row(), peak_util=grid(s.peak_util), mean_util=grid(s.mean_util))
                                 for p, s in sims.items()},
                    "snapshot": {"time_s": g.peak_kv_s, "requests": int(len(ids)),
                                 "results": [s.row() for s in snapshot]},
                    "simulation_s": t_sim})
        return 0
    print(f"WSC-LLM memory scheduler: {model.name} on {wafer.name} ({hardware_line(wafer)})")
    print(f"{n_p} x prefill {pshape[0]}x{pshape[1]}, {n_d} x decode {dshape[0]}x{dshape[1]} (decode-centred); "
          f"{args.requests} requests of {workload.name} at {workload.rate:.1f} req/s; {batch} decode slots per "
          f"instance; KV {kv_per_token / 1e6:.3f} MB/token")
    print()
    print("over time (pause = prefill stopped because the KV did not fit):")
    print(table(["policy", "placed", "paused req", "pause total s", "pause max s", "remote GB", "KV hop-GB",
                 "peak util", "mean util"],
                [[r["policy"], r["placed"], r["paused_requests"], r["pause_total_s"], r["pause_max_s"],
                  r["remote_gb"], r["kv_hop_gb"], r["peak_util_max"], r["mean_util_avg"]]
                 for r in (s.row() for s in sims.values())]))
    if snapshot:
        print()
        print(f"snapshot of the {len(ids)} requests resident at the greedy run's KV peak (t = {g.peak_kv_s:.2f} s), "
              f"each policy placing them from empty (optimal-lp: LP relaxation, may split requests):")
        print(table(["policy", "requests placed", "placed GB", "demand GB", "remote GB", "KV hop-GB"],
                    [[r["policy"], r["requests_placed"], r["placed_gb"], r["demand_gb"], r["remote_gb"],
                      r["kv_hop_gb"]] for r in (s.row() for s in snapshot)]))
    for p in mem.POLICIES:
        print()
        print(f"DRAM utilisation per die, {p}: peak % (rows x cols)")
        util = grid(sims[p].peak_util * 100)
        print(table(["row"] + [str(c) for c in range(wafer.cols)],
                    [[r] + [int(round(v)) for v in util[r]] for r in range(wafer.rows)]))
    print(f"\nsimulation runtime {t_sim:.2f} s")
    return 0


def cmd_bench_partition(args) -> int:
    if args.repeat < 1:
        raise SpecError(f"--repeat must be a positive integer, got {args.repeat}")
    model, wafer, workload, strategies = offline_setup(args)
    times = []
    for _ in range(args.repeat):
        res = part.partition(model, wafer, workload, strategies=strategies, chunk_tokens=args.chunk,
                             tpot_slo_s=args.tpot_slo_ms / 1e3, ttft_slo_s=args.ttft_slo_s, max_batch=args.max_batch)
        times.append((res.runtime_s, res.evaluate_s))
    if args.json:
        emit_json({"model": model.name, "wafer": wafer.name, "candidates": len(res.candidates),
                    "runtime_s": [t for t, _ in times], "evaluate_s": [e for _, e in times]})
        return 0
    print(f"wsc-llm partition of {model.name} on {wafer.name}: {len(res.candidates)} candidates")
    print(table(["run", "total s", "evaluation s"], [[i, t, e] for i, (t, e) in enumerate(times)]))
    print("(run 0 includes JIT compilation)")
    return 0


def register_offline(sub, bench_sub) -> None:
    """``wsc-llm hardware|partition|place|memory`` and ``bench wsc-partition``."""
    hw = sub.add_parser("hardware", help="list WSC-LLM hardware presets")
    hw.add_argument("--json", action="store_true")
    hw.set_defaults(func=cmd_hardware)

    p = sub.add_parser("partition", help="choose instance shapes, TP strategies and prefill/decode counts")
    common_args(p)
    p.add_argument("--top", type=int, default=8, help="candidates shown per phase (default 8)")
    p.set_defaults(func=cmd_partition)

    pl = sub.add_parser("place", help="decode-centred placement, TransferCost and alpha sensitivity")
    common_args(pl)
    instance_args(pl)
    pl.add_argument("--alpha", type=float, default=1.5, help="shared-link cost factor >= 1 (default 1.5)")
    pl.add_argument("--alphas", default="1,1.5,2,3", help="alphas of the sensitivity table (default 1,1.5,2,3)")
    pl.add_argument("--random-samples", type=int, default=50, help="random layouts to compare (default 50)")
    pl.add_argument("--chains", type=int, default=32, help="annealing chains (default 32)")
    pl.add_argument("--steps", type=int, default=2000, help="annealing steps per chain (default 2000)")
    pl.add_argument("--seed", type=seed, default=0)
    pl.add_argument("--figure", metavar="PATH", help="save a figure of the wafer, instances and KV routes")
    pl.add_argument("--figure-layout", choices=("decode-centred", "searched"), default="decode-centred",
                    help="which layout the figure shows (default decode-centred)")
    pl.set_defaults(func=cmd_place)

    m = sub.add_parser("memory", help="greedy KV placement vs local-only vs LP optimum; DRAM use per die")
    common_args(m)
    instance_args(m)
    m.add_argument("--alpha", type=float, default=1.5, help="alpha of the decode-centred placement (default 1.5)")
    m.add_argument("--requests", type=int, default=2000, help="synthetic requests (default 2000)")
    m.add_argument("--decode-batch", type=int, help="decode slots per instance (default: largest batch within the "
                                                    "TPOT SLO, memory ignored -- the scheduler finds the memory)")
    m.add_argument("--seed", type=seed, default=0)
    m.add_argument("--no-optimal", action="store_true", help="skip the LP comparison")
    m.set_defaults(func=cmd_memory)

    b = bench_sub.add_parser("wsc-partition", help="WSC-LLM partition runtime")
    common_args(b)
    b.add_argument("--repeat", type=int, default=3)
    b.set_defaults(func=cmd_bench_partition)


__all__ = ["register_offline"]
