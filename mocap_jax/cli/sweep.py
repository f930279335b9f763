"""``mocap-jax sweep FILE`` and ``mocap-jax bench sweep`` (schema in ``sweeps/README.md``)."""

from __future__ import annotations

import json
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

from ..bench.machine import describe, host
from .common import counted, rate
from .core import positive_int
from .stderr_filter import sync

# The benchmark's synthetic sweep; sweeps/million.toml holds the same text (a test checks they agree).
MILLION_TOML = """\
# One million prefill points in one run: Llama-3-70B on a 4 x 4 MOCAP wafer, TeraPipe against MBKR,
# over sequence lengths, batches, chunk counts and three die parameters (HBM capacity, HBM bandwidth,
# D2D link bandwidth).  5 x 10 x 10 x 10 x 4 x 25 x 2 = 1,000,000 points in 8 shape buckets
# (4 chunk buckets x {terapipe, mbkr}).  The scheme varies fastest, so any prefix of the sweep
# (`mocap-jax bench sweep --points N`) mixes both schemes and every chunk count and length.
#   mocap-jax sweep sweeps/million.toml --out sweep-results/million
#   mocap-jax bench sweep --json

[sweep]
name = "million"
seed = 0

[fixed]
model = "llama3-70b"
hardware = "mocap-4x4"
num_batches = 2

[grid]
link_bandwidth = [1e12, 2e12, 3e12, 4e12, 5e12]
hbm_bandwidth = [2e12, 3e12, 4e12, 5e12, 6e12, 7e12, 7.7e12, 8e12, 9e12, 10e12]
hbm_capacity = [48e9, 64e9, 80e9, 96e9, 112e9, 128e9, 144e9, 160e9, 180e9, 192e9]
batch = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]
chunks = [4, 8, 16, 32]
seq_len = [8192, 12288, 16384, 24576, 32768, 49152, 65536, 81920, 98304, 114688, 131072, 163840, 196608,
           229376, 262144, 327680, 393216, 458752, 524288, 655360, 786432, 917504, 1048576, 1310720, 1572864]
scheme = ["terapipe", "mbkr"]
"""


def _rows_arg(text: str) -> int:
    return 0 if text.strip() == "0" else positive_int(text)


def _million_source():
    """sweeps/million.toml when running from the repository, else the embedded copy."""
    path = Path(__file__).resolve().parents[1] / "sweeps" / "million.toml"
    return str(path) if path.exists() else MILLION_TOML


def _pct(a, b) -> str:
    return f"{100.0 * a / b:.1f} %" if b else "-"


def format_summary(s) -> str:
    lines = [f"sweep {s.name}: {counted(s.points, 'point')} in {counted(s.buckets, 'shape bucket')}, "
             f"{counted(s.blocks, 'block')} of up to {s.block_size:,}; {counted(s.devices, 'device')} ({s.device_kind})"]
    if s.complete and s.feasible is not None:
        lines.append(f"  feasible        {s.feasible:,} / {s.points:,} ({_pct(s.feasible, s.points)})")
    lines.append(f"  evaluated       {counted(s.evaluated, 'point')} now" +
                 (f", {s.skipped:,} resumed from earlier blocks" if s.skipped else ""))
    lines.append(f"  compiled        {counted(s.compiles, 'program')} in {s.compile_s:.1f} s (at most one per bucket)")
    lines.append(f"  wall time       {s.wall_s:.1f} s, {rate(s.points_per_s)} points/s")
    if s.complete:
        lines.append(f"  results         {s.results}")
    else:
        lines.append(f"  INCOMPLETE      {counted(s.blocks_done, 'block')} written this run; parts in {s.out_dir}/parts; "
                     f"rerun with --resume to finish")
    return "\n".join(lines)


#: buckets a dry run lists one by one (the rest are summed up in one line)
SHOWN_BUCKETS = 40


