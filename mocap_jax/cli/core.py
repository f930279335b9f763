"""Core sub-commands: ``simulate``, ``max-seq``, ``max-batch``, ``models``, ``hardware``, ``bench pipeline``."""

from __future__ import annotations

import argparse
import json
import math

import numpy as np

from .. import api
from ..mbkr import DEFAULT_P1, DEFAULT_P2, DEFAULT_READ_OVERLAP, PAIRINGS
from ..specs import HARDWARE_PRESETS, MODEL_PRESETS, get_hardware, get_model


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def batch_arg(text: str):
    return "auto" if text == "auto" else positive_int(text)


def partition_arg(text: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--partition takes comma-separated token counts, got {text!r}") from None


def add_config_args(p: argparse.ArgumentParser, schemes=None, seq_len=True):
    """Arguments every simulation command shares."""
    p.add_argument("--model", "-m", default="llama3-70b", help="model preset or .json/.toml spec (default llama3-70b)")
    p.add_argument("--hardware", "-w", default="mocap-4x4",
                   help="hardware preset, mocap-RxC[xWw] mesh, or .json/.toml spec (default mocap-4x4)")
    if seq_len:
        p.add_argument("--seq-len", "-s", type=positive_int, default=65536, help="prompt tokens per request (default 65536)")
    p.add_argument("--scheme", default="terapipe", choices=schemes or api.SCHEMES, help="pipelining scheme")
    p.add_argument("--chunks", "-M", type=positive_int, default=None, help="chunks per request (default 16)")
    p.add_argument("--release", default="stage", choices=api.RELEASE_POLICIES, help="KV release policy")
    p.add_argument("--admission", default="streaming", choices=api.ADMISSION_MODES, help="batch admission mode")
    p.add_argument("--num-batches", type=positive_int, default=2, help="consecutive batches simulated (default 2)")
    p.add_argument("--microbatch", type=positive_int, default=1, help="requests per GPipe microbatch")
    p.add_argument("--stages", type=positive_int, default=None,
                   help="pipeline stages (default: every die, or dies / tp stage groups)")
    p.add_argument("--tp", type=positive_int, default=1,
                   help="tensor-parallel degree: dies (GPUs) per pipeline stage (default 1)")
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    p.add_argument("--placement", default=None,
                   help="stage-to-die map: snake, searched, or comma-separated die indices "
                        "(default: searched for MBKR schemes, snake otherwise)")
    g = p.add_argument_group("MBKR (schemes mbkr, mocap)")
    g.add_argument("--pairing", default="cross-half", choices=PAIRINGS, help="stage pairing policy")
    g.add_argument("--p1", type=float, default=DEFAULT_P1, help=f"creditor threshold, fraction of KV budget (default {DEFAULT_P1})")
    g.add_argument("--p2", type=float, default=DEFAULT_P2, help=f"debtor threshold, fraction of KV budget (default {DEFAULT_P2})")
    g.add_argument("--read-overlap", type=float, default=DEFAULT_READ_OVERLAP,
                   help="fraction of local attention time that hides a remote KV read")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the summary")


def _gb(x) -> str:
    return f"{x / 1e9:8.2f}"


def format_result(r: api.SimResult) -> str:
    """Readable multi-line summary of a :class:`SimResult`."""
    lat = f"{r.prefill_latency_s:.4f} s" if math.isfinite(r.prefill_latency_s) else \
        f"inf (infeasible; {r.extra.get('raw_latency_s', float('nan')):.4f} s ignoring memory)"
    tp = r.extra.get("tensor_parallel", 1)
    layout = f"{r.num_stages} stages" + (f" x TP {tp}" if tp > 1 else "")
    head = (f"{r.scheme} | {r.model} on {r.hardware} ({layout}) | S = {r.seq_len:,} tokens | "
            f"B = {r.batch} | " + (f"M = {r.chunks} chunks" if r.scheme != "gpipe" else f"{r.extra['items_per_batch']} microbatches"))
    lines = [head, "-" * len(head),
             f"  feasible           {'yes' if r.feasible else 'NO: some stage exceeds its usable HBM'}",
             f"  prefill latency    {lat}",
             f"  throughput         {r.throughput_rps:.3f} requests/s (saturation, {r.admission} admission)",
             f"  bubble fraction    {100 * r.bubble_fraction:.1f} %",
             f"  KV release         {r.release}; {r.num_batches} batch(es) simulated",
             "", "  stage  die  weights GB  KV peak GB  workspace GB  peak GB  / usable GB  util %"
             + ("   (per die; die = the group's first)" if tp > 1 else "")]
    for s in range(r.num_stages):
        lines.append(f"  {s:5d} {int(np.ravel(r.placement[s])[0]):4d}    {_gb(r.weight_bytes_per_stage[s])}    "
                     f"{_gb(r.kv_peak_bytes_per_stage[s])}      {_gb(r.workspace_bytes_per_stage[s])} "
                     f"{_gb(r.peak_mem_bytes_per_stage[s])}   {_gb(r.capacity_bytes)}   "
                     f"{100 * r.stage_utilisation[s]:5.1f}")
    for k, v in r.extra.items():
        if k not in ("raw_latency_s", "items_per_batch", "tensor_parallel") and not isinstance(v, (list, np.ndarray, dict)):
            lines.append(f"  {k:<22} {v:.6g}" if isinstance(v, float) else f"  {k:<22} {v}")
    return "\n".join(lines)


def placement_arg(text):
    if text is None or text in ("snake", "searched"):
        return text
    try:
        if ";" in text:   # stage groups (--tp > 1): dies of each group, groups separated by ';'
            return [[int(x) for x in group.split(",") if x.strip()] for group in text.split(";") if group.strip()]
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--placement takes snake, searched, comma-separated die indices, or with --tp groups of "
                         f"them separated by ';' (0,1;2,3), got {text!r}") from None


