"""``simulate``, ``max-seq``, ``max-batch``, ``models`` and ``hardware``."""

from __future__ import annotations

import math

import numpy as np

from .. import api
from ..api.simulate import run
from ..specs import HARDWARE_PRESETS, MODEL_PRESETS, get_hardware, get_model
from .common import (MBKR_DEFAULTS, add_mbkr_args, batch_arg, counted, dumps, fmt, int_list, mbkr_kwargs,
                     placement_arg, positive_int, table)

PLANNED_SCHEMES = ("terapipe-dp", "lbcp", "mocap")


def add_config_args(p, schemes=None, seq_len=True, num_batches=2,
                    num_batches_help="consecutive batches simulated"):
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
    p.add_argument("--num-batches", type=positive_int, default=num_batches,
                   help=f"{num_batches_help} (default {num_batches})")
    p.add_argument("--microbatch", type=positive_int, default=1, help="requests per GPipe microbatch")
    p.add_argument("--stages", type=positive_int, default=None,
                   help="pipeline stages (default: every die, or dies / tp stage groups)")
    p.add_argument("--tp", type=positive_int, default=1,
                   help="tensor-parallel degree: dies (GPUs) per pipeline stage (default 1)")
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    p.add_argument("--placement", type=placement_arg, default=None,
                   help="stage-to-die map: snake, searched, or comma-separated die indices; with --tp, the dies "
                        "of each group, groups separated by ';' (default: searched for MBKR schemes, snake otherwise)")
    add_mbkr_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the summary")


MBKR_SCHEMES = ("mbkr", "mocap")
ANNEALED_SCHEMES = ("lbcp", "mocap")


def check_scheme_flags(args, schemes=None) -> None:
    """Refuse a flag none of the chosen schemes (default ``args.scheme``) reads: it would change nothing,
    and identical results would read as "this setting does not matter"."""
    schemes = (args.scheme,) if schemes is None else tuple(schemes)
    chosen = ", ".join(schemes)
    verb = "is" if len(schemes) == 1 else "are"

    def given(dest: str) -> bool:
        default = PARSER_DEFAULTS.get(dest)
        return hasattr(args, dest) and getattr(args, dest) is not None and getattr(args, dest) != default

    if set(schemes) == {"gpipe"} and given("chunks"):
        raise ValueError("--chunks does not apply to gpipe, which runs whole requests in microbatches "
                         "(--microbatch); drop it or choose a chunked scheme")
    if "gpipe" not in schemes and given("microbatch"):
        raise ValueError(f"--microbatch applies to gpipe, and {chosen} split{'s' if verb == 'is' else ''} requests "
                         f"into chunks (--chunks): drop it")
    if not set(schemes) & set(MBKR_SCHEMES):
        for flag in ("--pairing", "--p1", "--p2", "--read-overlap", "--spill"):
            if given(flag[2:].replace("-", "_")):
                raise ValueError(f"{flag} applies to the MBKR schemes ({', '.join(MBKR_SCHEMES)}), and {chosen} "
                                 f"{verb} not one of them: drop it or choose one")
    if not set(schemes) & set(ANNEALED_SCHEMES):
        for flag in ("--chains", "--steps"):
            if given(flag[2:]):
                raise ValueError(f"{flag} applies to the schemes that anneal their chunk sizes "
                                 f"({', '.join(ANNEALED_SCHEMES)}), and {chosen} {verb} not one of them: drop it")


#: annealing defaults of ``simulate --scheme lbcp/mocap``
CHAINS, STEPS = 256, 600
#: defaults of the flags :func:`check_scheme_flags` checks (a flag left at its default is not "given")
PARSER_DEFAULTS = {"chunks": None, "microbatch": 1, **MBKR_DEFAULTS, "chains": CHAINS, "steps": STEPS}


def sim_kwargs(args) -> dict:
    return dict(chunks=args.chunks, release=args.release, admission=args.admission, num_batches=args.num_batches,
                microbatch=args.microbatch, stages=args.stages, dtype=args.dtype, placement=args.placement,
                tp=args.tp, **mbkr_kwargs(args))


