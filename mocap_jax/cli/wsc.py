"""``mocap-jax wsc-llm ...``: WSC-LLM partition, placement and KV memory scheduler (DESIGN §10).

Sub-commands:

* ``wsc-llm hardware`` -- the hardware presets (wafers and the GPU cluster).
* ``wsc-llm partition`` -- instance shapes, TP strategies and prefill/decode counts.
* ``wsc-llm place`` -- decode-centred placement, TransferCost, alpha sensitivity, figure.
* ``wsc-llm memory`` -- greedy KV placement vs local-only vs an LP optimum, DRAM use per die.
* ``wsc-llm trace`` -- statistics of a workload (synthetic preset or Azure-format trace file).
* ``wsc-llm serve`` -- batched serving simulation of one design point (``--check-reference``
  compares it with the event-driven reference).
* ``wsc-llm explore`` -- hardware design-space exploration (CSV under ``--out``, figure).
* ``wsc-llm baselines`` -- Splitwise vs WSC-LLM scheduling on the A100 cluster and the wafer,
  and the ablations (CSV, latency-CDF and ablation figures).

Also ``mocap-jax bench wsc-partition`` (partition runtime) and ``mocap-jax bench wsc-serving``
(simulated requests per wall-second, array program vs reference).  Every command prints plain
aligned tables, or JSON with ``--json``.  Bad input raises ``ValueError`` (reported by
:mod:`mocap_jax.cli` as one line, exit code 2) before anything is traced.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..specs import SpecError, get_model
from ..wsc import memory as mem
from ..wsc import partition as part
from ..wsc import perf
from ..wsc import placement as plc
from ..wsc.hardware import WAFER_PRESETS, WaferSpec, get_wafer
from ..wsc.workload import WORKLOAD_PRESETS, get_workload


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


def _design_point(p: argparse.ArgumentParser):
    """The model, hardware (with overrides) and workload arguments; returns their group."""
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
    return g


def _common(p: argparse.ArgumentParser) -> None:
    g = _design_point(p)
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


# =========================================================================== part 2: serving


def _floats(text: str, flag: str, positive: bool = True) -> list[float]:
    try:
        vals = [float(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise SpecError(f"{flag} expects comma-separated numbers, got {text!r}") from None
    if not vals:
        raise SpecError(f"{flag} needs at least one value")
    for v in vals:
        if not math.isfinite(v) or (positive and v <= 0):
            raise SpecError(f"{flag} values must be positive numbers, got {v:g}")
    return vals


def _names(text: str, flag: str) -> list[str]:
    vals = [x.strip() for x in str(text).split(",") if x.strip()]
    if not vals:
        raise SpecError(f"{flag} needs at least one name")
    return vals


def _serving_args(p: argparse.ArgumentParser, requests: int | None = 400) -> None:
    g = p.add_argument_group("serving")
    g.add_argument("--chunk", type=int, default=2048, help="prefill token budget per iteration (default 2048)")
    g.add_argument("--tpot-slo-ms", type=float, default=100.0, help="time-per-output-token SLO, ms (default 100)")
    g.add_argument("--ttft-slo-s", type=float, default=2.0, help="time-to-first-token SLO, s (default 2)")
    g.add_argument("--max-batch", type=int, default=256, help="largest decode batch (default 256)")
    g.add_argument("--window", type=int, default=16, help="most requests per prefill iteration (default 16)")
    g.add_argument("--strategies", default=",".join(perf.STRATEGIES),
                   help=f"TP strategies of the partition (default {','.join(perf.STRATEGIES)})")
    if requests is not None:
        g.add_argument("--requests", type=int, default=requests, help=f"requests per simulated point (default {requests})")
    g.add_argument("--seed", type=int, default=0, help="trace seed (default 0)")
    g.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                   help="precision of the array program (default float32)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")


def _serving_config(args):
    from ..wsc.serving import ServingConfig

    if args.chunk < 1 or args.max_batch < 1 or args.window < 1:
        raise SpecError("--chunk, --max-batch and --window must be positive integers")
    if not (args.tpot_slo_ms > 0 and args.ttft_slo_s > 0) or not math.isfinite(args.tpot_slo_ms + args.ttft_slo_s):
        raise SpecError("--tpot-slo-ms and --ttft-slo-s must be positive numbers")
    if getattr(args, "requests", None) is not None and args.requests < 2:
        raise SpecError(f"--requests must be an integer >= 2, got {args.requests}")
    strategies = part.validate_strategies([x.strip() for x in args.strategies.split(",") if x.strip()])
    return ServingConfig(chunk_tokens=args.chunk, tpot_slo_s=args.tpot_slo_ms / 1e3, ttft_slo_s=args.ttft_slo_s,
                         max_batch=args.max_batch, window=args.window, strategies=strategies, seed=args.seed)


def _dtype(args):
    import jax
    import jax.numpy as jnp

    if args.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
        return jnp.float64
    return jnp.float32


_METRIC_COLS = [("ttft_mean", "TTFT mean s"), ("ttft_p99", "TTFT p99 s"), ("tpot_mean", "TPOT mean ms"),
                ("tpot_p99", "TPOT p99 ms"), ("e2e_mean", "E2E mean s"), ("e2e_p50", "E2E p50 s"),
                ("e2e_p99", "E2E p99 s"), ("tokens_per_s", "tokens/s"), ("goodput_rps", "goodput req/s"),
                ("slo_attainment", "SLO att."), ("dram_util_mean", "DRAM mean"), ("dram_util_peak", "DRAM peak")]


def _metric_cells(m: dict) -> list:
    out = []
    for k, _ in _METRIC_COLS:
        v = m.get(k)
        v = float("nan") if v is None else float(v)
        out.append(v * 1e3 if k.startswith("tpot") and math.isfinite(v) else v)
    return out


def cmd_trace(args) -> int:
    from ..wsc.workload import LENGTH_FITS, WORKLOAD_PRESETS, get_trace

    if args.requests is not None and args.requests < 1:
        raise SpecError(f"--requests must be a positive integer, got {args.requests}")
    tr = get_trace(args.workload, args.requests, args.rate, args.seed)
    summ = tr.summary()
    fit = None
    if tr.name in LENGTH_FITS and not str(args.workload).lower().endswith(".csv"):
        fit = dict(LENGTH_FITS[tr.name].moments(), part1_mean_prompt=WORKLOAD_PRESETS[tr.name].mean_prompt,
                   part1_mean_output=WORKLOAD_PRESETS[tr.name].mean_output)
    if args.json:
        _emit_json({"trace": summ, "fitted_distribution": fit})
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
    from ..wsc import serving as sv
    from ..wsc.workload import get_trace

    config = _serving_config(args)
    if args.rate is not None and (not args.rate > 0 or not math.isfinite(args.rate)):
        raise SpecError(f"--rate must be a positive number of requests/s, got {args.rate}")
    if args.load is not None and (not args.load > 0 or not math.isfinite(args.load)):
        raise SpecError(f"--load must be a positive number, got {args.load}")
    if args.rate is not None and args.load is not None:
        raise SpecError("give --rate or --load, not both")
    dtype = _dtype(args)
    if args.check_reference:
        import jax

        jax.config.update("jax_enable_x64", True)
    model = get_model(args.model)
    wafer = wafer_from_args(args)
    trace0 = get_trace(args.workload, args.requests, None, args.seed)
    setup = sv.build_setup(model, wafer, sv.workload_for(trace0), args.scheduler, args.memory, args.placement, config)
    if not setup.feasible:
        raise SpecError(f"{model.name} cannot be served on {wafer.name} with the {args.scheduler} scheduler: "
                        f"{setup.reason}")
    rate = args.rate if args.rate is not None else (args.load or 0.8) * setup.served_rps
    trace = get_trace(args.workload, args.requests, rate, args.seed)
    rep = sv.simulate([(setup, trace)], dtype=dtype)
    res = rep.results[0]
    check = None
    if args.check_reference:
        from ..wsc import serving_reference as ref

        r64 = sv.simulate([(setup, trace)], dtype=jax.numpy.float64).results[0] if dtype != jax.numpy.float64 else res
        rres, rout = ref.reference_result(setup, trace)
        check = {"float64": ref.agreement(r64, rres), "reference_wall_s": rout.wall_s, "reference_events": rout.events}
        if dtype != jax.numpy.float64:
            check["float32_vs_reference"] = ref.agreement(res, rres)
    if args.out:
        from ..wsc.explore import write_rows

        write_rows([res.row()], args.out)
    if args.json:
        _emit_json({"setup": setup.describe(), "trace": trace.summary(), "metrics": res.metrics,
                    "reference_check": check, "wall_s": rep.wall_s, "compile_s": rep.compile_s})
        return 0
    d = setup.describe()
    print(f"WSC-LLM serving: {model.name} on {wafer.name} ({_hw_line(wafer)})")
    print(f"scheduler {setup.scheduler} (placement {setup.placement}, memory {setup.memory_policy}): "
          f"{d['n_prefill']} x prefill {d['prefill']}, {d['n_decode']} x decode {d['decode']}, batch cap "
          f"{d['batch_cap']}, partition capacity {d['served_rps']:.1f} req/s")
    print(f"workload {trace.name}: {len(trace)} requests at {trace.rate:.2f} req/s; SLOs TTFT {config.ttft_slo_s:g} s, "
          f"TPOT {config.tpot_slo_s * 1e3:g} ms")
    print()
    print(table([c for _, c in _METRIC_COLS], [_metric_cells(res.metrics)]))
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


QUICK = {"models": "llama2-7b,llama3-70b,llama3.1-405b", "dram_gb": "32,96", "d2d_tbps": "1.5,2.5", "grids": "6x9",
         "loads": "1.2", "max_requests": 256}


def cmd_explore(args) -> int:
    from ..wsc import explore as ex
    from ..wsc import figures as fg

    config = _serving_config(args)
    if args.quick:
        for k, v in QUICK.items():
            if getattr(args, k) == EXPLORE_DEFAULTS[k]:
                setattr(args, k, v)
    models = _names(args.models, "--models")
    workloads = _names(args.workloads, "--workloads")
    loads = _floats(args.loads, "--loads")
    hw = ex.template_points(ex.parse_grids(args.grids), _floats(args.dram_gb, "--dram-gb"),
                            _floats(args.d2d_tbps, "--d2d-tbps"),
                            None if args.dram_tbps is None else _floats(args.dram_tbps, "--dram-tbps"))
    if args.window_s <= 0 or not math.isfinite(args.window_s):
        raise SpecError(f"--window-s must be positive, got {args.window_s}")
    if args.max_requests < 2:
        raise SpecError(f"--max-requests must be >= 2, got {args.max_requests}")
    dtype = _dtype(args)
    res = ex.explore(models, workloads, loads, hw, requests=args.requests, window_s=args.window_s,
                     min_requests=min(64, args.max_requests), max_requests=args.max_requests, config=config,
                     seed=args.seed, dtype=dtype)
    out = Path(args.out)
    csv_path = res.write_csv(out / "wsc_explore.csv")
    best_path = ex.write_rows(res.best + res.best_per_model, out / "wsc_explore_best.csv")
    fig = None
    if not args.no_figure:
        fig = str(fg.plot_design_space(fg.run_design_space(res), args.figure))
    if args.json:
        _emit_json({"best": res.best, "best_per_model": res.best_per_model, "timing": res.timing, "csv": str(csv_path),
                    "best_csv": str(best_path), "figure": fig, "rows": res.rows})
        return 0
    t = res.timing
    print(f"WSC-LLM design-space exploration: {len(hw)} hardware points x {len(models)} models x {len(workloads)} "
          f"workloads x {len(loads)} rates = {t['points']} points, {t['simulated_requests']} requests")
    print(f"rates (req/s) = load x the partition capacity of {ex.REFERENCE_HARDWARE}; SLOs TTFT "
          f"{config.ttft_slo_s:g} s, TPOT {config.tpot_slo_s * 1e3:g} ms")
    print()
    print("best design per workload (score: geometric mean over models of SLO goodput summed over rates, "
          "normalised to the best point per model):")
    print("(subset 'shoreline': only points on the template trade-off D2D = 3 - DRAM TB/s / 2)")
    print(table(["workload", "subset", "best hardware", "score", "runner-up", "score "],
                [[b["workload"], b["subset"], b["hardware"], b["score_geomean"], b["runner_up"] or "-",
                  b["runner_up_score"] if b["runner_up_score"] is not None else float("nan")] for b in res.best]))
    print()
    print("best per workload and model:")
    print(table(["workload", "model", "subset", "best hardware", "goodput sum req/s", "E2E mean s"],
                [[b["workload"], b["model"], b["subset"], b["hardware"], b["goodput_sum_rps"], b["e2e_mean_s"]]
                 for b in res.best_per_model]))
    print(f"\nresults: {csv_path}, {best_path}" + (f"; figure: {fig}" if fig else ""))
    print(f"set-up {t['setup_s']:.1f} s, simulation {t['simulate_s']:.1f} s ({t['groups']} compiled groups, compile "
          f"{t['compile_s']:.1f} s), {t['requests_per_wall_s']:.0f} simulated requests per wall-second")
    return 0


EXPLORE_DEFAULTS = {"models": "llama2-7b,llama3-70b,llama3.1-405b", "workloads": "azure-code,azure-conv",
                    "loads": "0.7,1.2", "dram_gb": "32,64,96", "d2d_tbps": "1.5,2,2.5", "grids": "6x9,5x8",
                    "max_requests": 1536}


def cmd_baselines(args) -> int:
    from ..wsc import baselines as bl
    from ..wsc import figures as fg
    from ..wsc.explore import write_rows

    config = _serving_config(args)
    loads = _floats(args.loads, "--loads")
    dtype = _dtype(args)
    res = bl.run_baselines(args.model, args.workload, loads, args.requests, args.wafer, args.cluster, config,
                           args.seed, dtype, ablations=not args.no_ablations, ablation_wafer=args.ablation_wafer)
    out = Path(args.out)
    rows_path = write_rows(res.rows, out / "wsc_baselines.csv")
    gains_path = write_rows(res.gains, out / "wsc_baselines_gains.csv")
    figs = []
    if not args.no_figures:
        fdir = Path(args.figures_dir)
        figs.append(str(fg.plot_latency_cdf(fg.run_latency_cdf(res), fdir / "wsc_latency_cdf.png")))
        if not args.no_ablations:
            figs.append(str(fg.plot_ablation(fg.run_ablation(res), fdir / "wsc_ablation.png")))
    if args.json:
        _emit_json({"model": res.model, "workload": res.workload, "loads": list(res.loads), "rates": res.rates,
                    "reference": res.reference, "rows": res.rows, "gains": res.gains, "timing": res.timing,
                    "csv": [str(rows_path), str(gains_path)], "figures": figs})
        return 0
    print(f"WSC-LLM baselines: {res.model}, {res.workload}; {args.requests} requests per point; rates = load x "
          f"the partition capacity of {res.reference}; SLOs TTFT {config.ttft_slo_s:g} s, TPOT "
          f"{config.tpot_slo_s * 1e3:g} ms")
    heads = ["kind", "system", "load", "req/s", "prefill", "decode"] + [c for _, c in _METRIC_COLS]
    rows = []
    for r in res.rows:
        pre = f"{r.get('n_prefill', '-')}x{r['prefill']}" if r.get("feasible") else "infeasible"
        dec = f"{r.get('n_decode', '-')}x{r['decode']}" if r.get("feasible") else "-"
        rows.append([r["kind"], r["system"], r["load"], r["rate_rps"], pre, dec] + _metric_cells(r))
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


def bench_serving(model: str = "llama3-70b", hardware: str = "wsc-llm-64g", workload: str = "azure-conv",
                  points: int = 32, requests: int = 200, reference_points: int | None = None, load: float = 0.8,
                  seed: int = 0, dtype=None, config=None) -> dict:
    """Simulated requests per wall-second of the batched array program vs the event-driven reference.

    ``points`` design points (the same set-up, different traces: seeds ``seed..seed+points-1``)
    run as one ``jit(vmap)`` batch (timed after a warm-up call, compile reported separately);
    the reference runs ``reference_points`` of the same points (default all) one by one.
    """
    import jax.numpy as jnp

    from ..wsc import serving as sv
    from ..wsc import serving_reference as ref
    from ..wsc.workload import synthetic_trace, resolve_workload_name

    dtype = jnp.float32 if dtype is None else dtype
    if points < 1 or requests < 2:
        raise SpecError("--points must be >= 1 and --requests >= 2")
    reference_points = points if reference_points is None else reference_points
    if not 1 <= reference_points <= points:
        raise SpecError(f"--reference-points must be between 1 and --points ({points}), got {reference_points}")
    w = resolve_workload_name(workload)
    setup = sv.build_setup(model, hardware, WORKLOAD_PRESETS[w], "wsc", config=config)
    if not setup.feasible:
        raise SpecError(f"{model} cannot be served on {hardware}: {setup.reason}")
    pts = [(setup, synthetic_trace(w, requests, load * setup.served_rps, seed + k)) for k in range(points)]
    first = sv.simulate(pts, dtype=dtype)          # includes compilation
    warm = sv.simulate(pts, dtype=dtype)
    t0 = time.perf_counter()
    refs = [ref.reference_result(s, t) for s, t in pts[:reference_points]]
    ref_s = time.perf_counter() - t0
    errs = [ref.agreement(a, r) for a, (r, _) in zip(warm.results, refs)]
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
            "same_finished_all": all(e["same_finished"] for e in errs)}


def cmd_bench_serving(args) -> int:
    for name in ("points", "requests", "reference_points"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise SpecError(f"--{name.replace('_', '-')} must be a positive integer, got {v}")
    if not args.load > 0:
        raise SpecError(f"--load must be positive, got {args.load}")
    if args.max_batch < 1:
        raise SpecError(f"--max-batch must be a positive integer, got {args.max_batch}")
    from ..wsc.serving import ServingConfig

    res = bench_serving(args.model, args.hardware, args.workload, args.points, args.requests, args.reference_points,
                        args.load, args.seed, _dtype(args), ServingConfig(max_batch=args.max_batch))
    if args.json:
        _emit_json(res)
        return 0
    print(f"wsc-serving: {res['model']} on {res['hardware']}, {res['workload']} at {res['rate_rps']:.1f} req/s; "
          f"{res['points']} design points x {res['requests_per_point']} requests ({res['dtype']})")
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


def _register_part2(sub, bench_subparsers) -> None:
    tr = sub.add_parser("trace", help="statistics of a workload: synthetic preset or Azure-format trace .csv")
    tr.add_argument("--workload", default="azure-conv", help="azure-code, azure-conv (aliases code, conv) or a .csv")
    tr.add_argument("--requests", type=int, help="first N requests (default: 1000 for a preset, all for a file)")
    tr.add_argument("--rate", type=float, help="rescale to this arrival rate, req/s")
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--json", action="store_true", help="print JSON instead of tables")
    tr.set_defaults(func=cmd_trace)

    sv_ = sub.add_parser("serve", help="simulate serving one design point (array program; optional reference check)")
    g = _design_point(sv_)
    g.add_argument("--rate", type=float, help="offered rate, req/s (default 0.8 x the partition capacity)")
    g.add_argument("--load", type=float, help="offered rate as a multiple of the partition capacity")
    s = sv_.add_argument_group("scheduler")
    s.add_argument("--scheduler", choices=("wsc", "splitwise", "naive"), default="wsc")
    s.add_argument("--memory", choices=("greedy", "local"), help="KV memory policy (default: greedy for wsc)")
    s.add_argument("--placement", choices=("decode-centred", "packed", "random"), help="instance placement")
    sv_.add_argument("--check-reference", action="store_true",
                     help="also run the event-driven reference and report the agreement")
    sv_.add_argument("--out", metavar="CSV", help="write the metrics row to this CSV file")
    _serving_args(sv_, requests=300)
    sv_.set_defaults(func=cmd_serve)

    e = sub.add_parser("explore", help="hardware design-space exploration (batched serving simulation)")
    e.add_argument("--models", default=EXPLORE_DEFAULTS["models"], help="comma-separated model presets")
    e.add_argument("--workloads", default=EXPLORE_DEFAULTS["workloads"], help="comma-separated workload presets")
    e.add_argument("--loads", default=EXPLORE_DEFAULTS["loads"],
                   help="rates as multiples of the reference design's capacity (default 0.7,1.2)")
    e.add_argument("--dram-gb", dest="dram_gb", default=EXPLORE_DEFAULTS["dram_gb"],
                   help="DRAM capacities per die, GB (default 32,64,96)")
    e.add_argument("--dram-tbps", help="DRAM bandwidths, TB/s, crossed with the capacities (default: capacity/32)")
    e.add_argument("--d2d-tbps", dest="d2d_tbps", default=EXPLORE_DEFAULTS["d2d_tbps"],
                   help="D2D bandwidths, TB/s (default 1.5,2,2.5)")
    e.add_argument("--grids", default=EXPLORE_DEFAULTS["grids"], help="die grids (default 6x9,5x8)")
    e.add_argument("--requests", type=int, help="fixed requests per point (default: --window-s of arrivals)")
    e.add_argument("--window-s", type=float, default=8.0, help="seconds of arrivals per point (default 8)")
    e.add_argument("--max-requests", type=int, default=EXPLORE_DEFAULTS["max_requests"],
                   help=f"cap on requests per point (default {EXPLORE_DEFAULTS['max_requests']})")
    e.add_argument("--quick", action="store_true", help="small sweep: 6x9, 32/96 GB, D2D 1.5/2.5, one rate, <= 256 requests")
    e.add_argument("--out", default="results", help="directory of the CSV results (default results/)")
    e.add_argument("--figure", default="figures/wsc_design_space.png", help="design-space figure path")
    e.add_argument("--no-figure", action="store_true")
    _serving_args(e, requests=None)
    e.set_defaults(func=cmd_explore)

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
    _serving_args(b, requests=800)
    b.set_defaults(func=cmd_baselines)

    if bench_subparsers is not None:
        bs = bench_subparsers.add_parser("wsc-serving", help="WSC-LLM serving: array program vs event-driven reference")
        bs.add_argument("--model", default="llama3-70b")
        bs.add_argument("--hardware", default="wsc-llm-64g")
        bs.add_argument("--workload", default="azure-conv")
        bs.add_argument("--points", type=int, default=32, help="design points in the batch (default 32)")
        bs.add_argument("--requests", type=int, default=200, help="requests per point (default 200)")
        bs.add_argument("--reference-points", type=int, help="points the reference runs (default all)")
        bs.add_argument("--load", type=float, default=0.8, help="rate as a multiple of the partition capacity")
        bs.add_argument("--max-batch", type=int, default=256, help="largest decode batch (default 256)")
        bs.add_argument("--seed", type=int, default=0)
        bs.add_argument("--dtype", choices=("float32", "float64"), default="float32")
        bs.add_argument("--json", action="store_true")
        bs.set_defaults(func=cmd_bench_serving)


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

    _register_part2(sub, bench_subparsers)

    if bench_subparsers is not None:
        b = bench_subparsers.add_parser("wsc-partition", help="WSC-LLM partition runtime")
        _common(b)
        b.add_argument("--repeat", type=int, default=3)
        b.set_defaults(func=cmd_bench)


__all__ = ["register", "table", "parse_instance", "wafer_from_args", "resolve_instances", "bench_serving"]
