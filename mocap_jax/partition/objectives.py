"""What LBCP annealing minimises: EvaluatePrefill with each candidate's own largest batch, then EvaluateE2E.

States are chunk sizes in units of the granularity g (``[M]`` ints, each >= 1).  For a candidate
partition the objective first finds its own largest feasible batch B' (:func:`largest_batch`: a
vectorised bracket search over batches, exact when feasibility is monotone in the batch), so a
partition that admits a larger batch can win, then evaluates it at B':

* ``prefill``: prefill latency of a batch of B' requests divided by B' (seconds of pipeline time
  per request);
* ``throughput``: the saturation period divided by B' (seconds per request at saturation, the
  inverse of the saturation throughput);
* ``e2e``: mean end-to-end latency of the context's arrivals with batches of up to B' requests
  (:mod:`mocap_jax.serving.e2e`).

With a fixed batch (``batch_search=False``) B' is the context's batch and ``prefill`` is the
plain prefill latency.  An infeasible candidate (B' = 0) scores ``inf``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from ..costs import pytree
from ..prefill.batch import evaluate_many
from ..prefill.evaluate import Point
from ..prefill.points import batched_items
from ..schedule.items import chunked_items
from ..schedule.prefix import count_sorted, prefix_sum
from ..search.anneal import randint
from ..schedule.shape import MBKRMode, SimShape
from ..serving.e2e import ServingShape, e2e_latency

Array = Any
OBJECTIVES = ("prefill", "throughput", "e2e")


@pytree
class PartitionContext:
    """Traced numbers of a partition objective.

    Fields:
      point: the configuration (its items are rebuilt from each candidate).
      granularity: int scalar g, tokens per unit.
      batch: int scalar, the fixed batch, or where the B' search starts looking.
      arrivals: ``[R]`` arrival times (s) of the ``e2e`` objective (``[1]`` otherwise).
    """

    point: Point
    granularity: Array
    batch: Array
    arrivals: Array


def evaluate_partitions(partitions, batches, point: Point, shape: SimShape, fields) -> dict:
    """The evaluation ``fields`` of ``[P, M]`` partitions (tokens) at ``[P]`` batches (traceable)."""
    pts, axes = batched_items(point, chunked_items(partitions, batches))
    return evaluate_many(pts, shape, axes, fields)


def largest_batch(partitions, point: Point, shape: SimShape, hint, max_batch: int, window: int,
                  fields: tuple = ()):
    """B' of each of ``[C, M]`` partitions -- the largest batch in ``[1, max_batch]`` that fits (0 if
    none) -- and the evaluation ``fields`` at B' (``[C, ...]``; undefined where B' = 0).

    Each partition keeps a bracket (largest batch known to fit, smallest known not to).  Every pass
    evaluates ``2 C`` (partition, batch) pairs in one call; the first pass tries each partition's
    ``hint [C]`` and ``hint + 1``, which closes the bracket where B' did not change (an annealing
    move rarely changes it).  Later passes serve only the partitions whose bracket is still open,
    each with ``w = 2 C / open`` batches (at most ``window``): while one end is unknown, the next
    ``w - 2`` out from the known end, then two doubling distances beyond them (``+1, ..., +(w - 2),
    +2(w - 2), +4(w - 2)``), else spread evenly over the bracket.  The slots are handed out by rank
    among the open partitions, so every pass is one call of the same shape, and the fewer remain
    the more batches each gets.  A pass costs a plain evaluation of every slot plus the spill
    passes of the batches that do not fit without MBKR, run in compaction steps
    (:func:`~mocap_jax.prefill.batch.evaluate_many`), so a few batches per open partition over more
    passes cost less than a full pass of spilling batches (:attr:`PartitionProblem.window`).
    Exact when feasibility is monotone in the batch, whatever the window.  The evaluator appears
    once in the traced program (inside the loop), and the fields at B' are kept from the pass that
    found it, so no final evaluation is needed.
    """
    C, M = partitions.shape
    names = ("feasible",) + tuple(f for f in fields if f != "feasible")
    window = max(window, 2)                       # the first pass reads two batches per partition
    slots = max(2 * C, window)
    offsets = jnp.arange(window)
    slot = jnp.arange(slots)
    h = jnp.clip(jnp.asarray(hint, jnp.int32), 1, max_batch)

    def evaluate_at(chain, cand):
        return evaluate_partitions(partitions[chain], cand, point, shape, names)

    def pass_(state):
        lo, hi, first, best = state
        open_ = first | (hi - lo > 1)
        count = prefix_sum(open_.astype(jnp.int32))                    # [C] open chains up to each
        width = jnp.where(first, 2, jnp.clip(slots // jnp.maximum(count[-1], 1), 1, window))
        # slot s serves the open chain of rank s // width, its (s % width)-th batch
        rank, j = slot // width, slot % width
        chain = jnp.minimum(count_sorted(count, rank + 1, side="left"), C - 1)
        used = rank < count[-1]
        l, u = lo[chain], hi[chain]
        gap = u - l - 1
        step = jnp.maximum(gap // (width + 1), 1)
        spread = jnp.where(gap <= width, l + 1 + j, l + step * (j + 1))
        # one end unknown: the next width - 2 batches (B' mostly moves a little), then two doubling
        # distances beyond them (for the chains whose B' jumped)
        near = jnp.maximum(width - 2, 1)
        reach = jnp.where(j < near, j + 1, near << jnp.maximum(j - near + 1, 0))
        outward = jnp.where(u > max_batch, l + reach, u - reach)
        cand = jnp.where(first, h[chain] + j,
                         jnp.where((u > max_batch) | (l == 0), outward, spread))
        cand = jnp.clip(cand, jnp.maximum(l + 1, 1), jnp.minimum(u - 1, max_batch))
        cand = jnp.where(used, cand, 1).astype(jnp.int32)           # idle slots: any valid batch
        out = evaluate_at(chain, cand)
        # back to chains: open chain c's batches sit at slots rank_c * width + k, k < width (every
        # open chain has its slots: there are at most C open chains and width <= 2C / open)
        at = jnp.clip((count - 1)[:, None] * width + offsets[None, :], 0, slots - 1)     # [C, window]
        mine = open_[:, None] & (offsets[None, :] < width)
        tried = cand[at]
        ok = mine & out["feasible"][at]
        top = jnp.max(jnp.where(ok, tried, 0), axis=1)
        found = top > lo
        pick = jnp.take_along_axis(at, jnp.argmax(jnp.where(ok, tried, 0), axis=1)[:, None], axis=1)[:, 0]
        best = {k: jnp.where(found.reshape((C,) + (1,) * (best[k].ndim - 1)), out[k][pick], best[k]) for k in best}
        lo = jnp.maximum(lo, top)
        hi = jnp.minimum(hi, jnp.min(jnp.where(mine & ~ok, tried, max_batch + 1), axis=1))
        return lo, hi, jnp.zeros((), bool), best

    shapes = jax.eval_shape(evaluate_at, jnp.zeros((slots,), jnp.int32), jnp.ones((slots,), jnp.int32))
    best = {k: jnp.zeros((C,) + v.shape[1:], v.dtype) for k, v in shapes.items() if k in fields}
    state = (jnp.zeros((C,), jnp.int32), jnp.full((C,), max_batch + 1, jnp.int32), jnp.ones((), bool), best)
    lo, _, _, best = jax.lax.while_loop(lambda st: st[2] | jnp.any(st[1] - st[0] > 1), pass_, state)
    return lo, best


def propose_partition(words, x, max_shift: int):
    """One-boundary move: boundary b (uniform) shifts by 1..``max_shift`` units either way; valid if
    both chunks keep at least one unit."""
    M = x.shape[0]
    if M == 1:
        return x, jnp.zeros((), bool)
    b = randint(words[0], 0, M - 1)
    shift = randint(words[1], 1, max_shift + 1)
    shift = jnp.where(words[2] >> 31 == 1, shift, -shift)
    left, right = x[b] + shift, x[b + 1] - shift
    valid = (left >= 1) & (right >= 1)
    return jnp.where(valid, x.at[b].set(left).at[b + 1].set(right), x), valid


@dataclass(frozen=True)
class PartitionProblem:
    """LBCP annealing problem (hashable: static structure only).

    Attributes:
      shape: the prefill bucket (``items`` = M, the candidates' chunk count).
      objective: ``prefill``, ``throughput`` or ``e2e``.
      batch_search: score each candidate at its own B' (else at the context's batch).
      max_batch: upper end of the B' search.
      max_shift: largest boundary shift of a move, in units.
      window: most batches evaluated per open partition in a pass of the B' search after the first.
        On the annealing benchmark (1,024 chains of 16 chunks, 200 steps) about 140 chains are still
        open after a step's first pass; a window of 32 gave them about 2,600 batches in 2.9 passes
        per step, 5 about 1,200 in 4.1 passes: 4,740-4,990 against 6,180-6,360 chain-steps/s
        (alternated runs on a 2-core CPU; 4 and 6 gave 5,270-5,980, 2 gave 3,500).
      requests: arrivals of the ``e2e`` objective.
    """

    shape: SimShape
    objective: str = "prefill"
    batch_search: bool = True
    max_batch: int = 256
    max_shift: int = 4
    window: int = 5
    requests: int = 0

    def propose(self, words, x, ctx: PartitionContext):
        return propose_partition(words, x, self.max_shift)

    def initial_aux(self, ctx: PartitionContext, chains: int):
        """Every chain's first B' search starts at the context's batch."""
        return jnp.full((chains,), ctx.batch, jnp.int32)

    def batches(self, xs, ctx: PartitionContext, hint=None, shape: SimShape | None = None, fields: tuple = ()):
        """B' of each candidate (or the fixed batch), the search starting at ``hint [C]``, with the
        evaluation ``fields`` at B'."""
        parts = xs * ctx.granularity
        shape = shape or self.shape
        if not self.batch_search:
            B = jnp.full((xs.shape[0],), ctx.batch, jnp.int32)
            return B, evaluate_partitions(parts, B, ctx.point, shape, fields) if fields else {}
        hint = self.initial_aux(ctx, xs.shape[0]) if hint is None else hint
        return largest_batch(parts, ctx.point, shape, hint, self.max_batch, self.window, fields)

    def evaluate(self, xs, ctx: PartitionContext, aux):
        """``(objectives [C], B' [C])`` of candidates ``xs [C, M]`` (units), B' searched from ``aux``."""
        parts = xs * ctx.granularity
        B, out = self.batches(xs, ctx, aux, fields=("prefill_latency_s", "period_s", "feasible", "extra"))
        ok_batch = B > 0
        Bs = jnp.maximum(B, 1)
        feasible = out["feasible"] & ok_batch
        per = Bs.astype(out["period_s"].dtype) if self.batch_search else 1.0
        if self.objective == "prefill":
            return jnp.where(feasible, out["prefill_latency_s"] / per, jnp.inf), B
        if self.objective == "throughput":
            return jnp.where(feasible, out["period_s"] / Bs.astype(out["period_s"].dtype), jnp.inf), B
        plain = self.batches(xs, ctx, B, self.shape._replace(mbkr=MBKRMode.OFF))[0] \
            if self.shape.mbkr != MBKRMode.OFF and self.batch_search else Bs
        serving = ServingShape(prefill=self.shape._replace(batches=1), requests=self.requests)
        K, N = self.shape.items, self.shape.stages

        def one(part, b, b_plain, extra):
            return e2e_latency(ctx.point, part, 0, 1, b, ctx.arrivals, extra[:K], b_plain, serving)["mean_s"]

        mean = jax.vmap(one)(parts, Bs, plain, out["extra"].reshape(xs.shape[0], -1, N))
        return jnp.where(feasible, mean, jnp.inf), B
