"""Declared sweeps: a TOML file -> points -> shape buckets -> sharded compiled blocks -> CSV or Parquet.

A sweep file (schema in ``sweeps/README.md``) declares grids (cartesian products) and explicit
rows of points over models, hardware (presets, mesh axes, die parameters), sequence lengths, chunk
counts, batches, schemes, MBKR thresholds, serving load and the annealing settings of the slow
schemes.  :func:`run_sweep`

1. validates the whole file before anything is traced (:mod:`.config`: unknown keys, mistyped or
   unrepresentable values; :mod:`.resolver`: impossible combinations such as more chunks than
   tokens or a model that does not fit a mesh) -- one ``ValueError`` naming the key and the file;
2. counts the points of every shape bucket arithmetically (:mod:`.plan` over the boxes of
   :mod:`.space`), so planning a grid costs the number of its bucket-deciding combinations, not
   of its points;
3. checks the output location and the disk space before any work (:mod:`.layout`);
4. evaluates blocks of points on every local device (:mod:`.evaluate`, the one module that calls
   the simulator), several processes splitting the blocks when ``jax.distributed`` is configured
   (:mod:`.runner`);
5. writes every block atomically as a part file and finally merges them, in point order, into
   the results file (:mod:`.output`); ``resume=True`` skips blocks already on disk.

Points never interact, so a point's numbers do not depend on the block it lands in or on how
blocks are sharded; with ``exact = true`` (the default on CPU) results are bit-identical for any
number of devices.
"""

from __future__ import annotations

from ..specs import SpecError, checks
from .config import KEYS, MAX_BLOCK, SETTINGS, SweepConfig, load_sweep
from .output import COLUMNS, read_results
from .plan import Plan
from .runner import SweepSummary, check_run, maybe_init_distributed, run_sweep

#: points :func:`expand` lists at most (a list of dicts per point)
EXPAND_LIMIT = 1 << 20


def expand(source, max_points: int | None = None) -> list[dict]:
    """Every point's inputs as dicts, in point order (validated; for inspecting small sweeps)."""
    cfg = load_sweep(source, max_points=max_points)
    plan = Plan(cfg, 1, 1)
    if plan.points > EXPAND_LIMIT:
        raise SpecError(f"{cfg.origin}: {plan.points:,} points are too many to list (at most {EXPAND_LIMIT:,}); "
                        f"pass max_points, or use describe() for the counts")
    return [plan.space.point(i) for i in range(plan.points)]


def describe(source, block_size: int | None = None, max_points: int | None = None) -> dict:
    """Points, buckets and blocks of a sweep without evaluating anything (validates it fully).

    ``block_size`` defaults to the file's (else 4096, the CPU default).  Counting is arithmetic:
    ``representatives`` is the number of points actually resolved to count the buckets.
    """
    cfg = load_sweep(source, max_points=max_points)
    block_size = checks.integer("block_size", block_size or cfg.settings["block_size"] or 4096, 1, MAX_BLOCK)
    plan = Plan(cfg, block_size, cfg.settings["serial_block_size"])
    return {"name": cfg.name, "points": plan.points, "config_hash": cfg.config_hash,
            "buckets": [{"key": list(b.key), "label": b.label(), "points": b.points, "blocks": plan.bucket_blocks(b)}
                        for b in plan.ordered()],
            "blocks": plan.num_blocks(), "block_size": plan.block_size, "representatives": plan.representatives}


__all__ = ["KEYS", "SETTINGS", "COLUMNS", "SweepConfig", "SweepSummary", "load_sweep", "run_sweep", "check_run",
           "expand", "describe", "read_results", "maybe_init_distributed"]