def _sim_kwargs(args) -> dict:
    return dict(chunks=args.chunks, release=args.release, admission=args.admission, num_batches=args.num_batches,
                microbatch=args.microbatch, stages=args.stages, dtype=args.dtype, placement=placement_arg(args.placement),
                pairing=args.pairing, p1=args.p1, p2=args.p2, read_overlap=args.read_overlap, tp=args.tp)


PLANNED_SCHEMES = ("terapipe-dp", "lbcp", "mocap")


def cmd_simulate(args) -> int:
    scheme, partition = args.scheme, args.partition
    kw = _sim_kwargs(args)
    if scheme in PLANNED_SCHEMES:   # chunk sizes planned first (TeraPipe DP, or LBCP DP + annealing)
        from .. import compare

        if partition is not None:
            raise ValueError(f"--scheme {scheme} plans its own chunk sizes; drop --partition or use terapipe/mbkr")
        if args.tp > 1:
            raise ValueError(f"--scheme {scheme} plans chunk sizes for single-die stages only; with --tp > 1 use "
                             f"--scheme terapipe, mbkr or gpipe (with --partition for your own chunk sizes)")
        g = args.granularity
        if scheme == "terapipe-dp":
            partition = compare.terapipe_dp_partition(args.model, args.hardware, args.seq_len, g,
                                                      args.batch if args.batch != "auto" else 1, args.dtype)
        else:
            plan = compare.plan_partition(
                args.model, args.hardware, args.seq_len, scheme, batch=args.batch, release=args.release,
                admission=args.admission, num_batches=args.num_batches, dtype=args.dtype,
                mbkr=api.MBKRConfig(args.pairing, args.p1, args.p2, args.read_overlap),
                settings=compare.PlanSettings(chunks=args.chunks or 16, granularity=g, chains=args.chains,
                                              steps=args.steps))
            partition = plan["annealed"]["partition"]
        kw["chunks"] = None
        scheme = "mbkr" if scheme == "mocap" else "terapipe"
    r = api.simulate(args.model, args.hardware, args.seq_len, scheme, batch=args.batch,
                     partition=partition, timeline=False, max_batch=args.max_batch, **kw)
    if args.scheme != scheme:
        r.scheme = args.scheme
    print(json.dumps(r.to_dict()) if args.json else format_result(r))
    return 0


def cmd_max_seq(args) -> int:
    kw = _sim_kwargs(args)
    kw["chunks"] = kw["chunks"] or 16
    S = api.max_feasible_seq_len(args.model, args.hardware, args.scheme, batch=args.batch,
                                 granularity=args.granularity, max_seq_len=args.max_seq_len, **kw)
    out = {"model": get_model(args.model).name, "hardware": get_hardware(args.hardware).name, "scheme": args.scheme,
           "chunks": kw["chunks"], "batch": args.batch, "granularity": args.granularity, "max_seq_len": S}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"longest feasible sequence: {S:,} tokens ({out['scheme']}, {out['model']} on {out['hardware']}, "
              f"B = {args.batch}, M = {kw['chunks']}, multiples of {args.granularity})")
    return 0


def cmd_max_batch(args) -> int:
    B = api.max_feasible_batch(args.model, args.hardware, args.seq_len, args.scheme, max_batch=args.max_batch,
                               **_sim_kwargs(args))
    out = {"model": get_model(args.model).name, "hardware": get_hardware(args.hardware).name, "scheme": args.scheme,
           "seq_len": args.seq_len, "max_batch": B, "search_cap": args.max_batch}
    print(json.dumps(out) if args.json else f"largest feasible batch B' = {B} requests (search cap {args.max_batch})")
    return 0


