"""EvaluatePrefill and EvaluateE2E (DESIGN §7, §8) and the annealing objectives built on them.

* :func:`evaluate_prefill` -- one configuration's prefill timeline with MBKR (if on):
  latency, feasibility, saturation throughput, bubbles, MBKR extra times.
* :func:`evaluate_e2e` -- end-to-end latency at a load under the §8 serving model,
  using the prefill evaluation's MBKR costs.
* :class:`PrefillObjective` / :class:`E2EObjective` -- hashable objectives of a
  partition (in units of g) for :func:`mocap_jax.lbcp.anneal`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from . import chunked_prefill
from .costs import pytree
from .schedule import Point, SimShape, chunked_items, evaluate
from .serving import ServingShape, e2e_latency

Array = Any


@pytree
class PartitionContext:
    """Traced context of a partition objective.

    Fields:
      point: the configuration (its items are rebuilt from the partition).
      granularity: scalar int g (tokens per unit).
      batch: scalar int B (requests per batch).
      arrivals: ``[R]`` arrival times for E2E objectives (any shape otherwise).
    """

    point: Point
    granularity: Array
    batch: Array
    arrivals: Array


def evaluate_prefill(units, ctx: PartitionContext, shape: SimShape) -> dict:
    """EvaluatePrefill of a chunked partition given in units of g (``[M]``, M == shape.k_pad)."""
    partition = units * ctx.granularity
    items = chunked_items(partition, ctx.batch)
    return evaluate(dataclasses.replace(ctx.point, items=items), shape)


def evaluate_e2e(units, ctx: PartitionContext, shape: SimShape, serving: ServingShape) -> dict:
    """EvaluateE2E: E2E latency at the context's arrivals, with the prefill evaluation's MBKR costs."""
    pre = evaluate_prefill(units, ctx, shape)
    extra = pre["mbkr_extra_times"][0] if "mbkr_extra_times" in pre else jnp.zeros_like(pre["stage_times"])
    e2e = e2e_latency(ctx.point, units * ctx.granularity, jnp.sum(units * ctx.granularity), ctx.batch,
                      ctx.arrivals, extra, serving)
    return {**pre, "e2e": e2e}


@dataclass(frozen=True)
class PrefillObjective:
    """Prefill latency (``kind="prefill"``) or saturation period = B / throughput (``kind="throughput"``).

    ``stages`` (set by :meth:`specialise` from a host-side context) enables the batched
    kernel :func:`mocap_jax.chunked_prefill.prefill_blocks` in :meth:`many` for buckets it
    covers (one batch, MBKR off or static pairs); results equal ``vmap(self)``.
    """

    shape: SimShape
    kind: str = "prefill"
    stages: chunked_prefill.StageStructure | None = None

    def __call__(self, units, ctx: PartitionContext):
        out = evaluate_prefill(units, ctx, self.shape)
        if self.kind == "throughput":
            return jnp.where(out["feasible"], out["period_s"], jnp.inf)
        return out["prefill_latency_s"]

    def specialise(self, ctx: PartitionContext) -> "PrefillObjective":
        """This objective with the static stage structure of ``ctx`` (host-side NumPy numbers)."""
        if not chunked_prefill.supports(self.shape):
            return self
        return dataclasses.replace(self, stages=chunked_prefill.stage_structure(ctx.point, self.shape))

    def many(self, units, ctx: PartitionContext):
        """The objective of ``units[C, M]`` partitions, ``[C]`` seconds."""
        if self.stages is None or not chunked_prefill.supports(self.shape):
            return jax.vmap(self, in_axes=(0, None))(units, ctx)
        # blocks keep a CPU's working set in cache; an accelerator takes every partition at once
        blocked = jax.default_backend() == "cpu" and units.shape[0] % chunked_prefill.BLOCK == 0
        block = chunked_prefill.BLOCK if blocked else units.shape[0]
        out = chunked_prefill.prefill_blocks(units * ctx.granularity, ctx.batch, ctx.point, self.shape,
                                             self.stages, block)
        if self.kind == "throughput":
            return jnp.where(out["feasible"], out["period_s"], jnp.inf)
        return out["prefill_latency_s"]


@dataclass(frozen=True)
class E2EObjective:
    """Mean end-to-end latency at the context's arrivals (``inf`` if the batch does not fit)."""

    shape: SimShape
    serving: ServingShape

    def __call__(self, units, ctx: PartitionContext):
        out = evaluate_e2e(units, ctx, self.shape, self.serving)
        return jnp.where(out["feasible"], out["e2e"]["mean_s"], jnp.inf)
