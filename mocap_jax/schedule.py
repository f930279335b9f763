"""Work items, timing and KV occupancy of one configuration (DESIGN §5, §6; docs/semantics.md).

The single-configuration kernel :func:`evaluate` is written plainly for one point;
:func:`evaluate_items_batched` is ``jit(vmap(evaluate))`` with the static bucket shape as
the only static argument, so every point inside a bucket (any partition, sequence
length, batch, chunk count <= K_pad, stage count <= N_pad, model, hardware numbers,
admission mode and release policy) reuses one compiled program.

Shapes: ``K`` = items per batch padded to ``k_pad``; ``N`` = stages padded to
``n_pad``; ``nb`` = ``num_batches`` consecutive identical batches.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from . import costs
from .costs import HardwareParams, ModelParams, StageLayout, pytree
from .mbkr import MBKRParams, dynamic_spills, pair_spills, partner_of, spill_costs
from .pipeline import finish_times, pipeline_latency

Array = Any


class SimShape(NamedTuple):
    """Static structure of a bucket (hashable; one compiled program per value).

    Attributes:
      k_pad: items per batch, padded (chunks for chunked schemes, microbatches for gpipe).
      n_pad: pipeline stages, padded.
      num_batches: consecutive identical batches simulated.
      timeline: also return per-stage KV occupancy at event times (every event
        time, or every ``stride``-th so that at most ``timeline_points`` remain).
      mbkr: ``"off"``, ``"static"`` (cross-half or head-to-tail pairs, code in
        ``Point.mbkr.pairing``), ``"unpaired"`` (MBKR with no partners) or ``"dynamic"``
        (re-matching), see :mod:`mocap_jax.mbkr`.
      mbkr_iterations: spill-decision / timing passes (docs/semantics.md).
    """

    k_pad: int
    n_pad: int
    num_batches: int = 2
    timeline: bool = False
    timeline_points: int = 1024
    mbkr: str = "off"
    mbkr_iterations: int = 3


def bucket(n: int, minimum: int = 4) -> int:
    """Smallest power of two >= n (and >= minimum): the padding bucket for n."""
    b = minimum
    while b < n:
        b *= 2
    return b


@pytree
class ItemTable:
    """The items of one batch, padded to ``k_pad``.

    Fields (all ``[K_pad]``):
      tokens: int, prompt tokens per request in the item (chunk size c; S for gpipe).
      prefix: int, tokens of the same requests processed before the item (p).
      requests: int, requests carried by the item (B for chunks, microbatch size for gpipe).
      last: bool, the item ends its requests (the LM head runs on the last stage).
      valid: bool, a real item (False = padding).
      group_last: int, index of the last item carrying the same requests.
    """

    tokens: Array
    prefix: Array
    requests: Array
    last: Array
    valid: Array
    group_last: Array


def chunked_items(partition, batch) -> ItemTable:
    """Items of a chunked (TeraPipe-style) batch.

    Args:
      partition: ``[K_pad]`` int chunk sizes, zeros after the last real chunk.
      batch: scalar int, requests in the batch (all chunks carry all of them).
    """
    partition = jnp.asarray(partition)
    valid = partition > 0
    k = jnp.arange(partition.shape[0])
    n_chunks = jnp.sum(valid)
    prefix = jnp.cumsum(partition) - partition
    last = k == n_chunks - 1
    requests = jnp.where(valid, batch, 0)
    return ItemTable(tokens=partition, prefix=prefix, requests=requests, last=last, valid=valid,
                     group_last=jnp.full_like(k, n_chunks - 1))


def gpipe_items(seq_len, batch, microbatch, k_pad: int) -> ItemTable:
    """Items of a GPipe batch: microbatches of whole requests.

    Args:
      seq_len: scalar int S (every request's prompt length).
      batch: scalar int B.
      microbatch: scalar int requests per microbatch.
      k_pad: static number of item slots (>= ceil(B / microbatch)).
    """
    k = jnp.arange(k_pad)
    requests = jnp.clip(batch - k * microbatch, 0, microbatch)
    valid = requests > 0
    return ItemTable(tokens=jnp.where(valid, seq_len, 0), prefix=jnp.zeros_like(k), requests=requests,
                     last=valid, valid=valid, group_last=k)


@pytree
class Point:
    """Everything numeric about one configuration (a pytree of traced leaves).

    Fields:
      items: :class:`ItemTable` of one batch.
      model: :class:`ModelParams`.
      hardware: :class:`HardwareParams`.
      layout: :class:`StageLayout` (number of stages and hand-off routes).
      synchronous: bool scalar, synchronous admission (else streaming).
      release_request: bool scalar, KV released when the request leaves the last
        stage (else when the stage finishes the request's last chunk).
      mbkr: :class:`~mocap_jax.mbkr.MBKRParams` (ignored when ``SimShape.mbkr == "off"``).
    """

    items: ItemTable
    model: ModelParams
    hardware: HardwareParams
    layout: StageLayout
    synchronous: Array
    release_request: Array
    mbkr: MBKRParams


def item_costs(point: Point, n_pad: int):
    """Per-item, per-stage times ``t[K, N]`` and hand-off delays ``d[K, N]``, seconds."""
    it = point.items
    dt = point.model.hidden.dtype
    c = it.tokens.astype(dt)
    p = it.prefix.astype(dt)
    b = it.requests.astype(dt)
    t = costs.stage_times(point.model, point.hardware, point.layout, c, p, b, it.last, n_pad)
    d = costs.handoff_time(point.model, point.hardware, point.layout, c, b, n_pad)
    valid = it.valid[:, None]
    return jnp.where(valid, t, 0.0), jnp.where(valid, d, 0.0)


def batch_finish_times(t, d, synchronous, num_batches: int):
    """Finish times of ``num_batches`` batches run back to back, ``[nb, K, N]``.

    ``t`` is ``[K, N]`` (identical batches) or ``[nb, K, N]`` (per-batch times, e.g.
    with MBKR costs).  Streaming: the next batch's items queue behind the previous
    ones (ready = 0).  Synchronous: a batch is ready when the previous one has left
    the last stage.
    """
    dtype = t.dtype
    tb = jnp.broadcast_to(t, (num_batches,) + t.shape[-2:])

    def one(carry, t_j):
        stage_free, exit_time = carry
        ready = jnp.where(synchronous, exit_time, jnp.zeros((), dtype))
        f = finish_times(t_j, d, jnp.full(t_j.shape[:1], ready, dtype), stage_free)
        return (f[-1], f[-1, -1]), f

    init = (jnp.zeros(t.shape[-1:], dtype), jnp.zeros((), dtype))
    _, f = jax.lax.scan(one, init, tb)
    return f


def kv_occupancy(finish, kv, release, at):
    """Held KV per stage after each time in ``at`` (direct formula, ``O(T x E x N)``).

    Args:
      finish: ``[E, N]`` time each item adds its KV on each stage.
      kv: ``[E, N]`` bytes added.
      release: ``[E, N]`` time those bytes are freed.
      at: ``[T, N]`` query times (per stage).

    Returns:
      ``[T, N]`` bytes held just after each query time (releases at that time applied).
    """
    held = (finish[None, :, :] <= at[:, None, :]) & (at[:, None, :] < release[None, :, :])
    return jnp.sum(jnp.where(held, kv[None, :, :], 0.0), axis=1)


def kv_peak(finish, kv, release):
    """Peak held KV per stage, ``[N]``.

    Precondition (true of every schedule built here: each stage runs its items in
    order and request groups are released in order): ``finish`` and ``release`` are
    nondecreasing along ``E`` on every stage, and ``release >= finish``.

    Then the KV held just after addition ``e`` is ``cumsum(kv)[e]`` minus the KV of
    the leading items already released by ``finish[e]`` (a prefix, because releases
    are in order), and the peak is the largest of these; at tied addition times the
    last of the tie carries the exact value and the others a smaller one, so the
    maximum is exact.  ``O(E^2 N)`` integer comparisons for the release counts (fast
    under ``vmap``) up to 1024 items, a binary search per stage beyond.
    """
    added = jnp.cumsum(kv, axis=0)                                                   # [E, N]
    if finish.shape[0] <= 1024:
        released_count = jnp.sum(release[None, :, :] <= finish[:, None, :], axis=1, dtype=jnp.int32)   # [E, N]
    else:
        released_count = jax.vmap(lambda r, f: jnp.searchsorted(r, f, side="right"), in_axes=1, out_axes=1)(
            release, finish).astype(jnp.int32)
    released = sum_of_first(added, released_count)
    return jnp.maximum(jnp.max(added - released, axis=0), 0.0)


def sum_of_first(prefix, count):
    """Sum of the first ``count`` entries along axis 0, given the inclusive prefix sums ``prefix``.

    ``count`` is an int array (any leading size, the trailing axes of ``prefix``); a count of
    0 gives 0.
    """
    return jnp.take_along_axis(jnp.concatenate([jnp.zeros_like(prefix[:1]), prefix], axis=0), count, axis=0)


def evaluate(point: Point, shape: SimShape) -> dict:
    """Simulate one configuration.  Returns a dict of arrays (units in the key names).

    Keys: ``finish_times`` [nb, K, N] s; ``stage_times`` [K, N] s; ``handoff_times``
    [K, N] s; ``prefill_latency_s`` (inf if infeasible); ``raw_latency_s`` (ignoring
    memory); ``feasible``; ``throughput_rps`` (saturation); ``period_s``;
    ``bubble_fraction``; ``stage_utilisation`` [N]; ``kv_peak_bytes_per_stage`` [N];
    ``workspace_bytes_per_stage`` [N]; ``weight_bytes_per_stage`` [N];
    ``peak_mem_bytes_per_stage`` [N]; ``capacity_bytes``; optionally
    ``timeline_times`` [T] and ``timeline_kv_bytes`` [T, N].
    """
    k_pad, n_pad, nb = shape.k_pad, shape.n_pad, shape.num_batches
    model, hw, layout, it = point.model, point.hardware, point.layout, point.items
    dt = model.hidden.dtype
    n = layout.num_stages
    stage_live = jnp.arange(n_pad) < n

    t, d = item_costs(point, n_pad)
    f = batch_finish_times(t, d, point.synchronous, nb)            # [nb, K, N]
    latency = f[0, -1, -1]

    # saturation throughput and utilisation
    stage_work = jnp.sum(t, axis=0)                                 # [N] busy seconds per batch
    period = jnp.where(point.synchronous, latency, jnp.max(stage_work))
    requests = jnp.sum(jnp.where(it.last, it.requests, 0)).astype(dt)   # each request counted once (its last item)
    throughput = requests / period
    bubble = 1.0 - jnp.sum(stage_work) / (n.astype(dt) * latency)
    utilisation = jnp.where(stage_live, stage_work / period, 0.0)

    # KV memory (§6): add at finish, free at the group's release
    kv_tok = costs.stage_kv_bytes_per_token(model, hw, n, n_pad, tensor_parallel=layout.tensor_parallel)   # [N]
    tokens = (it.requests * it.tokens).astype(dt)                   # [K] request-tokens per item
    kv = jnp.where(it.valid[:, None], tokens[:, None] * kv_tok[None, :], 0.0)   # [K, N]
    kve = jnp.broadcast_to(kv, (nb,) + kv.shape).reshape(nb * k_pad, n_pad)

    def events(f):
        grp = f[:, it.group_last, :]                               # [nb, K, N]
        release = jnp.where(point.release_request, grp[:, :, -1:], grp)
        fe = f.reshape(nb * k_pad, n_pad)
        re = jnp.broadcast_to(release, f.shape).reshape(nb * k_pad, n_pad)
        return fe, re

    def group_events(f):
        """MBKR (chunked schemes): one request group per batch, freed at its last chunk's release."""
        last = f[:, it.group_last[0], :]                           # [nb, N]
        return jnp.where(point.release_request, last[:, -1:], last)

    workspace = jnp.max(jnp.where(it.valid[:, None],
                                  costs.item_workspace_bytes(model, hw, kv_tok, it.tokens.astype(dt),
                                                             it.requests.astype(dt)), 0.0), axis=0)
    workspace = jnp.where(stage_live, workspace, 0.0)
    weights = costs.stage_weight_bytes(model, hw, n, n_pad, tensor_parallel=layout.tensor_parallel)
    capacity = hw.usable_hbm
    extra_out = {}
    fe, re = events(f)
    if shape.mbkr == "off":
        peak_kv = kv_peak(fe, kve, re)
        overflow = jnp.zeros((), bool)
    else:
        mb = point.mbkr
        budget = jnp.where(stage_live, capacity - weights - workspace, 1.0)
        attention = costs.stage_attention_times(model, hw, layout, it.tokens.astype(dt), it.prefix.astype(dt),
                                                it.requests.astype(dt), n_pad)
        kidx = jnp.arange(k_pad)
        # padded item slots read nothing and add no KV event (no re-matching, no migration)
        same_before = (it.group_last[:, None] == it.group_last[None, :]) & (kidx[None, :] < kidx[:, None]) \
            & it.valid[None, :] & it.valid[:, None]
        real = jnp.tile(it.valid, nb)[:, None]                              # [nb*K, 1]
        partner = jnp.where(stage_live, partner_of(mb.pairing, n, n_pad), -1)
        item_group = jnp.repeat(jnp.arange(nb), k_pad)
        transfer = jnp.zeros_like(f)       # spill write + migration of the previous pass
        extra = jnp.zeros_like(f)
        for _ in range(shape.mbkr_iterations):
            # KV events happen when an item's computation ends: before its spill write / migration
            kv_time = f - transfer
            gr = group_events(kv_time)
            fe = jnp.where(real, events(kv_time)[0], jnp.inf)
            if shape.mbkr == "dynamic":
                spills = dynamic_spills(fe, gr, kve, item_group, budget, mb.p1, mb.p2, n)
            else:
                slots = n_pad if shape.mbkr == "unpaired" else (n_pad + 1) // 2
                spills = pair_spills(fe, gr, kve, item_group, budget, partner, mb.p1, mb.p2, n, slots)
            mc = spill_costs(spills, attention, same_before, mb, hw.link_latency_s, hw.eff_link,
                             hw.hbm_bandwidth, hw.eff_hbm, nb, finish=f, start=f - (t[None] + extra))
            f = batch_finish_times(t[None] + mc["extra"], d, point.synchronous, nb)
            extra, transfer = mc["extra"], mc["write"] + mc["migrate"]
            fe, re = events(f)
        peak_kv = spills["peak"]
        overflow = spills["overflow"]
        latency = f[0, -1, -1]
        t_eff = (t[None] + mc["extra"])[0]
        stage_work = jnp.sum(t_eff, axis=0)
        period = jnp.where(point.synchronous, latency, jnp.max(stage_work))
        throughput = requests / period
        bubble = 1.0 - jnp.sum(stage_work) / (n.astype(dt) * latency)
        utilisation = jnp.where(stage_live, stage_work / period, 0.0)
        extra_out = dict(
            spilled_bytes=jnp.sum(spills["moved"]), spilled_bytes_per_stage=jnp.sum(spills["moved"], axis=0),
            remote_read_s=jnp.sum(mc["read"]), remote_read_unhidden_s=jnp.sum(mc["read_extra"]),
            spill_write_s=jnp.sum(mc["write"]), blocking_s=jnp.sum(mc["block"]),
            blocking_s_per_stage=jnp.sum(mc["block"], axis=(0, 1)), migrate_s=jnp.sum(mc["migrate"]),
            mbkr_extra_times=mc["extra"], mbkr_block_times=mc["block"], mbkr_event_time=spills["event_time"],
            mbkr_event_local=spills["event_local"], kv_budget_bytes_per_stage=budget,
        )
        if shape.mbkr != "dynamic":
            extra_out["mbkr_event_local_partner"] = spills["event_local_partner"]
            extra_out["mbkr_slot_active"] = spills["slot_active"]
        extra_out["partner"] = partner
    peak_mem = weights + workspace + peak_kv
    feasible = jnp.all((peak_mem <= capacity) | ~stage_live) & ~overflow

    out = dict(
        finish_times=f, stage_times=t, handoff_times=d, raw_latency_s=latency,
        prefill_latency_s=jnp.where(feasible, latency, jnp.inf), feasible=feasible,
        throughput_rps=jnp.where(feasible, throughput, 0.0), period_s=period, bubble_fraction=bubble,
        stage_utilisation=utilisation, kv_peak_bytes_per_stage=peak_kv, workspace_bytes_per_stage=workspace,
        weight_bytes_per_stage=weights, peak_mem_bytes_per_stage=peak_mem, capacity_bytes=capacity,
        **extra_out,
    )
    if shape.timeline and shape.mbkr == "off":
        times = jnp.sort(fe.reshape(-1))                            # [E * N] every event time
        stride = -(-times.shape[0] // shape.timeline_points)
        times = times[stride - 1::stride] if stride > 1 else times
        at = jnp.broadcast_to(times[:, None], (times.shape[0], n_pad))
        out["timeline_times"] = times
        out["timeline_kv_bytes"] = jnp.where(stage_live, kv_occupancy(fe, kve, re, at), 0.0)
    return out


def _evaluate_items(items: ItemTable, base: Point, shape: SimShape) -> dict:
    return jax.vmap(lambda it: evaluate(dataclasses.replace(base, items=it), shape))(items)


evaluate_items_batched = jax.jit(_evaluate_items, static_argnames=("shape",))
"""``jit(vmap(evaluate))`` over item tables only (leading axis P on every leaf of
``items``); every other number comes unbatched from ``base``, so XLA computes the
per-configuration constants once instead of P times."""

evaluate_one = jax.jit(evaluate, static_argnames=("shape",))
"""``jit(evaluate)`` for a single point."""


def partition_costs(partition, batch, model: ModelParams, hw: HardwareParams, layout: StageLayout, n_pad: int):
    """Stage times and hand-offs of chunked partitions, ``t, d: [..., M, N_pad]`` seconds.

    Args:
      partition: ``[..., M]`` int chunk sizes (zeros = padding after the last chunk).
      batch: requests per batch (scalar or ``[...]``).
    """
    partition = jnp.asarray(partition)
    dt = model.hidden.dtype
    c = partition.astype(dt)
    valid = partition > 0
    p = jnp.cumsum(c, axis=-1) - c
    b = jnp.broadcast_to(jnp.asarray(batch, dt)[..., None], c.shape)
    m = jnp.sum(valid, axis=-1, keepdims=True)
    last = jnp.arange(partition.shape[-1]) == m - 1
    t = costs.stage_times(model, hw, layout, c, p, b, last, n_pad)
    d = costs.handoff_time(model, hw, layout, c, b, n_pad)
    return jnp.where(valid[..., None], t, 0.0), jnp.where(valid[..., None], d, 0.0)


def partition_latency(partition, batch, model: ModelParams, hw: HardwareParams, layout: StageLayout, n_pad: int):
    """Prefill latency (s) of one batch for chunked partitions ``[..., M]`` -> ``[...]``.

    The fast path used by benchmarks and searches: costs and the §5 recurrence
    only (no memory accounting; see :func:`evaluate` for everything).
    """
    t, d = partition_costs(partition, batch, model, hw, layout, n_pad)
    return pipeline_latency(t, d)
