"""``mocap-jax compare``, ``mocap-jax partition`` and ``mocap-jax bench anneal``."""

from __future__ import annotations

import json
import math
import time
from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np

from .. import api, compare, lbcp
from ..specs import mesh
from .core import positive_int
from ..evaluate import PrefillObjective
from ..mbkr import DEFAULT_P1, DEFAULT_P2, DEFAULT_READ_OVERLAP, PAIRINGS
from ..schedule import SimShape, bucket
from ..serving import ARRIVALS


def _add_common(p):
    p.add_argument("--model", "-m", default="llama3-70b")
    p.add_argument("--hardware", "-w", default="mocap-4x4")
    p.add_argument("--seq-len", "-s", type=positive_int, default=65536)
    p.add_argument("--chunks", "-M", type=positive_int, default=16)
    p.add_argument("--granularity", "-g", type=positive_int, default=256, help="chunk sizes in multiples of g tokens")
    p.add_argument("--chains", type=positive_int, default=256, help="annealing chains")
    p.add_argument("--steps", type=positive_int, default=600, help="annealing steps")
    p.add_argument("--objective", default="prefill", choices=compare.OBJECTIVES,
                   help="LBCP annealing objective (e2e uses --load)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--release", default="stage", choices=api.RELEASE_POLICIES)
    p.add_argument("--admission", default="streaming", choices=api.ADMISSION_MODES)
    p.add_argument("--pairing", default="cross-half", choices=PAIRINGS)
    p.add_argument("--p1", type=float, default=DEFAULT_P1)
    p.add_argument("--p2", type=float, default=DEFAULT_P2)
    p.add_argument("--read-overlap", type=float, default=DEFAULT_READ_OVERLAP)
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    p.add_argument("--json", action="store_true")


def _load(text):
    try:
        v = float(text)
    except ValueError:
        raise ValueError(f"--load must be a request rate in requests/s, got {text!r}") from None
    if not v > 0 or not math.isfinite(v):
        raise ValueError(f"--load must be a positive request rate in requests/s, got {text}")
    return v


def _settings(args) -> compare.PlanSettings:
    return compare.PlanSettings(chunks=args.chunks, granularity=args.granularity, chains=args.chains,
                                steps=args.steps, objective=args.objective, seed=args.seed)


def _mbkr(args) -> api.MBKRConfig:
    return api.MBKRConfig(args.pairing, args.p1, args.p2, args.read_overlap)


def _fmt(x, unit="", digits=3):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:.{digits}f}{unit}"


def format_compare(res: dict) -> str:
    lines = [f"{res['model']} on {res['hardware']}, S = {res['seq_len']:,} tokens, load {res['load_rps']:.4g} req/s "
             f"({res['arrivals']}, {res['requests']} requests); M = {res['chunks']}, g = {res['granularity']}",
             "",
             f"{'scheme':12s} {'B':>4s} {'prefill s':>10s} {'E2E mean s':>11s} {'E2E p99 s':>10s} {'sat. req/s':>11s} "
             f"{'max S':>10s} {'E2E/GPipe':>10s} {'E2E/TeraP':>10s} {'thr/TeraP':>10s} {'maxS/TeraP':>11s}"]
    for r in res["schemes"]:
        lines.append(
            f"{r['scheme']:12s} {r['batch']:4d} {_fmt(r['prefill_latency_s']):>10s} {_fmt(r['e2e_latency_mean_s']):>11s} "
            f"{_fmt(r['e2e_latency_p99_s']):>10s} {_fmt(r['throughput_rps']):>11s} {r['max_seq_len']:>10,d} "
            f"{_fmt(r['e2e_mean_vs_gpipe'], 'x', 2):>10s} {_fmt(r['e2e_mean_vs_terapipe'], 'x', 2):>10s} "
            f"{_fmt(r['throughput_vs_terapipe'], 'x', 2):>10s} {_fmt(r['max_seq_len_vs_terapipe'], 'x', 2):>11s}")
    lines.append("")
    lines.append("B = largest feasible batch B' (GPipe: one request per microbatch, streaming); sat. = saturation "
                 "throughput B'/period; max S = longest feasible sequence at B = 1.")
    lines.append(f"wall time {res['wall_s']:.1f} s")
    return "\n".join(lines)


