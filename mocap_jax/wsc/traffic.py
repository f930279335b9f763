"""The contention model of the serving program: streams, their demand on links and DRAM, their shares.

A *stream* is one activity that moves bytes over shared resources -- an instance's iteration
(its ring collectives on the instance's links, its reads of its own DRAM, and for a decode
instance its reads of KV held on other dies over the routes from those dies and their DRAM)
or a KV transfer from a prefill instance to the dies that receive the KV.  Its *demand* on a
resource is the rate it would use alone: the bytes it moves there over its duration without
contention.  A resource of capacity ``c`` (link or DRAM bandwidth with its efficiency) whose
streams demand more than ``c`` is shared by a rule:

* ``max-min`` (max-min fairness): no stream gets more than it demands, and the rest is split
  so that no stream could get more without taking from one that gets less;
* ``proportional``: every stream gets ``c / total demand`` of its demand.

A stream's *share* of a resource is the fraction of its demand it gets there; its bandwidth on
the resource is its isolated bandwidth times that share (:func:`share`).  The array program
evaluates shares once, when a stream starts, against the demand of the streams in flight at
that moment, and with per-resource totals instead of every stream's demand: proportional
sharing is exact from the total, max-min fairness is approximated by the larger of what the
others leave and the proportional share (exact when the resource is not over-subscribed or
when every competitor demands at least the fair share).  The event-driven reference
re-shares exactly at every stream start and end (:mod:`mocap_jax.wsc.reference_flows`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from .hardware import WaferParams
from .serving_inputs import ServingInputs
from .serving_state import TrafficState

Array = Any
MAX_MIN, PROPORTIONAL = 0, 1


def share(demand, others, capacity, rule):
    """Fraction of ``demand`` a stream receives on resources of ``capacity`` beside ``others`` (elementwise).

    1 where the stream demands nothing there or the resource is not over-subscribed.
    """
    d = jnp.maximum(demand, 1e-30)
    proportional = jnp.minimum(1.0, capacity / jnp.maximum(demand + others, 1e-30))
    fair = jnp.minimum(1.0, jnp.maximum((capacity - others) / d, proportional))
    s = jnp.where(rule == PROPORTIONAL, proportional, fair)
    return jnp.where(demand > 0, s, 1.0)


def background(tr: TrafficState, t):
    """Demand of every stream in flight at ``t``: (links ``[L]``, DRAM ``[D]``), bytes/s."""
    live = (tr.transfer_end > t).astype(tr.transfer_link.dtype)
    return tr.instance_link + live @ tr.transfer_link, tr.instance_dram


def set_instance_demand(tr: TrafficState, kind: str, index, link, dram) -> TrafficState:
    """Replace the demand row of prefill or decode instance(s) ``index`` (out of range: no change), keeping the totals.

    ``index`` is a scalar or ``[R]`` distinct indices with rows ``link [.., L]`` and ``dram [.., D]``.
    """
    links, drams = getattr(tr, f"{kind}_link"), getattr(tr, f"{kind}_dram")
    valid = (index >= 0) & (index < links.shape[0])
    safe = jnp.clip(index, 0, links.shape[0] - 1)
    keep = lambda new, old: jnp.where(jnp.expand_dims(valid, -1), new, old)
    old_l, old_d = links[safe], drams[safe]
    new_l, new_d = keep(link, old_l), keep(dram, old_d)
    delta_l, delta_d = new_l - old_l, new_d - old_d
    if jnp.ndim(index):
        delta_l, delta_d = jnp.sum(delta_l, axis=0), jnp.sum(delta_d, axis=0)
    return dataclasses.replace(
        tr, instance_link=jnp.maximum(tr.instance_link + delta_l, 0.0),
        instance_dram=jnp.maximum(tr.instance_dram + delta_d, 0.0),
        **{f"{kind}_link": _set_rows(links, index, link), f"{kind}_dram": _set_rows(drams, index, dram)})


def _set_rows(table, index, rows):
    """``table.at[index].set(rows, mode="drop")`` for a scalar or a few distinct indices, as selects.

    Vmapped, a row scatter into a carried table is a scatter with a built index array, and XLA
    copies the table around it; a select over the table's rows fuses into one pass.
    """
    which = jnp.arange(table.shape[0])[:, None]
    if not jnp.ndim(index):
        return jnp.where(which == index, rows[None, :], table)
    for r in range(index.shape[0]):
        table = jnp.where(which == index[r], rows[r][None, :], table)
    return table


def iteration_shares(inp: ServingInputs, link_demand, dram_demand, link_others, dram_others, own, ring_uses):
    """Shares of an instance iteration: (own DRAM, collectives, per link ``[L]``, per die DRAM ``[D]``).

    ``own [D]``: 1 on the instance's dies; ``ring_uses [L]``: links its collectives cross.
    """
    tr = inp.traffic
    link = share(link_demand, link_others, tr.link_capacity, tr.rule)
    dram = share(dram_demand, dram_others, tr.dram_capacity, tr.rule)
    own_dram = jnp.min(jnp.where(own > 0, dram, 1.0))
    collective = jnp.min(jnp.where(ring_uses > 0, link, 1.0))
    return own_dram, collective, link, dram


def shared_hardware(hw: WaferParams, own_dram, collective) -> WaferParams:
    """The hardware an iteration sees: its DRAM and collective bandwidth scaled by its shares."""
    return hw.replace(dram_bandwidth=hw.dram_bandwidth * own_dram, link_bandwidth=hw.link_bandwidth * collective,
                      node_bandwidth=hw.node_bandwidth * collective)


def ring_link_bytes(ring_bytes, group_bytes, ring_uses, group_uses):
    """Bytes an iteration's collectives move over each link ``[L]``."""
    return ring_bytes * ring_uses + group_bytes * group_uses


