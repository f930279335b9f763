"""Arrivals and prefill-instance events of the serving program.

:func:`arrivals` queues the next requests at the prefill instance with the shortest queue
(ties: lowest index), waking an idle one; :func:`prefill_event` processes one prefill
instance's event -- the end of its iteration (first tokens), the placement of prefilled
requests (the memory scheduler's greedy rule, the decode instance with the fewest unfinished
requests, the KV transfer) and the start of its next chunked-prefill iteration.  The rules are
the contract of ``docs/wsc_llm.md`` ("Serving semantics").
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from . import perf
from . import traffic as tf
from .arrays import leading_true
from .memory import greedy_allocate_pairwise
from .serving_inputs import ServingInputs, ServingShape
from .serving_state import ServingState

Array = Any
_BIG = 2 ** 30


def arrivals(inp: ServingInputs, st: ServingState, sh: ServingShape) -> ServingState:
    """Up to ``sh.arrivals`` arrivals, each no later than the next prefill event (which they may create)."""
    req = inp.requests
    N = sh.requests

    def one(_, s: ServingState) -> ServingState:
        pre, rs = s.prefill, s.requests
        i = jnp.clip(rs.next_arrival, 0, N - 1)
        a = jnp.where(rs.next_arrival < req.count, req.arrival[i], jnp.inf)
        do = (rs.next_arrival < req.count) & (a <= jnp.min(pre.next_t))
        qlen = jnp.where(inp.layout.prefill_valid, pre.tail - pre.head, _BIG)
        p = jnp.argmin(qlen).astype(jnp.int32)
        tail = pre.tail[p]
        idle = ~pre.busy[p] & (pre.pending[p] == 0)
        pre = dataclasses.replace(
            pre, queue=pre.queue.at[jnp.where(do, p, sh.prefill), tail].set(i, mode="drop"),
            tail=pre.tail.at[p].add(do.astype(jnp.int32)),
            next_t=pre.next_t.at[p].set(jnp.where(do & idle, a, pre.next_t[p])))
        rs = dataclasses.replace(rs, prefill_instance=rs.prefill_instance.at[jnp.where(do, i, N)].set(p, mode="drop"),
                                 next_arrival=rs.next_arrival + do.astype(jnp.int32))
        tot = s.totals
        tot = dataclasses.replace(tot, overflow=tot.overflow | (do & (tail >= N)),
                                  events=tot.events + do.astype(jnp.int32),
                                  last_t=jnp.where(do, jnp.maximum(tot.last_t, a), tot.last_t))
        return dataclasses.replace(s, prefill=pre, requests=rs, totals=tot)

    return jax.lax.fori_loop(0, sh.arrivals, one, st)


def _place_loop(inp: ServingInputs, st: ServingState, p, t, do, pend0, sh: ServingShape):
    """Placement of the prefilled requests at the head of ``p``'s queue, FCFS, until one does not fit.

    The loop carries only small arrays (the decisions of at most ``W`` placements, and the
    transfer records of the contention model); the big tables are scattered after it, and what
    does not change between placements (the instance's hops) is read once before it.
    """
    N, Q, W, D = sh.requests, sh.decode, sh.window, sh.dies
    req, lay, c = inp.requests, inp.layout, inp.cost
    ft = req.arrival.dtype
    hw = c.hw
    own = lay.prefill_own[p]
    qidx = jnp.arange(Q, dtype=jnp.int32)
    hop_key = lay.pair_hops[p] * Q + qidx
    die_hops, die_internode = lay.prefill_die_hops[p], lay.prefill_die_internode[p]
    # the loop carries the transfer records only, not the whole traffic state
    records = lambda tr: (tr.transfer_link, tr.transfer_end, tr.transfer_next)
    with_records = lambda r: dataclasses.replace(st.traffic, transfer_link=r[0], transfer_end=r[1], transfer_next=r[2])

    def cond(carry):
        k, _, _, _, _, pend, blocked, _, _ = carry
        return (k < W) & do & ~blocked & (pend > 0)

    def place(carry):
        k, free, load, d_tail, head, pend, blocked, rec, moving = carry
        i = st.prefill.queue[p, jnp.clip(head, 0, N - 1)]
        s_i, o_i = req.prompt[i], req.output[i]
        one = o_i <= 1.0
        lq = jnp.where(lay.decode_valid, load, _BIG)
        key = jnp.where(lq == jnp.min(lq), hop_key, _BIG)  # fewest unfinished, hops, index
        q = jnp.argmin(key).astype(jnp.int32)
        need = (s_i + o_i) * c.kv_bytes_per_token
        drop = ~one & (need > lay.allowed_capacity[p, q])
        row, ok = greedy_allocate_pairwise(free, need, lay.priority[p, q])
        placed = ~one & ~drop & ok
        row = jnp.where(placed, row, 0.0)
        free = jnp.maximum(free - row, 0.0)
        tgt = (row > 0) & ~own
        moved = jnp.sum(jnp.where(tgt, row, 0.0))
        hops = jnp.max(jnp.where(tgt, die_hops, 0.0))
        inter = jnp.max(jnp.where(tgt, die_internode, 0.0))
        lat = jnp.maximum(hops * hw.link_latency_s, inter * hw.node_latency_s)
        if sh.contention:
            # the share of the bytes bound for each die that crosses each link, read in the loop (most
            # steps place nothing): exact, as counts and sources are small integers
            tr_in = inp.traffic
            routes = tr_in.transfer_counts[p].astype(ft) / tr_in.transfer_sources[p]
            seconds, tr = tf.transfer_start(inp, with_records(moving), routes, jnp.where(tgt, row, 0.0), lat, t)
            moving = records(tr)
        else:
            bw = jnp.where(inter > 0, hw.node_bandwidth, hw.link_bandwidth) * hw.eff_link
            seconds = jnp.where(moved > 0, lat + moved / (c.transfer_lanes * bw), 0.0)
        ready = t + seconds
        kind = jnp.where(placed, 1, jnp.where(one, 2, jnp.where(drop, 3, 0)))
        rec = {"row": rec["row"].at[k].set(row), "i": rec["i"].at[k].set(i), "q": rec["q"].at[k].set(q),
               "pos": rec["pos"].at[k].set(d_tail[q]), "ready": rec["ready"].at[k].set(ready),
               "kind": rec["kind"].at[k].set(kind)}
        d_tail = d_tail.at[q].add(placed.astype(jnp.int32))
        load = load.at[q].add(placed.astype(jnp.int32))
        pop = (kind > 0).astype(jnp.int32)
        return k + 1, free, load, d_tail, head + pop, pend - pop, blocked | (kind == 0), rec, moving

    rec0 = {"row": jnp.zeros((W, D), ft), "i": jnp.full(W, N, jnp.int32), "q": jnp.full(W, Q, jnp.int32),
            "pos": jnp.zeros(W, jnp.int32), "ready": jnp.zeros(W, ft), "kind": jnp.zeros(W, jnp.int32)}
    carry = (jnp.zeros((), jnp.int32), st.totals.free, st.decode.load, st.decode.tail, st.prefill.head[p], pend0,
             jnp.zeros((), bool), rec0, records(st.traffic))
    _, free, load, d_tail, head, pend, _, rec, moving = jax.lax.while_loop(cond, place, carry)
    return free, load, d_tail, head, pend, rec, with_records(moving)


def prefill_event(inp: ServingInputs, st: ServingState, p, t, do, sh: ServingShape) -> ServingState:
    """Event of prefill instance ``p`` at ``t`` (``do``: it is due): iteration end, KV placement, next iteration."""
    N, Q, W = sh.requests, sh.decode, sh.window
    req, c = inp.requests, inp.cost
    ft = req.arrival.dtype
    pre, dec, rs, tot = st.prefill, st.decode, st.requests, st.totals
    busy = pre.busy[p]
    head0, tail = pre.head[p], pre.tail[p]
    kk = jnp.arange(W, dtype=jnp.int32)
    # 1. the iteration that ends now: its completed requests emit their first token
    ncomp = jnp.where(busy, pre.completes[p], 0)
    ids_done = pre.queue[p, jnp.clip(head0 + pre.pending[p] + kk, 0, N - 1)]
    first_token_t = rs.first_token_t.at[jnp.where(do & (kk < ncomp), ids_done, N)].set(t, mode="drop")
    pend0 = pre.pending[p] + ncomp
    prog = jnp.where(busy, pre.next_progress[p], pre.progress[p])
    if sh.contention:  # the iteration that ended no longer loads the links
        zeros = lambda x: jnp.zeros_like(x[0])
        st = dataclasses.replace(st, traffic=tf.set_instance_demand(
            st.traffic, "prefill", jnp.where(do, p, sh.prefill), zeros(st.traffic.prefill_link),
            zeros(st.traffic.prefill_dram)))
    # 2. placement of prefilled requests
    free, load, d_tail, head, pend, rec, tr = _place_loop(inp, st, p, t, do, pend0, sh)
    placed = rec["kind"] == 1
    ip = jnp.where(placed, rec["i"], N)
    slot_empty = jnp.all(dec.slot_request < 0, axis=1)
    qc = jnp.clip(rec["q"], 0, Q - 1)
    first = placed & (rec["pos"] == dec.head[qc]) & slot_empty[qc]   # wakes an idle decode instance
    rs = dataclasses.replace(
        rs, first_token_t=first_token_t, allocation=rs.allocation.at[ip].set(rec["row"], mode="drop"),
        ready_t=rs.ready_t.at[ip].set(rec["ready"], mode="drop"),
        decode_instance=rs.decode_instance.at[ip].set(rec["q"], mode="drop"),
        placed_t=rs.placed_t.at[ip].set(t, mode="drop"),
        finish_t=rs.finish_t.at[jnp.where(rec["kind"] == 2, rec["i"], N)].set(t, mode="drop"),
        dropped=rs.dropped.at[jnp.where(rec["kind"] == 3, rec["i"], N)].set(True, mode="drop"))
    dec = dataclasses.replace(
        dec, load=load, tail=d_tail,
        queue=dec.queue.at[jnp.where(placed, rec["q"], Q), rec["pos"]].set(rec["i"], mode="drop"),
        next_t=dec.next_t.at[jnp.where(first, rec["q"], Q)].set(rec["ready"], mode="drop"))
    dec, unleaped = _join_fast_forwarded(inp, dec, placed & (rec["pos"] == dec.head[qc]) & ~slot_empty[qc], qc,
                                         rec["ready"], sh)
    tot = dataclasses.replace(tot, leaped=tot.leaped - unleaped)
    # 3. next iteration: FCFS over at most W queued requests, chunk budget C
    pos = head + kk
    valid = pos < tail
    ids = pre.queue[p, jnp.clip(pos, 0, N - 1)]
    done = jnp.where(kk == 0, prog, 0.0)
    rem = jnp.where(valid, req.prompt[ids] - done, 0.0)
    chunk = jnp.clip(c.chunk_tokens - (jnp.cumsum(rem) - rem), 0.0, rem)
    last = valid & (rem > 0) & (chunk >= rem)
    n_new = leading_true(last)
    nxt_chunk = chunk[jnp.clip(n_new, 0, W - 1)]
    nprog = jnp.where(n_new < W, jnp.where(n_new == 0, prog, 0.0) + nxt_chunk, 0.0)
    start = (pend == 0) & jnp.any(valid)
    cc = jnp.where(valid, chunk, 0.0)
    prefix = jnp.where(valid, done, 0.0)
    tokens = jnp.sum(cc)
    pairs = jnp.sum(cc * (prefix + (cc + 1.0) / 2.0))
    kv_read = jnp.sum(jnp.where(cc > 0, prefix + cc, 0.0))
    head_tokens = jnp.sum(valid & last, dtype=jnp.int32).astype(ft)
    dt, tr = _iteration(inp, tr, p, tokens, pairs, kv_read, head_tokens, t, do & start, sh)
    nxt = jnp.where(start, t + jnp.where(tokens > 0, dt, 0.0), jnp.inf)
    sel = jnp.where(do, p, sh.prefill)
    pre = dataclasses.replace(
        pre, head=pre.head.at[sel].set(head, mode="drop"), pending=pre.pending.at[sel].set(pend, mode="drop"),
        progress=pre.progress.at[sel].set(prog, mode="drop"), busy=pre.busy.at[sel].set(start, mode="drop"),
        completes=pre.completes.at[jnp.where(do & start, p, sh.prefill)].set(n_new, mode="drop"),
        next_progress=pre.next_progress.at[jnp.where(do & start, p, sh.prefill)].set(nprog, mode="drop"),
        next_t=pre.next_t.at[sel].set(nxt, mode="drop"))
    tot = dataclasses.replace(
        tot, free=free, overflow=tot.overflow | jnp.any(placed & (rec["pos"] >= N)),
        kv_peak=jnp.maximum(tot.kv_peak, jnp.sum(inp.layout.free0 - free)), events=tot.events + do.astype(jnp.int32),
        last_t=jnp.where(do, jnp.maximum(tot.last_t, t), tot.last_t))
    return dataclasses.replace(st, prefill=pre, decode=dec, requests=rs, totals=tot, traffic=tr)


def _join_fast_forwarded(inp: ServingInputs, dec, heads, q, ready, sh: ServingShape):
    """Move decode instances back to the fast-forwarded boundary at which a newly placed request joins.

    ``heads [W]``: the placement is the head of an empty queue of a running decode instance
    ``q [W]`` and arrives at ``ready [W]``; if the instance's batch has room, the request joins
    at the first boundary at or after ``ready``.  When that boundary was fast-forwarded as
    quiet, the instance's next event becomes that boundary and the quiet iterations after it
    are undone (tokens and remote context).  Returns the decode state and the boundaries undone.
    """
    Q = sh.decode
    if sh.leap == 0:
        return dec, jnp.zeros((), jnp.int32)
    ft = ready.dtype
    active = dec.slot_request[q] >= 0                                             # [W, B]
    room = jnp.sum(active, axis=1) < inp.cost.batch_cap
    ends, k = dec.leap_ends[q], dec.leap_count[q]                                  # [W, K], [W]
    before = jnp.sum((ends < ready[:, None]) & (jnp.arange(ends.shape[1])[None, :] < k[:, None]), axis=1,
                     dtype=jnp.int32)
    undo = jnp.where(heads & room & ~dec.continuing[q] & (before < k), k - before, 0).astype(jnp.int32)
    sel = jnp.where(undo > 0, q, Q)
    back = undo.astype(ft)
    # an instance is the head of at most one placement, so each instance's sum has at most one term
    # and the whole [Q, D] table can be updated (the same products and sums as a row scatter-add,
    # which is the slowest scatter of a step)
    back_q = jnp.sum(jnp.where(sel[:, None] == jnp.arange(Q)[None, :], back[:, None], 0.0), axis=0)
    dec = dataclasses.replace(
        dec, next_t=dec.next_t.at[sel].set(jnp.take_along_axis(ends, before[:, None], axis=1)[:, 0], mode="drop"),
        leap_count=dec.leap_count.at[sel].set(before, mode="drop"),
        slot_generated=dec.slot_generated.at[sel].add(-back[:, None] * active.astype(ft), mode="drop"),
        remote_context=dec.remote_context + -back_q[:, None] * dec.remote_growth)
    return dec, jnp.sum(undo, dtype=jnp.int32)


def _iteration(inp: ServingInputs, tr, p, tokens, pairs, kv_read, head_tokens, t, starts, sh: ServingShape):
    """Duration of the prefill iteration that starts (and, with contention, its stream's demand recorded)."""
    c = inp.cost
    if not sh.contention:
        return perf.iteration_time(c.model, c.hw, c.prefill_plan, tokens, pairs, kv_read, head_tokens, 0.0), tr
    t_alone = perf.iteration_time(c.model, c.hw, c.prefill_plan, tokens, pairs, kv_read, head_tokens, 0.0)
    dram, ring, group = perf.iteration_traffic(c.model, c.hw, c.prefill_plan, tokens, kv_read, head_tokens)
    x = inp.traffic
    own = x.prefill_own[p]
    alone = jnp.maximum(t_alone, 1e-30)
    link_demand = tf.ring_link_bytes(ring, group, x.prefill_ring[p], x.prefill_group[p]) / alone
    dram_demand = dram * own / alone
    link_bg, dram_bg = tf.background(tr, t)
    own_dram, collective, _, _ = tf.iteration_shares(inp, link_demand, dram_demand, jnp.maximum(link_bg, 0.0),
                                                     jnp.maximum(dram_bg, 0.0), own,
                                                     x.prefill_ring[p] + x.prefill_group[p])
    hw = tf.shared_hardware(c.hw, own_dram, collective)
    dt = perf.iteration_time(c.model, hw, c.prefill_plan, tokens, pairs, kv_read, head_tokens, 0.0)
    tr = tf.set_instance_demand(tr, "prefill", jnp.where(starts, p, sh.prefill), link_demand, dram_demand)
    return dt, tr


__all__ = ["arrivals", "prefill_event"]