def format_dry_run(d: dict) -> str:
    lines = [f"sweep {d['name']}: {counted(d['points'], 'point')}, {counted(len(d['buckets']), 'bucket')}, "
             f"{counted(d['blocks'], 'block')} of up to {d['block_size']:,}; config hash {d['config_hash']}",
             f"  planned from {d['representatives']:,} representative points in {d['plan_s']:.2f} s"]
    for b in d["buckets"][:SHOWN_BUCKETS]:
        lines.append(f"  {b['points']:>14,}  {b['label']}")
    rest = d["buckets"][SHOWN_BUCKETS:]
    if rest:
        lines.append(f"  {sum(b['points'] for b in rest):>14,}  ... in {counted(len(rest), 'more bucket')}")
    return "\n".join(lines)


def cmd_sweep(args) -> int:
    from .. import sweep

    if args.dry_run:
        # the run's own checks, so that a dry run that passes is a run that starts (disk space aside:
        # counting a grid too large to write is what a dry run is for)
        sweep.check_run(args.file, args.out, resume=args.resume, overwrite=args.overwrite, devices=args.devices,
                        format=args.format)
        t0 = time.perf_counter()
        d = sweep.describe(args.file, block_size=args.block_size)
        d["plan_s"] = time.perf_counter() - t0
        print(json.dumps(d) if args.json else format_dry_run(d))
        return 0
    s = sweep.run_sweep(args.file, args.out, resume=args.resume, devices=args.devices, block_size=args.block_size,
                        quiet=args.quiet, limit=args.limit, overwrite=args.overwrite, format=args.format)
    sync()  # the progress bar's last redraw is on the terminal before the summary
    print(json.dumps(s.to_dict()) if args.json else format_summary(s))
    return 0


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, MiB (``ru_maxrss`` is KiB on Linux, bytes on macOS)."""
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / (1 << 20) if sys.platform == "darwin" else r / 1024


def _synthetic_outputs(rng, P: int) -> dict:
    """Output columns of the types and rough magnitudes a fast MBKR bucket returns (for the write benchmark)."""
    import numpy as np

    from ..sweep.output import OUTPUT_COLUMNS

    feasible = rng.random(P) < 0.55
    f32 = lambda scale: (rng.lognormal(0.0, 2.0, P) * scale).astype(np.float32)
    out = {"feasible": feasible, "reason": np.where(feasible, "", "memory").astype(object),
           "batch_used": rng.integers(1, 33, P)}
    for k in OUTPUT_COLUMNS:
        if k not in out and k not in ("load_rps", "e2e_mean_s", "e2e_p50_s", "e2e_p99_s", "load_throughput_rps",
                                      "partition"):
            out[k] = f32(1e9 if "bytes" in k else 1.0)
    out["prefill_latency_s"] = np.where(feasible, out["raw_latency_s"], np.float32(np.inf))
    return out


def bench_write(rows: int = 1_000_000, block_size: int = 4096, out: str | None = None) -> list[dict]:
    """Time writing ``rows`` rows of million.toml in each format: its real inputs, synthetic outputs (the
    writer's cost does not depend on the numbers' physics), part files of ``block_size`` rows (the
    time a run spends writing) and the assembly of the results file.  Resolving the points is not
    timed."""
    import numpy as np

    from ..sweep.config import load_sweep
    from ..sweep.merge import assemble
    from ..sweep.output import PartWriter, pyarrow
    from ..sweep.plan import Plan

    plan = Plan(load_sweep(_million_source(), max_points=rows), block_size, 8)
    prov = {"mocap_jax_version": "bench", "config_hash": "0" * 16, "device_kind": "cpu", "devices": 1}
    report = []
    for fmt in ("csv", "parquet"):
        if fmt == "parquet":
            try:
                pyarrow()
            except ValueError as e:
                report.append({"format": fmt, "skipped": str(e)})
                continue
        work = Path(tempfile.mkdtemp(prefix=f"mocap-bench-write-{fmt}-", dir=out))
        try:
            writer = PartWriter(plan.space, fmt, prov, np.float32)
            rng = np.random.default_rng(0)
            parts = {b.index: [] for b in plan.ordered()}
            parts_s = 0.0
            for b, k, ids in plan.blocks():
                r = plan.resolver.resolve(ids)
                outputs = _synthetic_outputs(rng, len(ids))
                path = work / f"b{b.index:03d}-{k:06d}.{fmt}"
                t0 = time.perf_counter()
                writer.write(path, r, outputs, b.index)
                parts_s += time.perf_counter() - t0
                parts[b.index].append(path)
            results = work / f"results.{fmt}"
            t0 = time.perf_counter()
            assemble(results, list(parts.values()), writer)
            assemble_s = time.perf_counter() - t0
            part_bytes = sum(p.stat().st_size for ps in parts.values() for p in ps)
            report.append({"format": fmt, "rows": plan.points, "parts_s": parts_s, "assemble_s": assemble_s,
                           "total_s": parts_s + assemble_s, "results_mb": results.stat().st_size / 1e6,
                           "parts_mb": part_bytes / 1e6})
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return report


def bench_sweep(points: int = 1_000_000, block_size: int | None = None, out: str | None = None, devices=None,
                quiet: bool = False, write_rows: int = 1_000_000) -> dict:
    """Run the first ``points`` points of the million-point sweep (wall time, rate, compile time, peak RSS),
    then time writing ``write_rows`` rows in each output format (:func:`bench_write`; 0 skips it)."""
    import jax

    from .. import sweep

    rss0 = peak_rss_mb()
    machine = host()
    tmp = None
    if out is None:
        tmp = tempfile.mkdtemp(prefix="mocap-bench-sweep-")
        out = tmp
    try:
        jax.devices()
        rss_init = peak_rss_mb()
        t0 = time.perf_counter()
        s = sweep.run_sweep(_million_source(), out, devices=devices, block_size=block_size, quiet=quiet,
                            max_points=points, overwrite=True)
        wall = time.perf_counter() - t0
        size = Path(s.results).stat().st_size if s.results else 0
        rss_run = peak_rss_mb()
        write = bench_write(write_rows, s.block_size, tmp) if write_rows else []
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    eval_s = max(wall - s.compile_s, 1e-9)
    return {
        "benchmark": "sweep", "source": "sweeps/million.toml", "points": s.points, "feasible": s.feasible,
        "buckets": s.buckets, "compiles": s.compiles, "block_size": s.block_size, "micro_batch": s.micro_batch,
        "devices": s.devices, "device_kind": s.device_kind, "wall_s": wall, "compile_s": s.compile_s,
        "points_per_s": s.points / wall, "points_per_s_excluding_compile": s.points / eval_s,
        "peak_rss_mb": rss_run, "rss_before_mb": rss0, "rss_after_jax_init_mb": rss_init,
        "results_csv_mb": size / 1e6, "assemble_s": s.assemble_s, "write": write, **machine,
    }


def bucket_shares(source, points: int) -> dict:
    """``{(chunks, scheme): n}``: how many of the first ``points`` points of a one-grid sweep have
    each chunk count and scheme.  Fixing two digits of a point's mixed-radix index keeps the order
    of the others, so a bucket's points among them are the first ``n`` points of the grid with only
    that chunk count and scheme."""
    import numpy as np

    from ..sweep import load_sweep
    from ..sweep.space import Space

    space = Space(load_sweep(source, max_points=points))
    c = space.codes(np.arange(space.size), keys=("chunks", "scheme"))
    pairs, counts = np.unique(np.stack([c["chunks"], c["scheme"]], axis=1), axis=0, return_counts=True)
    return {(space.tables["chunks"][i], space.tables["scheme"][j]): int(n) for (i, j), n in zip(pairs, counts)}


def bench_sweep_by_bucket(points: int = 1_000_000, block_size: int | None = None, devices=None,
                          quiet: bool = False) -> dict:
    """The points of ``bench_sweep(points)``, one shape bucket (chunk count x scheme) at a time.

    Run alone, a bucket's compile and evaluation do not overlap those of the others, so its
    seconds are its own: where the sweep's time goes.  Each bucket's run evaluates the first
    points of the million-point grid restricted to its chunk count and scheme, as many as the
    first ``points`` points of the sweep hold (:func:`bucket_shares`), so the same points
    (``MILLION_TOML`` is sweeps/million.toml's text; a test checks they agree).
    """
    import tomllib

    from .. import sweep

    cfg = tomllib.loads(MILLION_TOML)
    machine = host()
    rows = []
    for (chunks, scheme), share in bucket_shares(MILLION_TOML, points).items():
        one = {**cfg, "sweep": {**cfg["sweep"], "name": f"million-{scheme}-{chunks}"},
               "grid": {**cfg["grid"], "chunks": [chunks], "scheme": [scheme]}}
        tmp = tempfile.mkdtemp(prefix="mocap-bench-sweep-bucket-")
        try:
            s = sweep.run_sweep(one, tmp, devices=devices, block_size=block_size, quiet=quiet, max_points=share,
                                overwrite=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        eval_s = max(s.wall_s - s.compile_s, 1e-9)
        rows.append({"bucket": s.bucket_labels[0], "chunks": chunks, "scheme": scheme, "points": s.points,
                     "feasible": s.feasible, "compile_s": s.compile_s, "evaluate_s": eval_s,
                     "assemble_s": s.assemble_s, "points_per_s_excluding_compile": s.points / eval_s})
    total = sum(r["evaluate_s"] for r in rows)
    n = sum(r["points"] for r in rows)
    return {"benchmark": "sweep-by-bucket", "source": "sweeps/million.toml", "points": n,
            "devices": s.devices, "device_kind": s.device_kind, "block_size": s.block_size,
            "micro_batch": s.micro_batch, "compile_s": sum(r["compile_s"] for r in rows), "evaluate_s": total,
            "points_per_s_excluding_compile": n / total, "buckets": rows, **machine}


def _check_bench_points(points: int) -> None:
    """Refuse more points than the million-point sweep holds (rather than measuring fewer than asked)."""
    from ..sweep import load_sweep
    from ..sweep.space import Space

    total = Space(load_sweep(_million_source())).total
    if points > total:
        raise ValueError(f"--points {points:,} exceeds the {total:,} points of sweeps/million.toml; pass at most "
                         f"{total:,}")


def cmd_bench_sweep(args) -> int:
    _check_bench_points(args.points)
    if args.by_bucket:
        if args.out is not None or args.write_rows is not None:
            raise ValueError("--by-bucket keeps no results and writes no rows: drop --out and --write-rows")
        d = bench_sweep_by_bucket(args.points, args.block_size, args.devices, args.quiet)
        if args.json:
            print(json.dumps(d))
            return 0
        print(f"sweep benchmark by bucket: {d['points']:,} points of {d['source']} in "
              f"{counted(len(d['buckets']), 'bucket')}, each run alone, on {counted(d['devices'], d['device_kind'] + ' device')} "
              f"({describe(d)})")
        print(f"  {d['evaluate_s']:.1f} s evaluating ({d['points_per_s_excluding_compile']:,.0f} points/s), "
              f"{d['compile_s']:.1f} s compiling")
        for r in sorted(d["buckets"], key=lambda r: -r["evaluate_s"]):
            print(f"  {r['evaluate_s']:7.1f} s {_pct(r['evaluate_s'], d['evaluate_s']):>7}  "
                  f"{r['points']:>9,} points {r['points_per_s_excluding_compile']:>9,.0f}/s  "
                  f"compile {r['compile_s']:5.1f} s  {r['scheme']}, {r['chunks']} chunks ({r['bucket']})")
        return 0
    rows = 1_000_000 if args.write_rows is None else args.write_rows
    d = bench_sweep(args.points, args.block_size, args.out, args.devices, args.quiet, rows)
    if args.json:
        print(json.dumps(d))
        return 0
    print(f"sweep benchmark: {d['points']:,} points of {d['source']} on {counted(d['devices'], d['device_kind'] + ' device')} "
          f"({describe(d)})")
    print(f"  wall time        {d['wall_s']:.1f} s (compile {d['compile_s']:.1f} s, {d['compiles']} programs; "
          f"merging the parts {d['assemble_s']:.1f} s)")
    print(f"  throughput       {d['points_per_s']:,.0f} points/s ({d['points_per_s_excluding_compile']:,.0f} "
          f"excluding compile)")
    print(f"  peak RSS         {d['peak_rss_mb']:.0f} MiB (after JAX start-up {d['rss_after_jax_init_mb']:.0f} MiB); "
          f"block size {d['block_size']:,}")
    print(f"  feasible         {d['feasible']:,} of {d['points']:,}")
    for w in d["write"]:
        if "skipped" in w:
            print(f"  write {w['format']:<8}  skipped: {w['skipped']}")
            continue
        print(f"  write {w['format']:<8}  {w['rows']:,} rows in {w['total_s']:.1f} s (part files {w['parts_s']:.1f} s, "
              f"assembly {w['assemble_s']:.1f} s); results {w['results_mb']:.0f} MB, parts {w['parts_mb']:.0f} MB")
    return 0


def register(sub, bench_sub) -> None:
    p = sub.add_parser("sweep", help="run a declared sweep (TOML file; see sweeps/README.md) into CSV or Parquet",
                       description="Run a sweep file: every point in a few compiled programs, sharded over all "
                                   "local devices, written block by block (resumable) to OUT/results.csv "
                                   "(or OUT/results.parquet, or the .csv/.parquet file --out names).")
    p.add_argument("file", metavar="FILE", help="sweep file (.toml), e.g. sweeps/quick.toml")
    p.add_argument("--out", "-o", default=None,
                   help="output directory (default sweep-results/NAME), or a results file NAME.csv / NAME.parquet")
    p.add_argument("--resume", action="store_true", help="skip blocks already written by an earlier run")
    p.add_argument("--overwrite", action="store_true", help="discard an earlier run's files in --out first")
    p.add_argument("--block-size", type=positive_int, default=None,
                   help="points per compiled call (default from the file, else 4096 on CPU)")
    p.add_argument("--limit", type=positive_int, default=None,
                   help="stop after about N newly evaluated points (whole blocks); finish later with --resume")
    p.add_argument("--devices", type=positive_int, default=None, help="use only the first N local devices")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.add_argument("--format", choices=("csv", "parquet"), default=None,
                   help="results format (default: the extension of --out when it names a .csv/.parquet file, else csv)")
    p.add_argument("--dry-run", action="store_true",
                   help="validate, count points, buckets and blocks (arithmetically); evaluate nothing")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.set_defaults(func=cmd_sweep)

    b = bench_sub.add_parser("sweep", help="the million-point sweep: points/s, compile time, peak RSS")
    b.add_argument("--points", type=positive_int, default=1_000_000,
                   help="evaluate the first N points of sweeps/million.toml (default 1,000,000)")
    b.add_argument("--block-size", type=positive_int, default=None, help="points per compiled call")
    b.add_argument("--devices", type=positive_int, default=None, help="use only the first N local devices")
    b.add_argument("--out", default=None, help="keep the results here (default: a temporary directory, deleted)")
    b.add_argument("--write-rows", type=_rows_arg, default=None,
                   help="then time writing this many rows as CSV and as Parquet (default 1,000,000; 0 skips)")
    b.add_argument("--by-bucket", action="store_true",
                   help="run the same points one shape bucket (chunk count x scheme) at a time: each bucket's "
                        "compile and evaluation seconds apart (--out and --write-rows do not apply)")
    b.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    b.add_argument("--json", action="store_true", help="print one JSON object")
    b.set_defaults(func=cmd_bench_sweep)