def cmd_models(args) -> int:
    rows = [m.summary() for m in MODEL_PRESETS.values()]
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"{'model':22s} {'layers':>6s} {'attn':>4s} {'params B':>9s} {'active B':>9s} {'published B':>11s} "
          f"{'weights GB':>10s} {'KV B/token':>10s}")
    for r in rows:
        pub = f"{r['published_params_b']:.1f}" if r["published_params_b"] else "-"
        print(f"{r['name']:22s} {r['layers']:6d} {r['attention']:>4s} {r['params_b']:9.2f} {r['active_params_b']:9.2f} "
              f"{pub:>11s} {r['weight_gb']:10.1f} {r['kv_bytes_per_token']:10.0f}")
    print("\nAny model can also be given as a .json/.toml file with the ModelSpec fields (see README).")
    return 0


def cmd_hardware(args) -> int:
    rows = [h.summary() for h in HARDWARE_PRESETS.values()]
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"{'hardware':14s} {'topology':8s} {'grid':18s} {'dies':>4s} {'PFLOP/s':>8s} {'HBM TB':>7s} "
          f"{'GB/die':>7s} {'TB/s/die':>8s} {'link TB/s':>9s}  description")
    for r in rows:
        print(f"{r['name']:14s} {r['topology']:8s} {r['grid']:18s} {r['dies']:4d} {r['pflops_total']:8.1f} "
              f"{r['hbm_tb_total']:7.2f} {r['hbm_gb_per_die']:7.0f} {r['hbm_tbps_per_die']:8.2f} "
              f"{r['link_tbps']:9.2f}  {r['description']}")
    print("\nAny mesh of the MOCAP die: mocap-RxC (e.g. mocap-6x8); W wafers side by side: mocap-RxCxWw.")
    return 0


def cmd_bench_pipeline(args) -> int:
    from ..bench import bench_pipeline

    r = bench_pipeline(args.model, args.hardware, args.seq_len, args.chunks, args.partitions, args.block,
                       args.repeats, args.seed)
    if args.json:
        print(json.dumps(r))
    else:
        print(f"chunked-pipeline evaluations: {r['evaluations']:,} random partitions of S = {r['seq_len']:,} into "
              f"M = {r['chunks']} chunks, {r['model']} on {r['hardware']} ({r['stages']} stages), "
              f"{r['devices']} x {r['device_kind']}")
        print(f"  compile        {r['compile_s']:.2f} s (separate)")
        print(f"  median run     {r['median_s']:.3f} s   ->  {r['evals_per_s']:,.0f} evaluations/s "
              f"(best {r['evals_per_s_best']:,.0f}/s)")
    return 0


def register(sub, bench_sub) -> None:
    p = sub.add_parser("simulate", help="simulate one configuration (GPipe / TeraPipe / MBKR / LBCP / MOCAP)")
    add_config_args(p, schemes=api.SCHEMES + PLANNED_SCHEMES)
    p.add_argument("--granularity", "-g", type=positive_int, default=256,
                   help="chunk sizes in multiples of g tokens (terapipe-dp, lbcp, mocap)")
    p.add_argument("--chains", type=positive_int, default=256, help="LBCP annealing chains (lbcp, mocap)")
    p.add_argument("--steps", type=positive_int, default=600, help="LBCP annealing steps (lbcp, mocap)")
    p.add_argument("--batch", "-B", type=batch_arg, default=1, help="requests per batch, or 'auto' for B'")
    p.add_argument("--partition", type=partition_arg, default=None, help="chunk sizes, comma-separated")
    p.add_argument("--max-batch", type=positive_int, default=api.DEFAULT_MAX_BATCH, help="cap of the B' search")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("max-seq", help="longest feasible sequence length (vectorised search)")
    add_config_args(p, seq_len=False)
    p.add_argument("--batch", "-B", type=positive_int, default=1)
    p.add_argument("--granularity", "-g", type=positive_int, default=1, help="sequence lengths in multiples of g")
    p.add_argument("--max-seq-len", type=positive_int, default=1 << 24, help="upper end of the search")
    p.set_defaults(func=cmd_max_seq)

    p = sub.add_parser("max-batch", help="largest feasible batch B' (vectorised search)")
    add_config_args(p)
    p.add_argument("--max-batch", type=positive_int, default=api.DEFAULT_MAX_BATCH)
    p.set_defaults(func=cmd_max_batch)

    p = sub.add_parser("models", help="list model presets")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_models)
    p = sub.add_parser("hardware", help="list hardware presets")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_hardware)

    p = bench_sub.add_parser("pipeline", help="chunked-pipeline evaluations per second")
    p.add_argument("--model", default="llama3-70b")
    p.add_argument("--hardware", default="mocap-4x4")
    p.add_argument("--seq-len", type=positive_int, default=65536)
    p.add_argument("--chunks", type=positive_int, default=32)
    p.add_argument("--partitions", type=positive_int, default=131072, help="random partitions (>= 100,000)")
    p.add_argument("--block", type=positive_int, default=1024, help="partitions per vectorised block")
    p.add_argument("--repeats", type=positive_int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_bench_pipeline)