def format_result(r: api.SimResult) -> str:
    """Readable multi-line summary of a :class:`~mocap_jax.api.SimResult`."""
    lat = f"{r.prefill_latency_s:.4f} s" if math.isfinite(r.prefill_latency_s) else \
        f"inf (infeasible; {r.raw_latency_s:.4f} s ignoring memory)"
    items = f"M = {r.chunks} chunks" if r.scheme != "gpipe" else counted(r.extra['items_per_batch'], 'microbatch',
                                                                            'microbatches')
    head = (f"{r.scheme} | {r.model} on {r.hardware} ({counted(r.num_stages, 'stage')}) | S = {r.seq_len:,} tokens | "
            f"B = {r.batch} | {items}")
    lines = [head, "-" * len(head),
             f"  feasible           {'yes' if r.feasible else 'NO: some stage exceeds its usable HBM'}",
             f"  prefill latency    {lat}",
             f"  throughput         {r.throughput_rps:.3f} requests/s (saturation, {r.admission} admission)",
             f"  bubble fraction    {100 * r.bubble_fraction:.1f} %",
             f"  KV release         {r.release}; {counted(r.num_batches, 'batch', 'batches')} simulated", ""]
    rows = [{"stage": s, "die": int(np.ravel(r.placement[s])[0]), "weights": r.weight_bytes_per_stage[s] / 1e9,
             "kv": r.kv_peak_bytes_per_stage[s] / 1e9, "peak": r.peak_mem_bytes_per_stage[s] / 1e9,
             "usable": r.capacity_bytes / 1e9, "busy": 100 * r.stage_utilisation[s]} for s in range(r.num_stages)]
    lines.append(table(rows, [("stage", "stage"), ("die", "die"), ("weights", "weights GB"), ("kv", "KV peak GB"),
                              ("peak", "peak GB"), ("usable", "usable GB"), ("busy", "busy % of period")]))
    for k, v in r.extra.items():
        if k != "items_per_batch" and not isinstance(v, (list, np.ndarray, dict)):
            lines.append(f"  {k:<22} {fmt(v, digits=6)}")
    return "\n".join(lines)


def cmd_simulate(args) -> int:
    check_scheme_flags(args)
    kw = sim_kwargs(args)
    if args.scheme in PLANNED_SCHEMES:   # chunk sizes planned first (TeraPipe's planner, or LBCP DP + annealing)
        from ..partition.plan import PlanSettings
        from ..prefill.points import MBKRSettings
        from ..study.compare import CompareSettings, plan_scheme

        if args.partition is not None:
            raise ValueError(f"--scheme {args.scheme} plans its own chunk sizes; drop --partition or use terapipe/mbkr")
        st = CompareSettings(chunks=args.chunks or 16, max_batch=args.max_batch, release=args.release,
                             admission=args.admission, num_batches=args.num_batches, dtype=args.dtype,
                             tp=args.tp, mbkr=MBKRSettings(**mbkr_kwargs(args)),
                             plan=PlanSettings(chunks=args.chunks, granularity=args.granularity, chains=args.chains,
                                               steps=args.steps, max_batch=args.max_batch), with_max_seq=False)
        plan = plan_scheme(args.model, args.hardware, args.seq_len, args.scheme, st)
        if plan.config is None:
            raise ValueError(f"no batch of {args.scheme} fits: the model does not fit {args.hardware} at "
                             f"{args.seq_len:,} tokens")
        r = run(plan.config, timeline=False, items=plan.items)
        r.scheme = args.scheme
        r.extra["chose"] = {k: v for k, v in plan.chose.items() if k != "plan"}
    else:
        r = api.simulate(args.model, args.hardware, args.seq_len, args.scheme, batch=args.batch,
                         partition=args.partition, timeline=False, max_batch=args.max_batch, **kw)
    print(dumps(r.to_dict()) if args.json else format_result(r))
    return 0