def cmd_compare(args) -> int:
    load = None if args.load is None else _load(args.load)
    schemes = tuple(s.strip() for s in args.schemes.split(",")) if args.schemes else compare.ALL_SCHEMES
    res = compare.compare(args.model, args.hardware, args.seq_len, load=load, schemes=schemes, chunks=args.chunks,
                          granularity=args.granularity, requests=args.requests, arrivals=args.arrivals,
                          settings=_settings(args), mbkr=_mbkr(args), dtype=args.dtype, seed=args.seed,
                          with_max_seq=not args.no_max_seq, release=args.release, admission=args.admission)
    print(json.dumps(res) if args.json else format_compare(res))
    return 0


def cmd_partition(args) -> int:
    load = None if args.load is None else _load(args.load)
    batch = "auto" if args.batch == "auto" else positive_int(args.batch)
    res = compare.plan_partition(args.model, args.hardware, args.seq_len, args.scheme, settings=_settings(args),
                                 batch=batch, load=load, release=args.release, admission=args.admission,
                                 mbkr=_mbkr(args), dtype=args.dtype)
    if args.json:
        print(json.dumps(res))
        return 0
    print(f"{args.scheme}: {res['model']} on {res['hardware']}, S = {res['seq_len']:,}, M = {res['chunks']}, "
          f"g = {res['granularity']}, B = {res['batch']}, objective = {res['objective']}")
    for k in ("uniform", "dp", "annealed"):
        print(f"  {k:9s} {_fmt(res[k]['objective_s'], ' s', 4):>12s}  {res[k]['partition']}")
    a = res["anneal"]
    print(f"  proxy optimum {res['dp']['proxy_s']:.4f} s ({res['dp']['caps_evaluated']} caps evaluated); annealing "
          f"{a['chains']} chains x {a['steps']} steps in {a['wall_s']:.1f} s, acceptance {100 * a['accept_rate']:.0f}%")
    return 0


#: default batch of ``bench anneal``, as a fraction of B' of the uniform partition
BENCH_BATCH_FRACTION = 0.95


def bench_anneal(model="llama3-70b", hardware="mocap-4x4", seq_len=65536, chunks=16, granularity=256, chains=1024,
                 steps=2000, batch=None, num_batches=1, seed=0) -> dict:
    """Wall time of annealing ``chains`` x ``steps`` with the full MBKR prefill evaluation, compile included.

    The batch defaults to 95% of B', the largest batch (of 1..``chains`` requests) that the uniform
    partition fits under the annealed objective itself (one batch, MBKR with cross-half pairs): MBKR
    is active there, and neighbouring partitions still fit, so the chains move (at B' itself every
    move from the uniform partition overflows).  B' is found by the project's bracket search
    (``api._largest_true``; feasibility is monotone in the batch) through the annealer's own
    compiled step, so the search compiles nothing.

    Returns:
      dict with ``total_s`` (everything: placement search, compile, batch search, annealing),
      ``steps_per_s`` (chain-steps per second of the step loop) and the parts of the total.
    """
    t0 = time.perf_counter()
    m, hw = api.get_model(model), api.get_hardware(hardware)
    n = hw.num_dies
    U = lbcp.check_granularity(seq_len, chunks, granularity)
    cfg = api.MBKRConfig()
    uni_units = compare._uniform_units(U, chunks)
    shape = SimShape(k_pad=chunks, n_pad=bucket(n), num_batches=num_batches, mbkr="static")
    obj = PrefillObjective(shape)
    uniform = np.broadcast_to(uni_units, (chains, chunks))

    def point_on(placement):
        return api._point(m, hw, api.chunked_item_table(uni_units * granularity, 1, chunks), placement, bucket(n),
                          "streaming", "stage", np.float32, cfg, "static")

    # the step program depends on the placement's shapes only: compile it (on a snake placement)
    # while the placement search runs
    with ThreadPoolExecutor(1) as pool:
        warm = pool.submit(lbcp.evaluate_partitions, obj,
                           compare._context(point_on(mesh.snake_placement(hw, n)), granularity, 1, np.zeros(1)),
                           uniform)
        pl = api.check_placement(hw, None, n, "mbkr")
        placement_s = time.perf_counter() - t0
        warm.result()
    point = point_on(pl)
    context = lambda b: compare._context(point, granularity, b, np.zeros(1))
    t1 = time.perf_counter()
    values = {}                                  # batch -> objective of the uniform partition

    def value(b):
        if b not in values:
            values[b] = float(lbcp.evaluate_partitions(obj, context(b), uniform)[0])
        return values[b]

    if batch is None:
        fits = lambda batches: [np.isfinite(value(int(b))) for b in batches]
        batch = max(int(BENCH_BATCH_FRACTION * max(api._largest_true(fits, 1, chains, grid=4), 0)), 1)
    search_s = time.perf_counter() - t1
    ctx = context(batch)
    t2 = time.perf_counter()
    res = lbcp.anneal(obj, ctx, uni_units, jax.random.PRNGKey(seed), chains=chains, steps=steps)
    anneal_s = time.perf_counter() - t2
    total = time.perf_counter() - t0
    return {"benchmark": "anneal", "model": m.name, "hardware": hw.name, "seq_len": seq_len, "chunks": chunks,
            "granularity": granularity, "chains": chains, "steps": steps, "batch": int(batch),
            "num_batches": num_batches, "total_s": total, "placement_s": placement_s,
            "compile_s": t1 - t0, "batch_search_s": search_s, "anneal_s": anneal_s,
            "steps_per_s": chains * steps / anneal_s, "best_objective_s": res.objective,
            "uniform_objective_s": value(int(batch)), "accept_rate": res.accept_rate,
            "device_kind": jax.devices()[0].device_kind, "devices": len(jax.devices())}


