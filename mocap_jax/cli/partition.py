"""``mocap-jax compare`` and ``mocap-jax partition``."""

from __future__ import annotations

from .. import api
from ..partition.objectives import OBJECTIVES
from ..partition.plan import PARTITIONED, PlanSettings, plan_partition
from ..prefill.points import MBKRSettings
from ..serving.arrivals import ARRIVALS
from ..study.compare import ALL_SCHEMES, DEFAULT_REQUESTS, CompareSettings, batch_text, compare
from .common import (add_mbkr_args, batch_arg, dumps, fmt, int_list, mbkr_kwargs, number, positive_int, progress,
                     progress_bar, seed, table)
from .core import check_scheme_flags


def _add_common(p):
    p.add_argument("--model", "-m", default="llama3-70b")
    p.add_argument("--hardware", "-w", default="mocap-4x4")
    p.add_argument("--seq-len", "-s", type=positive_int, default=65536)
    p.add_argument("--chunks", "-M", type=positive_int, default=None,
                   help="chunk count of LBCP/MOCAP (default: searched over --chunk-counts) and of the uniform "
                        "schemes (default 16)")
    p.add_argument("--chunk-counts", type=int_list, default=[4, 8, 16, 32],
                   help="chunk counts LBCP/MOCAP search when --chunks is not given")
    p.add_argument("--granularity", "-g", type=positive_int, default=256, help="chunk sizes in multiples of g tokens")
    p.add_argument("--chains", type=positive_int, default=256, help="annealing chains")
    p.add_argument("--steps", type=positive_int, default=600, help="annealing steps")
    p.add_argument("--objective", default="prefill", choices=OBJECTIVES, help="LBCP annealing objective")
    p.add_argument("--max-batch", type=positive_int, default=256, help="upper end of every B' search")
    p.add_argument("--seed", type=seed, default=1)
    p.add_argument("--release", default="stage", choices=api.RELEASE_POLICIES)
    p.add_argument("--admission", default="streaming", choices=api.ADMISSION_MODES)
    p.add_argument("--num-batches", type=positive_int, default=2)
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    p.add_argument("--tp", type=positive_int, default=1,
                   help="tensor-parallel degree: dies (GPUs) per pipeline stage group, for every scheme (default 1)")
    add_mbkr_args(p)
    p.add_argument("--json", action="store_true")


def plan_settings(args) -> PlanSettings:
    return PlanSettings(chunks=args.chunks, chunk_counts=tuple(args.chunk_counts), granularity=args.granularity,
                        chains=args.chains, steps=args.steps, objective=args.objective, seed=args.seed,
                        max_batch=args.max_batch)


def format_compare(res: dict) -> str:
    groups = f" in stage groups of {res['tp']} dies" if res.get("tp", 1) > 1 else ""
    lines = [f"{res['model']} on {res['hardware']}{groups}, S = {res['seq_len']:,} tokens, load {res['load_rps']:.4g} req/s "
             f"({res['arrivals']}, {res['requests']} requests, {res['admission']} admission, {res['release']} release)",
             ""]
    rows = [{**r, "batch": batch_text(r["batch"], res["max_batch"]),
             "choice": ", ".join(f"{k}={v}" for k, v in r["chose"].items()
                                 if k in ("chunks", "microbatch", "batch") or (k == "groups" and len(v) < 6))}
            for r in res["schemes"]]
    max_seq = res.get("with_max_seq", True)       # without the search, max S is not known: no column
    columns = [("scheme", "scheme"), ("batch", "B'"), ("prefill_latency_s", "prefill s"),
               ("e2e_latency_mean_s", "E2E mean s"), ("e2e_latency_p99_s", "E2E p99 s"),
               ("throughput_rps", "sat. req/s"), ("max_seq_len", "max S"), ("e2e_mean_vs_gpipe", "E2E/GPipe"),
               ("e2e_mean_vs_terapipe", "E2E/TeraPipe"), ("throughput_vs_gpipe", "thr/GPipe"),
               ("max_seq_len_vs_terapipe", "maxS/TeraPipe"), ("choice", "chose")]
    lines.append(table(rows, [c for c in columns if max_seq or not c[0].startswith("max_seq_len")], digits=4))
    lines += ["", "B' = the largest batch the scheme's choices admit (\"(cap)\": the search's upper end, --max-batch, "
              "so a larger batch may fit too); sat. = saturation throughput B'/period"
              + ("; max S = longest feasible sequence for one request with the scheme's chunk-size fractions."
                 if max_seq else " (max S not searched: --no-max-seq)."),
              f"wall time {res['wall_s']:.1f} s"]
    unsettled = [r["scheme"] for r in res["schemes"] if r.get("mbkr_converged") is False]
    if unsettled:
        lines.insert(-1, f"{', '.join(unsettled)}: MBKR's last pass still moved the timeline at B' (mbkr_converged "
                         f"false), so a further pass could change that row.")
    return "\n".join(lines)


