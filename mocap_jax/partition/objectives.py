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
from ..schedule.items import chunked_items
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


def _with_items(point: Point, items) -> tuple[Point, Point]:
    none = lambda tree: jax.tree_util.tree_map(lambda _: None, tree)
    pts = Point(items=items, model=point.model, hardware=point.hardware, layout=point.layout, mbkr=point.mbkr)
    axes = Point(items=jax.tree_util.tree_map(lambda _: 0, items), model=none(point.model),
                 hardware=none(point.hardware), layout=none(point.layout), mbkr=none(point.mbkr))
    return pts, axes


def evaluate_partitions(partitions, batches, point: Point, shape: SimShape, fields) -> dict:
    """The evaluation ``fields`` of ``[P, M]`` partitions (tokens) at ``[P]`` batches (traceable)."""
    pts, axes = _with_items(point, chunked_items(partitions, batches))
    return evaluate_many(pts, shape, axes, fields)


def largest_batch(partitions, point: Point, shape: SimShape, hint, max_batch: int, window: int):
    """B' of each of ``[C, M]`` partitions: the largest batch in ``[1, max_batch]`` that fits (0 if none).

    The first round evaluates each partition at its ``hint [C]`` and ``hint + 1`` (an annealing
    move rarely changes B', and then this one round settles it); while some partition's bracket
    (largest known fit, smallest known misfit) is still open, each round evaluates ``window``
    batches spread evenly over it.  Exact when feasibility is monotone in the batch.
    """
    C, M = partitions.shape

    def fits(cand):
        w = cand.shape[1]
        ok = evaluate_partitions(jnp.repeat(partitions, w, axis=0), cand.reshape(-1), point, shape,
                                 ("feasible",))["feasible"]
        return ok.reshape(C, w)

    def narrow(lo, hi, cand):
        ok = fits(cand)
        lo = jnp.maximum(lo, jnp.max(jnp.where(ok, cand, 0), axis=1))
        hi = jnp.minimum(hi, jnp.min(jnp.where(ok, max_batch + 1, cand), axis=1))
        return lo, hi

    lo = jnp.zeros((C,), jnp.int32)
    hi = jnp.full((C,), max_batch + 1, jnp.int32)
    h = jnp.clip(jnp.asarray(hint, jnp.int32), 1, max_batch)
    lo, hi = narrow(lo, hi, jnp.stack([h, jnp.minimum(h + 1, max_batch)], axis=1))
    offsets = jnp.arange(window)

    def round_(state):
        lo, hi = state
        gap = hi - lo - 1
        step = jnp.maximum(gap // (window + 1), 1)
        cand = jnp.where(gap[:, None] <= window, lo[:, None] + 1 + offsets[None, :],
                         lo[:, None] + step[:, None] * (offsets[None, :] + 1))
        cand = jnp.clip(jnp.minimum(cand, hi[:, None] - 1), 1, max_batch)
        return narrow(lo, hi, cand.astype(jnp.int32))

    lo, _ = jax.lax.while_loop(lambda state: jnp.any(state[1] - state[0] > 1), round_, (lo, hi))
    return lo


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
      window: batches evaluated per partition per round of the B' search.
      requests: arrivals of the ``e2e`` objective.
    """

    shape: SimShape
    objective: str = "prefill"
    batch_search: bool = True
    max_batch: int = 256
    max_shift: int = 4
    window: int = 8
    requests: int = 0

    def propose(self, words, x, ctx: PartitionContext):
        return propose_partition(words, x, self.max_shift)

    def initial_aux(self, ctx: PartitionContext, chains: int):
        """Every chain's first B' search starts at the context's batch."""
        return jnp.full((chains,), ctx.batch, jnp.int32)

    def batches(self, xs, ctx: PartitionContext, hint=None, shape: SimShape | None = None):
        """B' of each candidate (or the fixed batch), the search starting at ``hint [C]``."""
        parts = xs * ctx.granularity
        if not self.batch_search:
            return jnp.full((xs.shape[0],), ctx.batch, jnp.int32)
        hint = self.initial_aux(ctx, xs.shape[0]) if hint is None else hint
        return largest_batch(parts, ctx.point, shape or self.shape, hint, self.max_batch, self.window)

    def evaluate(self, xs, ctx: PartitionContext, aux):
        """``(objectives [C], B' [C])`` of candidates ``xs [C, M]`` (units), B' searched from ``aux``."""
        parts = xs * ctx.granularity
        B = self.batches(xs, ctx, aux)
        ok_batch = B > 0
        Bs = jnp.maximum(B, 1)
        out = evaluate_partitions(parts, Bs, ctx.point, self.shape,
                                  ("prefill_latency_s", "period_s", "feasible", "extra"))
        feasible = out["feasible"] & ok_batch
        per = Bs.astype(out["period_s"].dtype) if self.batch_search else 1.0
        if self.objective == "prefill":
            return jnp.where(feasible, out["prefill_latency_s"] / per, jnp.inf), B
        if self.objective == "throughput":
            return jnp.where(feasible, out["period_s"] / Bs.astype(out["period_s"].dtype), jnp.inf), B
        plain = self.batches(xs, ctx, B, self.shape._replace(mbkr=MBKRMode.OFF)) \
            if self.shape.mbkr != MBKRMode.OFF and self.batch_search else Bs
        serving = ServingShape(prefill=self.shape._replace(batches=1), requests=self.requests)
        K, N = self.shape.items, self.shape.stages

        def one(part, b, b_plain, extra):
            return e2e_latency(ctx.point, part, 0, 1, b, ctx.arrivals, extra[:K], b_plain, serving)["mean_s"]

        mean = jax.vmap(one)(parts, Bs, plain, out["extra"].reshape(xs.shape[0], -1, N))
        return jnp.where(feasible, mean, jnp.inf), B