def cmd_max_seq(args) -> int:
    check_scheme_flags(args)
    kw = sim_kwargs(args)
    kw["chunks"] = kw["chunks"] or 16
    S = api.max_feasible_seq_len(args.model, args.hardware, args.scheme, batch=args.batch,
                                 granularity=args.granularity, max_seq_len=args.max_seq_len, **kw)
    out = {"model": get_model(args.model).name, "hardware": get_hardware(args.hardware).name, "scheme": args.scheme,
           "chunks": kw["chunks"], "batch": args.batch, "num_batches": args.num_batches,
           "granularity": args.granularity, "max_seq_len": S}
    setting = (f"{out['scheme']}, {out['model']} on {out['hardware']}, B = {args.batch}, M = {kw['chunks']}, "
               f"{counted(args.num_batches, 'batch', 'batches')}, multiples of {args.granularity}")
    if args.json:
        print(dumps(out))
    elif S == 0:
        shortest = args.granularity if args.scheme == "gpipe" else -(-kw["chunks"] // args.granularity) * args.granularity
        print(f"no sequence fits: even the shortest, {shortest:,} tokens, does not ({setting}); try a smaller batch")
    else:
        print(f"longest feasible sequence: {S:,} tokens ({setting})")
    return 0


def cmd_max_batch(args) -> int:
    check_scheme_flags(args)
    B = api.max_feasible_batch(args.model, args.hardware, args.seq_len, args.scheme, max_batch=args.max_batch,
                               **sim_kwargs(args))
    out = {"model": get_model(args.model).name, "hardware": get_hardware(args.hardware).name, "scheme": args.scheme,
           "seq_len": args.seq_len, "max_batch": B, "search_cap": args.max_batch}
    print(dumps(out) if args.json else f"largest feasible batch B' = {B} requests (search cap {args.max_batch})")
    return 0


def cmd_models(args) -> int:
    rows = [m.summary() for m in MODEL_PRESETS.values()]
    if args.json:
        print(dumps(rows))
        return 0
    print(table(rows, [("name", "model"), ("layers", "layers"), ("attention", "attn"), ("params_b", "params B"),
                       ("active_params_b", "active B"), ("published_params_b", "published B"),
                       ("weight_gb", "weights GB"), ("kv_bytes_per_token", "KV B/token")]))
    print("\nAny model can also be given as a .json/.toml file with the ModelSpec fields (see README).")
    return 0


def cmd_hardware(args) -> int:
    rows = [h.summary() for h in HARDWARE_PRESETS.values()]
    if args.json:
        print(dumps(rows))
        return 0
    print(table(rows, [("name", "hardware"), ("topology", "topology"), ("grid", "grid"), ("dies", "dies"),
                       ("pflops_total", "PFLOP/s"), ("hbm_tb_total", "HBM TB"), ("hbm_gb_per_die", "GB/die"),
                       ("hbm_tbps_per_die", "TB/s/die"), ("link_tbps", "link TB/s"), ("description", "description")]))
    print("\nAny mesh of the MOCAP die: mocap-RxC (e.g. mocap-6x8); W wafers side by side: mocap-RxCxWw.")
    return 0


def register(sub, bench_sub) -> None:
    p = sub.add_parser("simulate", help="simulate one configuration (GPipe / TeraPipe / MBKR / LBCP / MOCAP)")
    add_config_args(p, schemes=api.SCHEMES + PLANNED_SCHEMES)
    p.add_argument("--granularity", "-g", type=positive_int, default=256,
                   help="chunk sizes in multiples of g tokens (terapipe-dp, lbcp, mocap)")
    p.add_argument("--chains", type=positive_int, default=CHAINS, help="LBCP annealing chains (lbcp, mocap)")
    p.add_argument("--steps", type=positive_int, default=STEPS, help="LBCP annealing steps (lbcp, mocap)")
    p.add_argument("--batch", "-B", type=batch_arg, default=1, help="requests per batch, or 'auto' for B'")
    p.add_argument("--partition", type=int_list, default=None, help="chunk sizes, comma-separated")
    p.add_argument("--max-batch", type=positive_int, default=api.DEFAULT_MAX_BATCH, help="cap of the B' search")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("max-seq", help="longest feasible sequence length (vectorised search)")
    add_config_args(p, seq_len=False, num_batches=1,
                    num_batches_help="consecutive batches that must fit: 1 is the longest sequence of one batch alone, "
                                     "as compare, reproduce and claims report it; 2 asks whether a stream of such "
                                     "batches fits, where a batch's KV meets the next one's")
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