def cmd_compare(args) -> int:
    load = args.load
    schemes = tuple(s.strip() for s in args.schemes.split(",")) if args.schemes is not None else ALL_SCHEMES
    check_scheme_flags(args, schemes)
    st = CompareSettings(chunks=args.chunks or 16, plan=plan_settings(args), max_batch=args.max_batch,
                         requests=args.requests, arrivals=args.arrivals, seed=args.seed, release=args.release,
                         admission=args.admission, num_batches=args.num_batches, mbkr=MBKRSettings(**mbkr_kwargs(args)),
                         dtype=args.dtype, tp=args.tp, with_max_seq=not args.no_max_seq)
    res = compare(args.model, args.hardware, args.seq_len, load=load, schemes=schemes, settings=st,
                  log=lambda message: progress(message, args.quiet))
    res.pop("plans", None)
    print(dumps(res) if args.json else format_compare(res))
    return 0


def cmd_partition(args) -> int:
    check_scheme_flags(args)
    load = args.load
    with progress_bar(f"{args.scheme} annealing", "step", args.quiet) as advance:
        res = plan_partition(args.model, args.hardware, args.seq_len, args.scheme, settings=plan_settings(args),
                             batch=args.batch, load=load, release=args.release, admission=args.admission,
                             num_batches=args.num_batches, mbkr=MBKRSettings(**mbkr_kwargs(args)), dtype=args.dtype,
                             tp=args.tp, progress=advance)
    if args.json:
        print(dumps(res))
        return 0
    print(f"{args.scheme}: {res['model']} on {res['hardware']}, S = {res['seq_len']:,}, g = {res['granularity']}, "
          f"objective = {res['objective']}; best: M = {res['chunks']}, B' = {res['batch']}, "
          f"{fmt(res['objective_s'], ' s', 5)}")
    rows = []
    for r in res["per_chunks"]:
        for k in ("uniform", "dp", "annealed"):
            rows.append({"chunks": r["chunks"], "start": k, "objective": r[k]["objective_s"], "batch": r[k]["batch"],
                         "partition": " ".join(str(c) for c in r[k]["partition"])})
    print(table(rows, [("chunks", "M"), ("start", "partition"), ("objective", "objective s"), ("batch", "B'"),
                       ("partition", "chunk sizes (tokens)")], digits=5))
    return 0


def register(sub, bench_sub) -> None:
    p = sub.add_parser("compare", help="GPipe, TeraPipe, TeraPipe-DP, MBKR, LBCP and MOCAP on one load")
    _add_common(p)
    p.add_argument("--load", type=number, default=None, help="request rate (requests/s); default 0.5 x the smallest saturation "
                                                "throughput among the schemes")
    p.add_argument("--schemes", default=None, help=f"comma-separated subset of {','.join(ALL_SCHEMES)}")
    p.add_argument("--requests", type=positive_int, default=DEFAULT_REQUESTS, help="simulated requests")
    p.add_argument("--arrivals", default="poisson", choices=[a for a in ARRIVALS if a != "trace"])
    p.add_argument("--no-max-seq", action="store_true", help="skip the max-sequence-length searches")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress lines")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("partition", help="LBCP chunk sizes: uniform, proxy DP and annealed, per chunk count")
    _add_common(p)
    p.add_argument("--scheme", default="mocap", choices=PARTITIONED)
    p.add_argument("--batch", type=batch_arg, default="auto", help="requests per batch, or 'auto' (each candidate's B')")
    p.add_argument("--load", type=number, default=None, help="request rate for --objective e2e")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_partition)