def cmd_bench_anneal(args) -> int:
    r = bench_anneal(args.model, args.hardware, args.seq_len, args.chunks, args.granularity, args.chains, args.steps,
                     batch=args.batch, seed=args.seed)
    if args.json:
        print(json.dumps(r))
    else:
        print(f"annealing {r['chains']} chains x {r['steps']} steps, {r['model']} on {r['hardware']}, "
              f"S = {r['seq_len']:,}, M = {r['chunks']}, B = {r['batch']}, full MBKR prefill evaluation")
        print(f"  total {r['total_s']:.1f} s: placement search and compile {r['compile_s']:.1f} s (side by side; "
              f"placement {r['placement_s']:.1f} s), batch search {r['batch_search_s']:.2f} s, annealing "
              f"{r['anneal_s']:.1f} s ({r['steps_per_s']:,.0f} chain-steps/s)")
        print(f"  objective: uniform {r['uniform_objective_s']:.4f} s -> best {r['best_objective_s']:.4f} s")
    return 0


def register(sub, bench_sub) -> None:
    p = sub.add_parser("compare", help="GPipe, TeraPipe, TeraPipe-DP, MBKR, LBCP and MOCAP on one load")
    _add_common(p)
    p.add_argument("--load", default=None, help="request rate (requests/s); default 0.5 x the smallest saturation "
                                                "throughput among the schemes")
    p.add_argument("--schemes", default=None, help=f"comma-separated subset of {','.join(compare.ALL_SCHEMES)}")
    p.add_argument("--requests", type=positive_int, default=compare.DEFAULT_REQUESTS, help="simulated requests")
    p.add_argument("--arrivals", default="poisson", choices=[a for a in ARRIVALS if a != "trace"])
    p.add_argument("--no-max-seq", action="store_true", help="skip the max-sequence-length searches")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("partition", help="LBCP chunk sizes: uniform, proxy DP and annealed")
    _add_common(p)
    p.add_argument("--scheme", default="mocap", choices=compare.PARTITIONED)
    p.add_argument("--batch", default="auto", help="requests per batch or 'auto' (B' of the DP partition)")
    p.add_argument("--load", default=None, help="request rate for --objective e2e")
    p.set_defaults(func=cmd_partition)

    p = bench_sub.add_parser("anneal", help="LBCP annealing with full MBKR evaluation (wall time incl. compile)")
    p.add_argument("--model", default="llama3-70b")
    p.add_argument("--hardware", default="mocap-4x4")
    p.add_argument("--seq-len", type=positive_int, default=65536)
    p.add_argument("--chunks", type=positive_int, default=16)
    p.add_argument("--granularity", type=positive_int, default=256)
    p.add_argument("--chains", type=positive_int, default=1024)
    p.add_argument("--steps", type=positive_int, default=2000)
    p.add_argument("--batch", type=positive_int, default=None,
                   help="requests per batch (default: 95%% of B' of the uniform partition)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_bench_anneal)
