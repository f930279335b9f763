"""``mocap-jax bench pipeline`` and ``mocap-jax bench anneal`` (the other benchmarks register with their commands)."""

from __future__ import annotations

from ..bench.machine import describe_devices
from .common import dumps, positive_int, progress_bar, seed


def cmd_bench_pipeline(args) -> int:
    from ..bench.pipeline import bench_pipeline

    r = bench_pipeline(args.model, args.hardware, args.seq_len, args.chunks, args.points, args.block, args.repeats,
                       args.seed, args.scheme, args.batch, args.num_batches)
    if args.json:
        print(dumps(r))
        return 0
    print(f"{r['path']}: {r['points']:,} random partitions of S = {r['seq_len']:,} into M = {r['chunks']} chunks, "
          f"{r['scheme']}, B = {r['batch']}, {r['model']} on {r['hardware']}, {describe_devices(r)}")
    print(f"  compile + first block {r['compile_and_first_block_s']:.2f} s (separate)")
    print(f"  median run {r['median_s']:.3f} s  ->  {r['evals_per_s']:,.0f} evaluations/s "
          f"(best {r['evals_per_s_best']:,.0f}/s); feasible {100 * r['feasible_share']:.0f}%, "
          f"spilling {100 * r['spilling_share']:.0f}%")
    return 0


def cmd_bench_anneal(args) -> int:
    from ..bench.anneal import bench_anneal

    with progress_bar(f"annealing {args.chains} chains", "step", args.quiet) as advance:
        r = bench_anneal(args.model, args.hardware, args.seq_len, args.chunks, args.granularity, args.chains,
                         args.steps, args.num_batches, args.max_batch, args.seed, progress=advance)
    if args.json:
        print(dumps(r))
        return 0
    print(f"annealing {r['chains']} chains x {r['steps']} steps, {r['model']} on {r['hardware']}, S = {r['seq_len']:,}, "
          f"M = {r['chunks']}: {r['objective']}; {describe_devices(r)}")
    print(f"  total {r['total_s']:.1f} s: placement and uniform B' {r['placement_and_batch_s']:.1f} s, compile "
          f"{r['compile_s']:.1f} s, annealing {r['anneal_s']:.1f} s ({r['steps_per_s']:,.0f} chain-steps/s)")
    print(f"  objective: uniform {r['uniform_objective_s']:.5f} s -> best {r['best_objective_s']:.5f} s per request")
    return 0


def register(sub, bench_sub) -> None:
    p = bench_sub.add_parser("pipeline", help="full prefill evaluations per second (simulate_batch)")
    p.add_argument("--model", default="llama3-70b")
    p.add_argument("--hardware", default="mocap-4x4")
    p.add_argument("--seq-len", type=positive_int, default=65536)
    p.add_argument("--chunks", type=positive_int, default=32)
    p.add_argument("--scheme", default="terapipe", choices=("terapipe", "mbkr"))
    p.add_argument("--batch", type=positive_int, default=None,
                   help="requests per batch (default 1; for mbkr 10%% above the plain B')")
    p.add_argument("--num-batches", type=positive_int, default=1)
    p.add_argument("--points", type=positive_int, default=131072,
                   help="random partitions (the speed target is set on at least 100,000)")
    p.add_argument("--block", type=positive_int, default=16384, help="points per compiled call")
    p.add_argument("--repeats", type=positive_int, default=3)
    p.add_argument("--seed", type=seed, default=1)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_bench_pipeline)

    p = bench_sub.add_parser("anneal", help="LBCP annealing with the full MBKR objective incl. B' (wall time)")
    p.add_argument("--model", default="llama3-70b")
    p.add_argument("--hardware", default="mocap-4x4")
    p.add_argument("--seq-len", type=positive_int, default=65536)
    p.add_argument("--chunks", type=positive_int, default=16)
    p.add_argument("--granularity", type=positive_int, default=256)
    p.add_argument("--chains", type=positive_int, default=1024)
    p.add_argument("--steps", type=positive_int, default=2000)
    p.add_argument("--num-batches", type=positive_int, default=1)
    p.add_argument("--max-batch", type=positive_int, default=256)
    p.add_argument("--seed", type=seed, default=1)
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_bench_anneal)