def _transfer_seconds(inp: ServingInputs, tr: TrafficState, link_bytes, demand, t):
    """Seconds to move ``link_bytes [L]`` while the transfers in flight end at their recorded times.

    The iteration streams are taken as lasting; between consecutive ends of the other
    transfers the shares are constant, so each link's bytes are done at a piecewise-linear
    pace and the last link to finish sets the time.  The ``M + 1`` segments are walked as
    unrolled elementwise ``[L]`` updates (``M`` is static and small), which fuse into a few loops
    where sorted ``[M + 1, L]`` tables with cumulative sums and an arg-max over them would not.
    """
    cap, rule = inp.traffic.link_capacity, inp.traffic.rule
    M = tr.transfer_end.shape[0]
    order = jnp.argsort(tr.transfer_end)
    end_sorted = tr.transfer_end[order]
    ends = jnp.maximum(end_sorted, t)                                                 # [M] ascending
    starts = [jnp.asarray(t, ends.dtype)] + [ends[m] for m in range(M)]              # segment starts
    lengths = [ends[m] - starts[m] for m in range(M)]                                 # the last is unbounded
    # in segment j the transfers ending after its start are live: a suffix of the sorted order
    rows = jnp.where((end_sorted > t)[:, None], tr.transfer_link[order], 0.0)
    live = [jnp.zeros_like(cap)] * (M + 1)
    live[M - 1] = rows[M - 1]
    for m in range(M - 2, -1, -1):
        live[m] = live[m + 1] + rows[m]
    rates = [cap * share(demand, tr.instance_link + live[j], cap, rule) for j in range(M + 1)]
    # bytes done before each segment, and whether a link's bytes are done by its end
    total = jnp.zeros_like(cap)
    done_before, reached = [], []
    for j in range(M + 1):
        if j < M:
            moved = jnp.where(jnp.isfinite(lengths[j]), rates[j] * lengths[j], 0.0)
            total = total + moved
            before = total - moved
            done_before.append(before)
            reached.append((before + rates[j] * lengths[j]) >= link_bytes)
        else:
            done_before.append(total)
            reached.append((total + rates[j] * jnp.inf) >= link_bytes)
    finish_in = lambda j: starts[j] - t + (link_bytes - done_before[j]) / jnp.maximum(rates[j], 1e-30)
    finish = finish_in(0)                                           # the first segment that finishes sets it
    for j in range(M, -1, -1):
        finish = jnp.where(reached[j], finish_in(j), finish)
    return jnp.max(jnp.where(link_bytes > 0, finish, 0.0), initial=0.0)


def transfer_start(inp: ServingInputs, tr: TrafficState, routes, outbound, latency, t):
    """A KV transfer from a prefill instance of ``outbound [D]`` bytes per target die, starting at ``t``.

    ``routes [D, L]``: the share of the bytes bound for each die that crosses each link (the
    instance's ``transfer_counts / transfer_sources``: its bytes cross the links of the routes from
    every die of the instance, an equal share each, to every target).  Returns
    (seconds, traffic state with the transfer recorded): isolated, the most loaded link sets the
    time; with others in flight each link gives it its share.
    """
    cap = inp.traffic.link_capacity
    link_bytes = outbound @ routes                                               # [L]
    busy = link_bytes > 0
    alone = jnp.max(jnp.where(busy, link_bytes / jnp.maximum(cap, 1e-30), 0.0), initial=0.0)
    demand = jnp.where(busy & (alone > 0), link_bytes / jnp.maximum(alone, 1e-30), 0.0)
    moving = _transfer_seconds(inp, tr, link_bytes, demand, t)
    seconds = jnp.where(jnp.sum(outbound) > 0, latency + moving, 0.0)
    slot = tr.transfer_next
    tr = dataclasses.replace(tr, transfer_link=tr.transfer_link.at[slot].set(demand),
                    transfer_end=tr.transfer_end.at[slot].set(jnp.where(seconds > 0, t + seconds, t)),
                    transfer_next=(slot + 1) % tr.transfer_end.shape[0])
    return seconds, tr


__all__ = ["MAX_MIN", "PROPORTIONAL", "share", "background", "set_instance_demand", "iteration_shares", "shared_hardware",
           "ring_link_bytes", "transfer_start"]
