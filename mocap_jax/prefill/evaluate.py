"""EvaluatePrefill of one configuration: items -> times -> timeline -> memory -> MBKR -> metrics.

:func:`evaluate` is written plainly for one configuration (:class:`Point`, with the static
:class:`~mocap_jax.schedule.shape.SimShape`) and batched at the edge with ``vmap``
(:mod:`mocap_jax.prefill.batch`).  It strings together the rules, each written once:

1. items (:mod:`mocap_jax.schedule.items`) and their per-stage times, hand-offs, KV and
   activation bytes (:mod:`mocap_jax.costs.stage`);
2. the timeline of ``batches`` consecutive batches (:func:`timeline`, the wavefront of
   :mod:`mocap_jax.schedule.recurrence`; synchronous admission holds each batch until the
   previous one has left the last stage);
3. releases and memory resolved in time (:mod:`mocap_jax.schedule.memory`);
4. with MBKR, spill decisions (:mod:`mocap_jax.mbkr.spills`) on the current timeline, their costs
   (:mod:`mocap_jax.mbkr.costs`) added to the item times, and the timeline again, ``passes``
   times;
5. feasibility and summary metrics.

With the ``overflow`` spill policy a configuration that fits without MBKR spills nothing, so its
MBKR result is its plain result, exactly (and is taken from the plain evaluation, which also
keeps rounding from turning a fitting point infeasible).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from .. import costs
from ..costs import HardwareParams, ModelParams, StageLayout, pytree
from ..costs.computed_once import computed_once
from ..mbkr.costs import spill_costs
from ..mbkr.pairing import MBKRParams, partner_of
from ..mbkr.spills import FIT_TOLERANCE, Stages, dynamic_spills, pair_spills, touched_stages
from ..schedule import memory
from ..schedule.items import Chunks, ItemTable
from ..schedule.prefix import prefix_max
from ..schedule.recurrence import finish_times, start_times
from ..schedule.shape import Admission, MBKRMode, SimShape, Spill

Array = Any


@pytree
class Point:
    """Everything numeric about one configuration (a pytree of traced leaves).

    Fields:
      items: :class:`ItemTable` of one batch (``[K]`` fields), or :class:`Chunks` of a chunked
        batch, whose table is built here (inside the compiled program).
      model: :class:`ModelParams`.
      hardware: :class:`HardwareParams`.
      layout: :class:`StageLayout` (number of stages, hand-off routes).
      mbkr: :class:`MBKRParams` (unused when the shape's MBKR mode is off).
    """

    items: ItemTable | Chunks
    model: ModelParams
    hardware: HardwareParams
    layout: StageLayout
    mbkr: MBKRParams


@pytree
class Evaluation:
    """EvaluatePrefill of one configuration (times in s, memory in bytes).

    Fields:
      finish, start: ``[E, N]`` every timeline item on every stage (E = batches x K).
      item_times: ``[E, N]`` time each item spends on each stage, MBKR costs included.
      stage_times, handoff_times: ``[K, N]`` one batch's times without MBKR.
      prefill_latency_s: batch 0's last item leaving the last stage (``inf`` if infeasible).
      raw_latency_s: the same time, feasible or not.
      feasible: every stage fits its usable HBM at every instant (and MBKR found room).
      throughput_rps: saturation throughput, requests per second (0 if infeasible).
      period_s: saturation period (bottleneck stage's work per batch, or the batch latency
        under synchronous admission).
      bubble_fraction: idle share of the stages over batch 0's latency.
      stage_utilisation: ``[N]`` busy share of each stage over the period.
      peak_mem_bytes_per_stage, kv_peak_bytes_per_stage: ``[N]`` largest memory and largest KV
        (held, hosted, or being written).
      weight_bytes_per_stage: ``[N]``; capacity_bytes: usable HBM per die.
      spilled_bytes_per_stage, blocking_s_per_stage: ``[N]`` MBKR totals (0 without MBKR).
      remote_read_s, remote_read_unhidden_s, spill_write_s, migrate_s: MBKR totals, seconds.
      moved: ``[E, N]`` KV each item wrote to its partner; extra: ``[E, N]`` seconds MBKR added;
      block: ``[E, N]`` creditor blocking charged to each item; host: ``[E, N]`` host of each
        item's spills (-1 none).
      overflow: MBKR found no room for some overflow.
      mbkr_converged: the last MBKR pass returned the finish times it started from, a fixed point
        that further passes keep; false where it moved them, so a further pass could change the
        result (true without MBKR and where nothing spills).
    """

    finish: Array
    start: Array
    item_times: Array
    stage_times: Array
    handoff_times: Array
    prefill_latency_s: Array
    raw_latency_s: Array
    feasible: Array
    throughput_rps: Array
    period_s: Array
    bubble_fraction: Array
    stage_utilisation: Array
    peak_mem_bytes_per_stage: Array
    kv_peak_bytes_per_stage: Array
    weight_bytes_per_stage: Array
    capacity_bytes: Array
    spilled_bytes_per_stage: Array
    blocking_s_per_stage: Array
    remote_read_s: Array
    remote_read_unhidden_s: Array
    spill_write_s: Array
    migrate_s: Array
    moved: Array
    extra: Array
    block: Array
    host: Array
    overflow: Array
    mbkr_converged: Array


def item_table_of(point: Point) -> ItemTable:
    """The point's item table (built from its chunks when it carries :class:`Chunks`)."""
    return point.items.table() if isinstance(point.items, Chunks) else point.items


def timeline(times, handoff, shape: SimShape):
    """Finish and start times ``[E, N]`` of ``shape.batches`` batches of items run back to back.

    ``times``/``handoff`` are ``[E, N]`` (E = batches x K, in item order).  Streaming admission:
    the items of every batch queue behind the previous ones (one recurrence over all of them).
    Synchronous: batch j is ready only when batch j-1 has left the last stage.
    """
    E, N = times.shape
    if shape.admission == Admission.STREAMING or shape.batches == 1:
        f = finish_times(times, handoff)
        return f, start_times(f, handoff)
    K = shape.items

    def one(carry, xs):
        stage_free, exit_time = carry
        t_j, d_j = xs
        ready = jnp.full((K,), exit_time, times.dtype)
        f = finish_times(t_j, d_j, ready, stage_free)
        return (f[-1], f[-1, -1]), (f, start_times(f, d_j, ready, stage_free))

    init = (jnp.zeros((N,), times.dtype), jnp.zeros((), times.dtype))
    _, (f, st) = jax.lax.scan(one, init, (times.reshape(shape.batches, K, N), handoff.reshape(shape.batches, K, N)))
    return f.reshape(E, N), st.reshape(E, N)


class Structure:
    """Per-configuration quantities every pass reads: one batch's times ``t``,
    hand-offs ``d``, KV ``kv``, activation bytes ``activation`` and attention seconds
    ``attention`` (``[K, N]``), the same over the timeline (``*_all`` ``[E, N]``), the KV's
    factors (``kv_tokens [K]`` / ``kv_tokens_all [E]`` tokens, ``kv_per_token [N]`` bytes), weights
    ``[N]``, usable HBM, and the timeline's group structure (``ends [G]`` group-end slots,
    ``group [E]`` group slot of each item, ``group_first [E]`` first slot of each item's group)."""

    def __init__(self, point: Point, shape: SimShape):
        K, N, nb = shape.items, shape.stages, shape.batches
        model, hw, layout, it = point.model, point.hardware, point.layout, item_table_of(point)
        dt = model.hidden.dtype
        self.n = layout.num_stages
        self.live = jnp.arange(N) < self.n
        c, p, b = (x.astype(dt) for x in (it.tokens, it.prefix, it.requests))
        valid = it.valid[:, None]
        self.t = jnp.where(valid, costs.stage_times(model, hw, layout, c, p, b, it.last, N), 0.0)
        self.d = jnp.where(valid, costs.handoff_time(model, hw, layout, c, b, N), 0.0)
        self.kv_per_token = costs.stage_kv_bytes_per_token(model, hw, self.n, N, tensor_parallel=layout.tensor_parallel)
        self.kv_tokens = jnp.where(it.valid, b * c, 0.0)
        self.kv = self.kv_tokens[:, None] * self.kv_per_token[None, :]
        self.activation = jnp.where(valid, costs.item_activation_bytes(model, hw, layout, c, b, it.last, N), 0.0)
        self.attention = jnp.where(valid, costs.stage_attention_times(model, hw, layout, c, p, b, N), 0.0)
        self.weights = jnp.where(self.live, costs.stage_weight_bytes(model, hw, self.n, N,
                                                                     tensor_parallel=layout.tensor_parallel), 0.0)
        self.usable = hw.usable_hbm
        self.requests = jnp.sum(jnp.where(it.last, it.requests, 0)).astype(dt)
        # with MBKR every pass reads these tables, in more than one layout: stored once.  Without it
        # only the stage times are (the recurrence's skewed copy and the summary read them, and the
        # skewed kernel would recompute them at strided reads); the hand-offs and the activation
        # bytes, each read by one kernel, cost less recomputed there from the per-item values
        if shape.mbkr != MBKRMode.OFF:
            self.t, self.d, self.kv, self.activation, self.attention = computed_once(
                (self.t, self.d, self.kv, self.activation, self.attention))
        else:
            self.t = computed_once(self.t)
        tile = lambda x: jnp.tile(x, (nb,) + (1,) * (x.ndim - 1))
        self.valid = tile(it.valid)
        self.kv_tokens_all = tile(self.kv_tokens)
        self.t_all, self.d_all, self.kv_all, self.act_all, self.att_all = (
            tile(x) for x in (self.t, self.d, self.kv, self.activation, self.attention))
        ends = memory.group_ends(it.last, shape.groups)
        self.ends = memory.timeline_groups(ends, K, nb)                              # [G_all]
        slot = jnp.arange(K)
        in_batch = jnp.clip(jnp.cumsum(it.last) - it.last, 0, shape.groups - 1)
        offsets = jnp.repeat(jnp.arange(nb) * K, K)
        self.group = jnp.tile(in_batch, nb) + jnp.repeat(jnp.arange(nb) * shape.groups, K)
        starts_group = jnp.concatenate([jnp.ones(1, bool), it.last[:-1]])
        first = prefix_max(jnp.where(starts_group, slot, 0))
        self.group_first = jnp.tile(first, nb) + offsets


def _summary(s: Structure, finish, times, shape: SimShape):
    """Latency, saturation throughput, bubbles and utilisation of batch 0 on a timeline."""
    K = shape.items
    dt = times.dtype
    latency = finish[K - 1, -1]
    work = jnp.sum(times[:K], axis=0)                                                # [N] busy seconds, batch 0
    period = latency if shape.admission == Admission.SYNCHRONOUS else jnp.max(work)
    bubble = 1.0 - jnp.sum(work) / (s.n.astype(dt) * latency)
    utilisation = jnp.where(s.live, work / period, 0.0)
    return latency, period, bubble, utilisation


def _filled(release, ends):
    """Release times with unused group slots repeating their predecessor (sorted along groups)."""
    return prefix_max(jnp.where((ends >= 0)[:, None], release, -jnp.inf))


def _mbkr_pass(s: Structure, point: Point, shape: SimShape, finish, start):
    """Spills decided on the timeline ``finish`` / ``start`` and their costs."""
    mb, hw = point.mbkr, point.hardware
    release = _filled(memory.release_times(finish, s.ends, shape.release), s.ends)
    st = Stages(start=start, finish=finish, kv=s.kv_all, activation=s.act_all, valid=s.valid, group=s.group,
                release=release, weights=s.weights, budget=jnp.where(s.live, s.usable - s.weights, 1.0), live=s.live)
    if shape.mbkr == MBKRMode.DYNAMIC:
        spills = dynamic_spills(st, s.n, mb.p1, mb.p2, shape.spill)
        hosts = None
    else:
        hosts = jnp.where(s.live, partner_of(mb.pairing, s.n, shape.stages), -1)
        spills = pair_spills(st, hosts, s.n, mb.p1, mb.p2, shape.spill, (shape.stages + 1) // 2)
    cost = spill_costs(spills, start, finish, s.att_all, s.group_first, mb, hw.link_latency_s, hw.eff_link,
                       hw.hbm_bandwidth, hw.eff_hbm, hosts)
    return spills, cost


def evaluate(point: Point, shape: SimShape) -> Evaluation:
    """EvaluatePrefill of one configuration (see the module docstring)."""
    s = Structure(point, shape)
    dt = s.t.dtype
    N = shape.stages
    finish, start = timeline(s.t_all, s.d_all, shape)
    release = memory.release_times(finish, s.ends, shape.release)
    peak, kv_peak, _ = memory.peak_memory(start, s.kv_tokens_all, s.kv_per_token, s.act_all, s.weights, s.ends,
                                          release, s.valid, s.group_first, shape.release)
    feasible = jnp.all((peak <= s.usable) | ~s.live)
    times = s.t_all
    zero_n = jnp.zeros((N,), dt)
    zero_e = jnp.zeros_like(s.t_all)
    mbkr_parts = dict(spilled_bytes_per_stage=zero_n, blocking_s_per_stage=zero_n, remote_read_s=jnp.zeros((), dt),
                      remote_read_unhidden_s=jnp.zeros((), dt), spill_write_s=jnp.zeros((), dt),
                      migrate_s=jnp.zeros((), dt), moved=zero_e, extra=zero_e, block=zero_e,
                      host=jnp.full(s.t_all.shape, -1, jnp.int32), overflow=jnp.zeros((), bool),
                      mbkr_converged=jnp.ones((), bool))
    if shape.mbkr != MBKRMode.OFF:
        plain = (finish, start, times, peak, kv_peak, feasible)

        def one_pass(_, carry):
            """Spills decided on the previous pass's timeline, and the timeline their costs give.  A
            pass reads only the previous finish times (and the starts they determine), so a pass that
            returns the finish times it started from is a fixed point of every later pass."""
            m_finish, m_start, _, _, _, _ = carry
            spills, cost = _mbkr_pass(s, point, shape, m_finish, m_start)
            m_times = s.t_all + cost.extra
            new_finish, new_start = timeline(m_times, s.d_all, shape)
            return new_finish, new_start, m_times, spills, cost, jnp.all(new_finish == m_finish)

        # a loop rather than straight-line passes: one copy of the spill program to compile
        spills0, cost0 = jax.eval_shape(lambda: _mbkr_pass(s, point, shape, finish, start))
        zeros = lambda tree: jax.tree_util.tree_map(lambda x: jnp.zeros(x.shape, x.dtype), tree)
        m_finish, m_start, m_times, spills, cost, converged = jax.lax.fori_loop(
            0, shape.passes, one_pass, (finish, start, times, zeros(spills0), zeros(cost0), jnp.zeros((), bool)))
        allowance = jnp.where(touched_stages(spills), 1 + FIT_TOLERANCE, 1.0)
        m_feasible = ~spills.overflow & jnp.all((spills.peak <= s.usable * allowance) | ~s.live)
        keep_plain = feasible if shape.spill == Spill.OVERFLOW else jnp.zeros((), bool)
        pick = lambda a, b: jnp.where(keep_plain, a, b)
        finish, start, times, peak, kv_peak, feasible = (pick(a, b) for a, b in zip(
            plain, (m_finish, m_start, m_times, spills.peak, spills.kv_peak, m_feasible)))
        keep = lambda x: jnp.where(keep_plain, jnp.zeros_like(x), x)
        mbkr_parts = dict(
            spilled_bytes_per_stage=keep(jnp.sum(spills.moved, axis=0)), blocking_s_per_stage=keep(jnp.sum(cost.block, axis=0)),
            remote_read_s=keep(jnp.sum(cost.read)), remote_read_unhidden_s=keep(jnp.sum(cost.read_extra)),
            spill_write_s=keep(jnp.sum(cost.write)), migrate_s=keep(jnp.sum(cost.migrate)), moved=keep(spills.moved),
            extra=keep(cost.extra), block=keep(cost.block),
            host=jnp.where(keep_plain, -1, spills.host), overflow=~keep_plain & spills.overflow,
            mbkr_converged=keep_plain | converged)
    latency, period, bubble, utilisation = _summary(s, finish, times, shape)
    throughput = s.requests / period
    return Evaluation(
        finish=finish, start=start, item_times=times, stage_times=s.t, handoff_times=s.d,
        prefill_latency_s=jnp.where(feasible, latency, jnp.inf), raw_latency_s=latency, feasible=feasible,
        throughput_rps=jnp.where(feasible, throughput, 0.0), period_s=period, bubble_fraction=bubble,
        stage_utilisation=utilisation, peak_mem_bytes_per_stage=jnp.where(s.live, peak, 0.0),
        kv_peak_bytes_per_stage=jnp.where(s.live, kv_peak, 0.0), weight_bytes_per_stage=s.weights,
        capacity_bytes=s.usable, **mbkr_parts)
