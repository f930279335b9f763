"""TeraPipe's planner: split a batch into request groups, slice each group, run the groups back to back.

TeraPipe (Li et al., ICML 2021, and the planner of its public implementation) plans a batch of B
requests of S tokens on an N-stage pipeline by minimising its latency model

    T = sum_k t_k + (N - 1) * max_k t_k

over every slice k of every group, ``t_k`` the slice's time on the bottleneck stage.  A plan
splits the B requests into groups (request counts summing to B), cuts each group's S tokens into
slices of whole units of the granularity g (``U = S / g`` units), and runs all slices of one group,
then all slices of the next.  A slice of a group of b requests covering units ``[y, x)`` costs
``C_b[y, x]`` seconds (:func:`cost_tables` builds the tables for b = 1..B; the slice ending at U
carries the LM head).

Recurrence, for a cap c on the largest slice time:

    F_c[b, 0] = 0,   F_c[b, x] = min over y < x with C_b[y, x] <= c of  F_c[b, y] + C_b[y, x]
    G_c[0]    = 0,   G_c[a]    = min over 1 <= b <= a of  G_c[a - b] + F_c[b, U]
    T*        = min over caps c of  G_c[B] + (N - 1) * c

``F_c[b, U]`` is the least total time of one group of b requests whose slices (any number) all
take at most c; ``G_c[a]`` the least total time of groups covering a requests.  The caps are the
distinct finite entries of the tables.

What is exact.  T* is the optimum of the latency model over every (group split, slicing) the
tables allow: a plan whose largest slice takes m is feasible at the cap m, so ``G_m[B]`` is at
most its total and T* at most its T; and the plan built at any cap c has ``T <= G_c[B] + (N-1) c``,
so the plan built at the minimising cap attains T*.  The search skips a cap only on a proof that
it cannot win: ``G_c[B]`` does not increase with c (in floating point too, since rounding is
monotone), so a cap c below an evaluated cap c' has objective at least ``G_c'[B] + (N - 1) c``;
caps whose bound is worse than the best objective found are dropped (in particular every cap
below an infeasible one).  Each round evaluates up to ``batch_caps`` of the remaining caps, spread
evenly over them, as one vmapped program over caps and group sizes, until none remains.  Ties
between plans of equal objective go to the smallest cap, then to the first minimum of the
recurrences (the smallest last group, the last slice that starts earliest), so a plan depends on
its tables and batch alone.

Several batches, one search.  A cap's recurrences give ``G_c[a]`` for every a at once, so a batch
search (the largest batch whose plan fits) plans all its candidates in one search over caps
(:func:`plan_batches`): a cap stays open while it may still win for one of them, and each batch
considers only the caps its own tables hold.  Each plan equals the plan of its batch alone.

Against the original implementation: the same two recurrences and the same optimum, bit for bit on
the same tables (its objective uses the largest slice on the chosen path, which at the optimum is
the cap); it also skips caps within 1e-5 s of the previous one tried, a shortcut that can miss the
optimum and is not taken here.

Group sizes are padded to a power of two (tables of padded sizes are ``inf``, and the batch is read
only on the host), so batches in one bucket share one compiled program.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..api.config import check_dtype, check_stages
from ..costs import HardwareParams, ModelParams, StageLayout
from ..costs.computed_once import COMPILE_BOUND_OPTIONS
from ..prefill.evaluate import evaluate
from ..prefill.points import build_point, stage_layout
from ..schedule.items import ItemTable, item_table, pad_items
from ..schedule.shape import SimShape, bucket
from ..specs import LIMITS, SpecError, get_hardware, get_model
from ..specs.checks import integer
from ..specs.mesh import snake_placement
from .dp import check_granularity, chunk_cost_matrix, free_slicing_dp, slicing_from_back, terapipe_dp

#: group sizes whose cost tables are built in one vectorised step: bounds the stage-time
#: intermediate (``[TABLE_BATCH, U + 1, U + 1, N_pad]``) for large batches
TABLE_BATCH = 16


class TeraPipePlan(NamedTuple):
    """An optimal TeraPipe plan of one batch.

    Fields:
      groups: request counts of the groups, in run order (sum = the batch).
      slicings: per group, ``int64 [M_g]`` slice sizes in tokens (sum = S).
      objective: TeraPipe's latency model of the plan, seconds.
      cap: the winning cap on slice time, seconds (with N > 1, the plan's largest slice time).
      caps_evaluated: caps the search evaluated (of the distinct finite table entries).
    """

    groups: tuple
    slicings: tuple
    objective: float
    cap: float
    caps_evaluated: int


def _tables(model, hw, layout, units, granularity, batch, sizes, n_pad):
    one = lambda b: chunk_cost_matrix(model, hw, layout, units, granularity, b, n_pad)
    C = jax.lax.map(one, sizes, batch_size=TABLE_BATCH)
    return jnp.where((sizes <= batch)[:, None, None], C, jnp.inf)


_tables_jit = jax.jit(_tables, static_argnums=(3, 7))


#: slice costs the planner may hold: every (group size, first unit, end unit) on the host, and every
#: (first unit, end unit, stage) of the group sizes computed at once on the device (float32: 512 MiB)
MAX_TABLE_CELLS = 2 ** 27


def check_table_size(units: int, batch_pad: int, n_pad: int, granularity: int, seq_len: int) -> None:
    """Refuse tables beyond :data:`MAX_TABLE_CELLS` (``SpecError`` naming the granularity that fits)."""
    pairs = (units + 1) ** 2
    cells = max(batch_pad * pairs, min(batch_pad, TABLE_BATCH) * n_pad * pairs)
    if cells > MAX_TABLE_CELLS:
        per_pair = max(batch_pad, min(batch_pad, TABLE_BATCH) * n_pad)
        fit = int((MAX_TABLE_CELLS // per_pair) ** 0.5) - 1
        raise SpecError(f"TeraPipe's planner would tabulate {cells:,} slice costs for S / g = {units:,} units "
                        f"(g = {granularity}), more than the {MAX_TABLE_CELLS:,} it holds; use a granularity dividing S "
                        f"of at least {-(-seq_len // max(fit, 1)):,} tokens (at most {fit:,} units) or a smaller batch")


def cost_tables(model: ModelParams, hw: HardwareParams, layout: StageLayout, units: int, granularity: int,
                batch: int, n_pad: int, batch_pad: int | None = None) -> np.ndarray:
    """Cost tables of every group size: ``C[b - 1, y, x]`` = bottleneck-stage seconds of a slice of a
    group of b requests covering units ``[y, x)``, ``inf`` where ``x <= y``.

    Shape ``[batch_pad, U + 1, U + 1]`` (``batch_pad`` defaults to the power-of-two bucket of the
    batch); rows of sizes above ``batch`` are ``inf``.  One compiled program per (U, N_pad, bucket).
    """
    batch_pad = bucket(batch, 1) if batch_pad is None else batch_pad
    check_table_size(units, batch_pad, n_pad, granularity, units * granularity)
    sizes = np.arange(1, batch_pad + 1, dtype=np.int32)
    return np.asarray(_tables_jit(model, hw, layout, units, granularity, np.int32(batch), sizes, n_pad))


def _group_split(sums):
    """``G[0..B_pad]`` and backpointers ``back[B_pad]`` (``back[a - 1]``: size of the last group of the
    best split of a requests), from ``sums[B_pad]`` = ``F[b, U]`` for b = 1..B_pad.  ``G[a]`` reads
    only group sizes up to a, so one split serves every batch."""
    sizes = jnp.arange(1, sums.shape[0] + 1)

    def step(G, a):
        cand = jnp.where(sizes <= a, G[jnp.maximum(a - sizes, 0)] + sums, jnp.inf)
        return G.at[a].set(jnp.min(cand)), sizes[jnp.argmin(cand)]

    return jax.lax.scan(step, jnp.full(sums.shape[0] + 1, jnp.inf, sums.dtype).at[0].set(0.0), sizes)


def _plan_at(tables, cap):
    """Least total times ``G_cap[0..B_pad]`` with the backpointers of the slicings and of the split."""
    sums, slicing_back = jax.vmap(free_slicing_dp, in_axes=(0, None))(tables, cap)
    totals, group_back = _group_split(sums)
    return totals, slicing_back, group_back


_plans = jax.jit(jax.vmap(_plan_at, in_axes=(None, 0)))
_evaluate_jit = jax.jit(evaluate, static_argnums=1, compiler_options=COMPILE_BOUND_OPTIONS)
""":func:`_plan_at` for a batch of caps ``[P]`` (tables ``[B_pad, U + 1, U + 1]``): ``G_c [P, B_pad + 1]``,
slicing backpointers ``[P, B_pad, U + 1]``, split backpointers ``[P, B_pad]``."""


class _Winner(NamedTuple):
    """The best cap found for one batch: its index among the caps, objective and backpointers."""

    index: int
    objective: float
    slicing_back: np.ndarray | None
    group_back: np.ndarray | None


def _search_caps(tables: np.ndarray, num_stages: int, batches: np.ndarray, batch_caps: int):
    """The minimising cap of every batch (the smallest cap among equal objectives), the caps and the
    number of caps evaluated.  Every evaluated cap serves every batch; a cap stays open while it
    may still win for some batch whose tables hold it."""
    dtype = tables.dtype
    flat = tables[: int(batches.max())].reshape(-1)
    finite = np.flatnonzero(np.isfinite(flat))
    caps, first = np.unique(flat[finite], return_index=True)
    # a cap is a candidate of batch B when a group size up to B holds it
    first_size = finite[first] // (tables.shape[1] * tables.shape[2]) + 1
    del flat, finite, first
    stretch = caps * dtype.type(num_stages - 1)          # (N - 1) c, rounded as in the objective
    winners = [_Winner(-1, np.inf, None, None) for _ in batches]
    done, done_totals = np.empty(0, np.int64), np.empty((0, len(batches)), dtype)   # evaluated caps, G_c[B]
    open_ = np.ones(caps.shape, bool)
    device_tables, evaluated = jnp.asarray(tables), 0
    while open_.any():
        remaining = np.flatnonzero(open_)
        # spread over the remaining caps; the first round includes the largest (every plan feasible)
        pick = remaining[np.unique(np.linspace(0, len(remaining) - 1, min(batch_caps, len(remaining))).round()
                                   .astype(np.int64))]
        probe = np.concatenate([caps[pick], np.full(batch_caps - len(pick), caps[pick[-1]], dtype)])
        totals, slicing_back, group_back = _plans(device_tables, jnp.asarray(probe))
        totals = np.asarray(totals)[: len(pick)][:, batches]
        open_[pick] = False
        evaluated += len(pick)
        for j, batch in enumerate(batches):
            objective = np.where(first_size[pick] <= batch, totals[:, j] + stretch[pick], np.inf)
            k = int(np.argmin(objective))                 # pick ascends: the smallest cap of the minimum
            w = winners[j]
            if objective[k] < w.objective or (objective[k] == w.objective and pick[k] < w.index):
                winners[j] = _Winner(int(pick[k]), objective[k], np.asarray(slicing_back[k]),
                                     np.asarray(group_back[k]))
        order = np.argsort(np.concatenate([done, pick]))
        done, done_totals = np.concatenate([done, pick])[order], np.concatenate([done_totals, totals])[order]
        remaining = np.flatnonzero(open_)
        above = np.searchsorted(done, remaining)          # the next evaluated cap above each remaining one
        could = np.zeros(remaining.shape, bool)
        for j, batch in enumerate(batches):
            # G_c[B] does not increase with c: the cap above bounds every cap below it
            bound, w = done_totals[above, j] + stretch[remaining], winners[j]
            could |= (first_size[remaining] <= batch) & ((bound < w.objective)
                                                         | ((bound == w.objective) & (remaining < w.index)))
        open_[remaining[~could]] = False
    if not all(np.isfinite(w.objective) for w in winners):
        raise ValueError("no TeraPipe plan exists on these cost tables: every group size needs a finite "
                         "slice covering the whole sequence")
    return winners, caps, evaluated


def plan_batches(tables, batches, num_stages: int, granularity: int, batch_caps: int = 64) -> list[TeraPipePlan]:
    """TeraPipe's optimal plan of each of ``batches`` (request counts) on cost tables
    ``[B_pad, U + 1, U + 1]`` (``tables[b - 1]`` for groups of b requests, seconds; rows beyond a
    batch are not read by its plan), found by one search over caps: every plan equals the plan of
    its batch searched alone, and ``caps_evaluated`` counts the caps of the shared search."""
    tables = np.asarray(tables)
    if tables.ndim != 3 or tables.shape[1] != tables.shape[2] or tables.shape[1] < 2:
        raise ValueError(f"cost tables must have shape [group sizes, U + 1, U + 1] with U >= 1, got {tables.shape}")
    if np.isnan(tables).any():
        raise ValueError("cost tables hold NaN; every entry must be a time in seconds or inf (no such slice)")
    batches = np.array([integer("batch", b) for b in np.atleast_1d(batches)], np.int64)
    if batches.size == 0:
        raise ValueError("batches is empty; pass at least one request count")
    if batches.max() > tables.shape[0]:
        raise ValueError(f"batch {batches.max()} needs cost tables of group sizes 1..{batches.max()}, "
                         f"got {tables.shape[0]}")
    # two or more caps per round, so the first round includes the largest cap
    integer("batch_caps", batch_caps, 2)
    winners, caps, evaluated = _search_caps(tables, num_stages, batches, batch_caps)
    plans = []
    for batch, w in zip(batches, winners):
        groups, a = [], int(batch)
        while a > 0:
            groups.append(int(w.group_back[a - 1]))
            a -= groups[-1]
        groups = tuple(groups[::-1])
        slicings = tuple(slicing_from_back(w.slicing_back[b - 1], granularity) for b in groups)
        plans.append(TeraPipePlan(groups, slicings, float(w.objective), float(caps[w.index]), evaluated))
    return plans


def plan_tables(tables, batch: int, num_stages: int, granularity: int, batch_caps: int = 64) -> TeraPipePlan:
    """TeraPipe's optimal plan of ``batch`` requests on cost tables ``[B_pad, U + 1, U + 1]``
    (:func:`plan_batches` of one batch)."""
    return plan_batches(tables, [batch], num_stages, granularity, batch_caps)[0]


def latency_model(tables, groups, slicings, num_stages: int, granularity: int) -> float:
    """TeraPipe's latency model of a plan on cost tables (host-side; for checks and comparisons):
    the sum of every slice's time plus ``(N - 1)`` times the largest."""
    tables, times = np.asarray(tables), []
    for b, slicing in zip(groups, slicings):
        bounds = np.concatenate([[0], np.cumsum(slicing) // granularity])
        times.append(tables[b - 1, bounds[:-1], bounds[1:]])
    times = np.concatenate(times)
    return float(times.sum() + (num_stages - 1) * times.max())


def terapipe_items(plan: TeraPipePlan, k_pad: int) -> ItemTable:
    """Host-side items of a TeraPipe plan, padded to ``k_pad``: the groups one after the other, each
    group's slices in order, every item carrying its group's requests.

    Simulated for one batch, the plan's latency equals its ``objective`` only where the closed form
    ``sum(t) + (N - 1) max(t)`` holds: hand-offs cost nothing and each item takes the same time on
    every stage.  Otherwise the simulator's latency is the pipeline recurrence over per-stage times
    and hand-off delays, which the latency model does not see.
    """
    lengths = np.array([len(x) for x in plan.slicings])
    items = int(lengths.sum())
    if items > k_pad:
        raise ValueError(f"the plan has {items} items but k_pad is {k_pad}; pass k_pad >= {items} "
                         f"(e.g. {bucket(items)})")
    table = item_table(np.concatenate(plan.slicings).astype(np.int64), np.repeat(plan.groups, lengths),
                       np.repeat(np.arange(len(lengths)), lengths))
    return pad_items(table, k_pad)


class CostSetting(NamedTuple):
    """A validated configuration and its cost tables (host values)."""

    model: object
    hardware: object
    batch: int
    granularity: int
    stages: int
    n_pad: int
    dtype: np.dtype
    tables: np.ndarray


def cost_setting(model, hardware, seq_len, batch, granularity, stages, dtype, placement=None) -> CostSetting:
    """The planner's cost tables on ``placement`` (``[N]`` dies or ``[N, t]`` stage groups; default the
    snake layout of single-die stages)."""
    m, hw = get_model(model), get_hardware(hardware)
    S = integer("seq_len", seq_len, 1, LIMITS["seq_len"])
    B = integer("batch", batch, 1, LIMITS["batch"])
    g = integer("granularity", granularity, 1, LIMITS["seq_len"])
    U = check_granularity(S, None, g)
    dt = check_dtype(dtype)
    if placement is None:
        placement = snake_placement(hw, check_stages(m, hw, stages))
    n = len(placement)
    n_pad = bucket(n)
    tables = cost_tables(ModelParams.from_spec(m, dt), HardwareParams.from_spec(hw, dt),
                         stage_layout(hw, placement, n_pad, dt), U, g, B, n_pad)
    return CostSetting(m, hw, B, g, n, n_pad, dt, tables)


def plan_terapipe(model, hardware, seq_len: int, batch: int, *, granularity: int = 256, stages: int | None = None,
                  dtype="float32", batch_caps: int = 64) -> TeraPipePlan:
    """TeraPipe's optimal plan (batch split, slicings) of ``batch`` requests of ``seq_len`` tokens on
    ``stages`` pipeline stages (default: every die) of ``hardware``, slices in multiples of
    ``granularity`` tokens, on this package's cost model (bottleneck-stage time of each slice)."""
    s = cost_setting(model, hardware, seq_len, batch, granularity, stages, dtype)
    return plan_tables(s.tables, s.batch, s.stages, s.granularity, batch_caps)


def versus_one_group(model="llama3-70b", hardware="mocap-4x4", seq_len: int = 8192, batch: int = 8, *,
                     granularity: int = 256, stages: int | None = None, dtype="float32") -> dict:
    """TeraPipe's latency model of the one-group plan (:func:`mocap_jax.partition.dp.terapipe_dp` on the table
    of the whole batch) against the batch-splitting plan on the same tables, with both plans'
    simulated single-batch prefill latency (streaming admission, snake placement, stage release,
    hand-offs and per-stage times as the cost model has them; ``raw`` ignores memory, ``feasible``
    says whether the batch fits).

    Returns a dict of plain values (seconds, request counts, tokens).
    """
    s = cost_setting(model, hardware, seq_len, batch, granularity, stages, dtype)
    t0 = time.perf_counter()
    split = plan_tables(s.tables, s.batch, s.stages, s.granularity)
    wall = time.perf_counter() - t0
    one = terapipe_dp(s.tables[s.batch - 1], s.stages, s.granularity)
    one_plan = TeraPipePlan((s.batch,), (one.partition,), one.objective, one.cap, one.caps_evaluated)
    placement = snake_placement(s.hardware, s.stages)

    def describe(plan):
        k_pad = bucket(sum(len(x) for x in plan.slicings))
        point = build_point(s.model, s.hardware, terapipe_items(plan, k_pad), placement, s.n_pad, s.dtype)
        out = _evaluate_jit(point, SimShape(items=k_pad, stages=s.n_pad, groups=k_pad))
        out = {"raw_latency_s": out.raw_latency_s, "feasible": out.feasible}
        return {"groups": list(plan.groups), "slices": [len(x) for x in plan.slicings],
                "slicings": [x.tolist() for x in plan.slicings], "objective_s": plan.objective, "cap_s": plan.cap,
                "caps_evaluated": plan.caps_evaluated, "simulated_raw_latency_s": float(out["raw_latency_s"]),
                "feasible": bool(out["feasible"])}

    return {"model": s.model.name, "hardware": s.hardware.name, "seq_len": seq_len, "batch": s.batch,
            "granularity": s.granularity, "stages": s.stages, "dtype": str(s.dtype),
            "caps": int(np.unique(s.tables[np.isfinite(s.tables)]).size), "one_group": describe(one_plan),
            "split": describe(split), "one_group_vs_split": one.objective / split.objective, "plan_wall_s": wall}
