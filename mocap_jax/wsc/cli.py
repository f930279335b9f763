"""``mocap-jax wsc-llm ...``: WSC-LLM partition, placement and KV memory scheduler (DESIGN §10).

Sub-commands:

* ``wsc-llm hardware`` -- the hardware presets (wafers and the GPU cluster).
* ``wsc-llm partition`` -- instance shapes, TP strategies and prefill/decode counts.
* ``wsc-llm place`` -- decode-centred placement, TransferCost, alpha sensitivity, figure.
* ``wsc-llm memory`` -- greedy KV placement vs local-only vs an LP optimum, DRAM use per die.

Also ``mocap-jax bench wsc-partition`` (partition runtime).  Every command prints plain
aligned tables, or JSON with ``--json``.  Bad input raises ``ValueError`` (reported by
:mod:`mocap_jax.cli` as one line, exit code 2) before anything is traced.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import time
from typing import Any, Sequence

import numpy as np

from ..specs import SpecError, get_model
from . import memory as mem
from . import partition as part
from . import perf
from . import placement as plc
from .hardware import WAFER_PRESETS, WaferSpec, get_wafer
from .workload import WORKLOAD_PRESETS, get_workload


# --------------------------------------------------------------------------- formatting


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        v = float(v)
        if math.isnan(v):
            return "-"
        if math.isinf(v):
            return "inf"
        if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
            return f"{v:.3g}"
        return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Plain aligned table: text left-aligned, numbers right-aligned."""
    cells = [[_fmt(v) for v in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    isnum = lambda v: isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
    numeric = [any(isnum(r[i]) for r in rows) and all(isnum(r[i]) or r[i] in ("", "-") for r in rows)
               for i in range(len(headers))]
    just = lambda s, i: s.rjust(widths[i]) if numeric[i] else s.ljust(widths[i])
    lines = ["  ".join(just(h, i) for i, h in enumerate(headers)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(just(c, i) for i, c in enumerate(r)).rstrip() for r in cells]
    return "\n".join(lines)


def _json_default(o):
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (np.floating, np.integer, np.bool_)):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def _clean(o):
    """Replace non-finite floats by None so the JSON is standard."""
    if isinstance(o, dict):
        return {k: _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    if isinstance(o, np.ndarray):
        return _clean(o.tolist())
    if isinstance(o, (float, np.floating)) and not math.isfinite(float(o)):
        return None
    return o


def _emit_json(obj) -> None:
    print(json.dumps(_clean(obj), indent=2, default=_json_default))


# --------------------------------------------------------------------------- arguments


def _positive(kind):
    def conv(text):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}") from None
        if not v > 0 or (isinstance(v, float) and not math.isfinite(v)):
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}")
        return v
    conv.__name__ = f"positive {kind.__name__}"
    return conv


def _common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model, hardware and workload")
    g.add_argument("--model", default="llama2-7b", help="model preset or .json/.toml spec (default llama2-7b)")
    g.add_argument("--hardware", default="wsc-llm-64g",
                   help=f"WSC-LLM hardware: {', '.join(WAFER_PRESETS)}, wsc-RxC or a100-cluster-NxG (default wsc-llm-64g)")
    g.add_argument("--rows", type=int, help="override the die grid rows (nodes on a cluster)")
    g.add_argument("--cols", type=int, help="override the die grid columns (GPUs per node on a cluster)")
    g.add_argument("--dram-gb", type=float, help="override DRAM capacity per die, GB")
    g.add_argument("--dram-tbps", type=float, help="override DRAM bandwidth per die, TB/s")
    g.add_argument("--d2d-tbps", type=float, help="override D2D (NVLink on a cluster) bandwidth per link, TB/s")
    g.add_argument("--workload", default="azure-conv",
                   help=f"workload preset ({', '.join(WORKLOAD_PRESETS)}) or an Azure-format trace .csv")
    g.add_argument("--rate", type=float, help="offered load, requests/s (default: the workload's)")
    s = p.add_argument_group("serving targets")
    s.add_argument("--strategies", default=",".join(perf.STRATEGIES),
                   help=f"comma-separated TP strategies (default {','.join(perf.STRATEGIES)})")
    s.add_argument("--chunk", type=int, default=2048, help="prefill token budget per iteration (default 2048)")
    s.add_argument("--tpot-slo-ms", type=float, default=100.0, help="time-per-output-token SLO, ms (default 100)")
    s.add_argument("--ttft-slo-s", type=float, default=10.0, help="time-to-first-token SLO, s (default 10)")
    s.add_argument("--max-batch", type=int, default=512, help="largest decode batch considered (default 512)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")


def _instances(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("instances (default: from the partition)")
    g.add_argument("--prefill", metavar="HxW:N[:STRATEGY]", help="prefill instance shape and count, e.g. 1x1:30")
    g.add_argument("--decode", metavar="HxW:N[:STRATEGY]", help="decode instance shape and count, e.g. 1x2:12")


def wafer_from_args(args) -> WaferSpec:
    wafer = get_wafer(args.hardware)
    changes = {}
    for flag, field, scale in (("rows", "rows", None), ("cols", "cols", None), ("dram_gb", "dram_capacity", 1e9),
                               ("dram_tbps", "dram_bandwidth", 1e12), ("d2d_tbps", "link_bandwidth", 1e12)):
        v = getattr(args, flag, None)
        if v is None:
            continue
        if scale is None:
            if v < 1:
                raise SpecError(f"--{flag.replace('_', '-')} must be a positive integer, got {v}")
            changes[field] = int(v)
        else:
            if not v > 0 or not math.isfinite(v):
                raise SpecError(f"--{flag.replace('_', '-')} must be a positive number, got {v}")
            changes[field] = v * scale
    if changes:
        label = ",".join(f"{k}={v:g}" for k, v in changes.items())
        wafer = wafer.replace(name=f"{wafer.name}[{label}]", **changes)
    return wafer


def _serving(args):
    if args.chunk < 1:
        raise SpecError(f"--chunk must be a positive number of tokens, got {args.chunk}")
    if args.max_batch < 1:
        raise SpecError(f"--max-batch must be a positive integer, got {args.max_batch}")
    if not args.tpot_slo_ms > 0 or not args.ttft_slo_s > 0:
        raise SpecError("--tpot-slo-ms and --ttft-slo-s must be positive")
    if args.rate is not None and (not args.rate > 0 or not math.isfinite(args.rate)):
        raise SpecError(f"--rate must be a positive number of requests/s, got {args.rate}")
    strategies = part.validate_strategies([s.strip() for s in args.strategies.split(",") if s.strip()])
    return strategies


_INST = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*:\s*(\d+)\s*(?::\s*([\w-]+)\s*)?$")


def parse_instance(text: str, flag: str):
    """``HxW:N[:strategy]`` -> ((h, w), n, strategy or None)."""
    m = _INST.match(text or "")
    if not m:
        raise SpecError(f"{flag} expects HxW:N[:STRATEGY] (e.g. 2x2:4 or 2x4:3:gqa-hybrid), got {text!r}")
    h, w, n, s = int(m.group(1)), int(m.group(2)), int(m.group(3)), m.group(4)
    if min(h, w, n) < 1:
        raise SpecError(f"{flag}: shape and count must be >= 1, got {text!r}")
    if s is not None and s not in perf.STRATEGIES:
        raise SpecError(f"{flag}: unknown TP strategy {s!r}; choose from {', '.join(perf.STRATEGIES)}")
    return (h, w), n, s


def _check_fits(wafer: WaferSpec, shape, flag):
    h, w = shape
    if not ((h <= wafer.rows and w <= wafer.cols) or (wafer.is_mesh and w <= wafer.rows and h <= wafer.cols)):
        raise SpecError(f"{flag} instance {h}x{w} is larger than the {wafer.rows}x{wafer.cols} grid of {wafer.name}; "
                        f"choose a shape with rows <= {wafer.rows} and cols <= {wafer.cols}")


def resolve_instances(args, model, wafer, workload, strategies):
    """Prefill/decode candidates and counts: from --prefill/--decode, or from the partition.

    Returns:
      (prefill Candidate, n_prefill, decode Candidate, n_decode, PartitionResult or None).
    """
    targets = part.ServingTargets.make(args.chunk, args.tpot_slo_ms / 1e3, args.ttft_slo_s)
    parsed = {flag: parse_instance(text, flag) for flag, text in (("--prefill", args.prefill),
                                                                   ("--decode", args.decode)) if text is not None}
    if (args.prefill is None) != (args.decode is None):
        raise SpecError("give both --prefill and --decode, or neither (then the partition chooses)")
    if args.prefill is None:
        res = part.partition(model, wafer, workload, strategies=strategies, chunk_tokens=args.chunk,
                             tpot_slo_s=args.tpot_slo_ms / 1e3, ttft_slo_s=args.ttft_slo_s, max_batch=args.max_batch)
        return res.prefill, res.n_prefill, res.decode, res.n_decode, res
    out = []
    for flag in ("--prefill", "--decode"):
        shape, n, s = parsed[flag]
        _check_fits(wafer, shape, flag)
        cand = part.evaluate_candidates(model, wafer, workload, targets, [s or strategies[0]], args.max_batch,
                                        shapes=[shape])[0]
        out.append((cand, n))
    (pc, n_p), (dc, n_d) = out
    if not pc.prefill_fits:
        raise SpecError(f"--prefill {args.prefill}: the model's weights and a longest prompt's KV do not fit a "
                        f"{pc.config.rows}x{pc.config.cols} instance of {wafer.name}; use a larger instance")
    if not dc.decode_fits:
        raise SpecError(f"--decode {args.decode}: the model's weights and one request's KV do not fit a "
                        f"{dc.config.rows}x{dc.config.cols} instance of {wafer.name}; use a larger instance")
    used = n_p * pc.config.dies + n_d * dc.config.dies
    if used > wafer.num_dies:
        raise SpecError(f"--prefill/--decode need {used} dies but {wafer.name} has {wafer.num_dies}")
    return pc, n_p, dc, n_d, None


def _setup(args):
    strategies = _serving(args)
    model = get_model(args.model)
    wafer = wafer_from_args(args)
    workload = get_workload(args.workload, args.rate)
    return model, wafer, workload, strategies


def _hw_line(wafer: WaferSpec) -> str:
    if wafer.is_mesh:
        return (f"{wafer.rows}x{wafer.cols} dies, {wafer.peak_flops / 1e12:.0f} TFLOP/s, "
                f"{wafer.dram_capacity / 1e9:g} GB / {wafer.dram_bandwidth / 1e12:g} TB/s DRAM, "
                f"{wafer.link_bandwidth / 1e12:g} TB/s D2D")
    return (f"{wafer.rows} nodes x {wafer.cols} GPUs, {wafer.peak_flops / 1e12:.0f} TFLOP/s, "
            f"{wafer.dram_capacity / 1e9:g} GB / {wafer.dram_bandwidth / 1e12:g} TB/s, NVLink "
            f"{wafer.link_bandwidth / 1e9:g} GB/s, network {wafer.node_bandwidth / 1e9:g} GB/s per GPU")


# --------------------------------------------------------------------------- commands


def cmd_hardware(args) -> int:
    rows = [w.summary() for w in WAFER_PRESETS.values()]
    if args.json:
        _emit_json(rows)
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
    model, wafer, workload, strategies = _setup(args)
    res = part.partition(model, wafer, workload, strategies=strategies, chunk_tokens=args.chunk,
                         tpot_slo_s=args.tpot_slo_ms / 1e3, ttft_slo_s=args.ttft_slo_s, max_batch=args.max_batch)
    if args.json:
        d = res.to_dict()
        d["hardware"] = wafer.summary()
        d["workload_summary"] = workload.summary()
        _emit_json(d)
        return 0
    print(f"WSC-LLM partition: {model.name} on {wafer.name} ({_hw_line(wafer)})")
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
    for a in vals:
        if not math.isfinite(a) or a < 1:
            raise SpecError(f"alpha must be >= 1 (the cost factor per extra use of a shared link), got {a:g}")
    return vals


def cmd_place(args) -> int:
    if not math.isfinite(args.alpha) or args.alpha < 1:
        raise SpecError(f"--alpha must be >= 1 (the cost factor per extra use of a shared link), got {args.alpha:g}")
    alphas = _parse_alphas(args.alphas)
    for name in ("random_samples", "chains", "steps"):
        if getattr(args, name) < 1:
            raise SpecError(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    model, wafer, workload, strategies = _setup(args)
    if not wafer.is_mesh:
        raise SpecError(f"placement is defined on a mesh wafer; {wafer.name} is a GPU cluster")
    pc, n_p, dc, n_d, _ = resolve_instances(args, model, wafer, workload, strategies)
    pshape, dshape = (pc.config.rows, pc.config.cols), (dc.config.rows, dc.config.cols)
    t0 = time.perf_counter()
    layout = plc.decode_centred_placement(wafer, pshape, n_p, dshape, n_d, args.alpha)
    rep = plc.transfer_cost(wafer, layout, args.alpha)
    rows, best = plc.compare_placements(wafer, pshape, n_p, dshape, n_d, alphas, args.random_samples, args.chains,
                                        args.steps, args.seed)
    elapsed = time.perf_counter() - t0
    fig = None
    if args.figure:
        which = layout if args.figure_layout == "decode-centred" else best.get(args.alpha) or \
            plc.anneal_placement(wafer, layout, args.alpha, args.chains, args.steps, args.seed).layout
        fig = str(plc.plot_placement(wafer, which, args.figure, args.alpha,
                                     title=f"{model.name} on {wafer.name}: {args.figure_layout} placement, "
                                           f"TransferCost {plc.transfer_cost(wafer, which, args.alpha).cost:.1f} "
                                           f"(alpha={args.alpha:g})"))
    if args.json:
        _emit_json({"wafer": wafer.name, "model": model.name, "alpha": args.alpha,
                    "prefill": {"rows": pshape[0], "cols": pshape[1], "count": n_p, "strategy": pc.config.strategy},
                    "decode": {"rows": dshape[0], "cols": dshape[1], "count": n_d, "strategy": dc.config.strategy},
                    "layout": layout.to_dict(), "transfer_cost": rep.cost, "hop_sum": rep.hop_sum,
                    "shared_links": rep.shared_links, "max_link_use": rep.max_link_use,
                    "nearest_decode": rep.nearest, "alpha_sensitivity": [r.to_dict() for r in rows],
                    "searched_layouts": {str(a): l.to_dict() for a, l in best.items()}, "figure": fig,
                    "runtime_s": elapsed})
        return 0
    print(f"WSC-LLM placement: {model.name} on {wafer.name} ({_hw_line(wafer)})")
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
    if args.requests < 1:
        raise SpecError(f"--requests must be a positive integer, got {args.requests}")
    if args.decode_batch is not None and args.decode_batch < 1:
        raise SpecError(f"--decode-batch must be a positive integer, got {args.decode_batch}")
    if not math.isfinite(args.alpha) or args.alpha < 1:
        raise SpecError(f"--alpha must be >= 1, got {args.alpha:g}")
    model, wafer, workload, strategies = _setup(args)
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
    reqs = mem.synthetic_requests(layout, prompt, output, arrivals, pc.prefill_iter_s, args.chunk, kv_per_token, tpot)
    t0 = time.perf_counter()
    sims = {p: mem.simulate_kv(wafer, layout, budget, reqs, batch, p) for p in mem.POLICIES}
    t_sim = time.perf_counter() - t0
    g = sims["greedy"]
    ids = g.resident_at(g.peak_kv_s)
    snapshot = []
    if not args.no_optimal and len(ids):
        snapshot = mem.compare_snapshot(wafer, layout, budget.free, reqs.prefill[ids], g.request_decode[ids],
                                        reqs.kv_bytes[ids])
    grid = lambda a: np.asarray(a).reshape(wafer.rows, wafer.cols)
    if args.json:
        _emit_json({"wafer": wafer.name, "model": model.name, "workload": workload.name, "rate_rps": workload.rate,
                    "requests": args.requests, "decode_batch": batch, "layout": layout.to_dict(),
                    "free_gb_per_die": grid(budget.free / 1e9),
                    "policies": {p: dict(s.row(), peak_util=grid(s.peak_util), mean_util=grid(s.mean_util))
                                 for p, s in sims.items()},
                    "snapshot": {"time_s": g.peak_kv_s, "requests": int(len(ids)),
                                 "results": [s.row() for s in snapshot]},
                    "simulation_s": t_sim})
        return 0
    print(f"WSC-LLM memory scheduler: {model.name} on {wafer.name} ({_hw_line(wafer)})")
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


def cmd_bench(args) -> int:
    if args.repeat < 1:
        raise SpecError(f"--repeat must be a positive integer, got {args.repeat}")
    model, wafer, workload, strategies = _setup(args)
    times = []
    for _ in range(args.repeat):
        res = part.partition(model, wafer, workload, strategies=strategies, chunk_tokens=args.chunk,
                             tpot_slo_s=args.tpot_slo_ms / 1e3, ttft_slo_s=args.ttft_slo_s, max_batch=args.max_batch)
        times.append((res.runtime_s, res.evaluate_s))
    if args.json:
        _emit_json({"model": model.name, "wafer": wafer.name, "candidates": len(res.candidates),
                    "runtime_s": [t for t, _ in times], "evaluate_s": [e for _, e in times]})
        return 0
    print(f"wsc-llm partition of {model.name} on {wafer.name}: {len(res.candidates)} candidates")
    print(table(["run", "total s", "evaluation s"], [[i, t, e] for i, (t, e) in enumerate(times)]))
    print("(run 0 includes JIT compilation)")
    return 0


def register(subparsers, bench_subparsers=None) -> None:
    """Add ``wsc-llm`` (and ``bench wsc-partition``) to the ``mocap-jax`` parser."""
    top = subparsers.add_parser("wsc-llm", help="WSC-LLM serving on a wafer: partition, placement, KV memory",
                                description="WSC-LLM (DESIGN §10): resource partition, placement and the KV memory "
                                            "scheduler for prefill/decode serving on a wafer-scale chip.")
    sub = top.add_subparsers(dest="wsc_command", metavar="SUBCOMMAND", required=True)

    hw = sub.add_parser("hardware", help="list WSC-LLM hardware presets")
    hw.add_argument("--json", action="store_true")
    hw.set_defaults(func=cmd_hardware)

    p = sub.add_parser("partition", help="choose instance shapes, TP strategies and prefill/decode counts")
    _common(p)
    p.add_argument("--top", type=int, default=8, help="candidates shown per phase (default 8)")
    p.set_defaults(func=cmd_partition)

    pl = sub.add_parser("place", help="decode-centred placement, TransferCost and alpha sensitivity")
    _common(pl)
    _instances(pl)
    pl.add_argument("--alpha", type=float, default=1.5, help="shared-link cost factor >= 1 (default 1.5)")
    pl.add_argument("--alphas", default="1,1.5,2,3", help="alphas of the sensitivity table (default 1,1.5,2,3)")
    pl.add_argument("--random-samples", type=int, default=50, help="random layouts to compare (default 50)")
    pl.add_argument("--chains", type=int, default=32, help="annealing chains (default 32)")
    pl.add_argument("--steps", type=int, default=2000, help="annealing steps per chain (default 2000)")
    pl.add_argument("--seed", type=int, default=0)
    pl.add_argument("--figure", metavar="PATH", help="save a figure of the wafer, instances and KV routes")
    pl.add_argument("--figure-layout", choices=("decode-centred", "searched"), default="decode-centred",
                    help="which layout the figure shows (default decode-centred)")
    pl.set_defaults(func=cmd_place)

    m = sub.add_parser("memory", help="greedy KV placement vs local-only vs LP optimum; DRAM use per die")
    _common(m)
    _instances(m)
    m.add_argument("--alpha", type=float, default=1.5, help="alpha of the decode-centred placement (default 1.5)")
    m.add_argument("--requests", type=int, default=2000, help="synthetic requests (default 2000)")
    m.add_argument("--decode-batch", type=int, help="decode slots per instance (default: largest batch within the "
                                                    "TPOT SLO, memory ignored -- the scheduler finds the memory)")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--no-optimal", action="store_true", help="skip the LP comparison")
    m.set_defaults(func=cmd_memory)

    if bench_subparsers is not None:
        b = bench_subparsers.add_parser("wsc-partition", help="WSC-LLM partition runtime")
        _common(b)
        b.add_argument("--repeat", type=int, default=3)
        b.set_defaults(func=cmd_bench)


__all__ = ["register", "table", "parse_instance", "wafer_from_args", "resolve_instances"]
