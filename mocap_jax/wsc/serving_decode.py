"""A decode-instance boundary of the serving program: finishes, admission, the next iteration(s).

:func:`decode_boundary` processes the boundary of one decode instance at its event time (the
contract in ``docs/wsc_llm.md``, "Serving semantics"); the step vmaps it over the decode
instances due before the next prefill event, which commute.  At most ``admit`` finishes and
``admit`` admissions are processed per step; a boundary with more keeps its event at the same
time (``continuing``) and the next step goes on with it, so the contract is unchanged while
the work per step stays ``O(admit x D)``.  After starting an iteration, up to ``leap`` quiet
boundaries -- no finish, no admission possible, strictly before the next event that could
depend on them -- are committed at once.  The batch's KV context per outside die is kept
incrementally (added on admission, grown by the batch's allocation shares per iteration,
subtracted on finish).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ..costs import pytree
from . import perf
from . import traffic as tf
from .arrays import first_true, leading_true, running_count, select_from
from .serving_inputs import ServingInputs, ServingShape
from .serving_state import ServingState

Array = Any


@pytree
class DecodeOutcome:
    """What one decode boundary changes (rows of its instance, and wafer-wide deltas)."""

    instance: Array            # [] int32 decode instance (Q when nothing happened)
    slot_request: Array        # [B] int32
    slot_generated: Array      # [B] tokens
    slot_prompt: Array         # [B] tokens
    slot_output: Array         # [B] tokens
    head: Array                # [] int32
    continuing: Array          # [] bool
    next_t: Array              # [] s
    leap_ends: Array           # [K] s, ends of the iterations after this boundary
    leap_count: Array          # [] int32 quiet boundaries fast-forwarded
    remote_context: Array      # [D] tokens
    remote_growth: Array       # [D] tokens per iteration
    load_change: Array         # [] int32 (minus the finishes)
    finished: Array            # [A] int32 requests that finished (N: none)
    freed: Array               # [D] bytes released
    kv_area: Array             # [] byte-seconds the finished requests held their KV
    any_finish: Array          # [] bool
    leaped: Array              # [] int32 quiet boundaries committed
    link_demand: Array         # [L] demand of its running iteration (contention)
    dram_demand: Array         # [D] demand of its running iteration (contention)


def idle_value(field: str, sh: ServingShape):
    """What :func:`decode_boundary` gives in ``field`` of its outcome for a boundary that is not due,
    wherever the step reads it: instance ``Q`` and requests ``N`` (no row is written), zero elsewhere."""
    return {"instance": sh.decode, "finished": sh.requests}.get(field, 0)


def _table_remote_times(inp: ServingInputs, q, context, growth, steps):
    """Remote KV read time per block of ``steps`` consecutive iterations, without contention (:func:`perf.remote_kv_time`)."""
    c = inp.cost
    j = jnp.arange(steps, dtype=context.dtype)
    tokens = context[None, :] + j[:, None] * growth[None, :]                     # [K+1, D]
    hops, inter = inp.layout.decode_die_hops[q], inp.layout.decode_die_internode[q]
    ingress = inp.layout.decode_ingress[q]
    return jax.vmap(lambda r: perf.remote_kv_time(
        c.model, c.hw, c.decode_plan, perf.RemoteKV(tokens=r, hops=hops, internode=inter, ingress_links=ingress)))(tokens)


def _read_flows(inp: ServingInputs, q, context, growth, steps):
    """Per-block bytes of the remote KV reads of ``steps`` iterations on every link ``[K+1, L]`` and DRAM
    ``[K+1, D]``, and the farthest location's hop latency (the contention model)."""
    c = inp.cost
    j = jnp.arange(steps, dtype=context.dtype)
    per_token = c.model.kv_elements_per_token_layer * c.decode_plan.kv_read_amplification * c.hw.kv_bytes
    dies, links = inp.traffic.read_dies[q], inp.traffic.read_links[q]              # [K] each
    L = inp.traffic.link_capacity.shape[0]
    on_links = lambda x: jnp.zeros(L, x.dtype).at[links].add(x[dies], mode="drop")
    link0, link1 = on_links(context) * per_token, on_links(growth) * per_token
    link_bytes = link0[None, :] + j[:, None] * link1[None, :]
    dram_bytes = (context[None, :] + j[:, None] * growth[None, :]) * per_token
    hops, inter = inp.layout.decode_die_hops[q], inp.layout.decode_die_internode[q]
    latency = jnp.max(jnp.where(context > 0, jnp.maximum(hops * c.hw.link_latency_s, inter * c.hw.node_latency_s),
                                0.0), initial=0.0)
    return link_bytes, dram_bytes, latency


def _iterations(inp, st, q, n, context, remote_context, growth, t_start, sh: ServingShape):
    """Durations ``[K+1]`` of the iteration starting now and the ``K`` after it, and its stream's demand."""
    c = inp.cost
    ft = context.dtype
    steps = sh.leap + 1
    ctx = context + jnp.arange(steps, dtype=ft) * n
    remote_total = jnp.sum(remote_context) + jnp.arange(steps, dtype=ft) * jnp.sum(growth)
    local = jnp.maximum(ctx - remote_total, 0.0) if sh.remote else jnp.maximum(ctx, 0.0)
    tokens = jnp.full((steps,), n, ft)

    def durations(hw, remote):
        return jax.vmap(lambda tok, pairs, loc, rem: perf.iteration_time(c.model, hw, c.decode_plan, tok, pairs, loc,
                                                                          tok, rem))(tokens, ctx, local, remote)

    if not sh.contention:
        remote = _table_remote_times(inp, q, remote_context, growth, steps) if sh.remote else jnp.zeros(steps, ft)
        return durations(c.hw, remote), None, None
    tr = inp.traffic
    if sh.remote:
        link_rb, dram_rb, latency = _read_flows(inp, q, remote_context, growth, steps)
        remote_alone = perf.remote_read_time(link_rb[0], tr.link_capacity, dram_rb[0], tr.dram_capacity, latency)
    else:
        link_rb, dram_rb = jnp.zeros((steps,) + tr.link_capacity.shape, ft), jnp.zeros((steps,) + tr.dram_capacity.shape, ft)
        remote_alone = jnp.zeros((), ft)
    alone = perf.iteration_time(c.model, c.hw, c.decode_plan, n, ctx[0], local[0], n, remote_alone)
    dram_own, ring, group = perf.iteration_traffic(c.model, c.hw, c.decode_plan, n, local[0], n)
    layers = c.model.layers.astype(ft)
    own = tr.decode_own[q]
    uses = tr.decode_ring[q] + tr.decode_group[q]
    safe = jnp.maximum(alone, 1e-30)
    link_demand = (tf.ring_link_bytes(ring, group, tr.decode_ring[q], tr.decode_group[q]) + layers * link_rb[0]) / safe
    dram_demand = (dram_own * own + layers * dram_rb[0] * (1.0 - own)) / safe
    link_bg, dram_bg = tf.background(st.traffic, t_start)
    link_bg = link_bg - st.traffic.decode_link[q]
    dram_bg = dram_bg - st.traffic.decode_dram[q]
    own_dram, collective, link_share, dram_share = tf.iteration_shares(inp, link_demand, dram_demand,
                                                                       jnp.maximum(link_bg, 0.0),
                                                                       jnp.maximum(dram_bg, 0.0), own, uses)
    if sh.remote:
        link_rate, dram_rate = tr.link_capacity * link_share, tr.dram_capacity * dram_share
        remote = jax.vmap(lambda lb, db: perf.remote_read_time(lb, link_rate, db, dram_rate, latency))(link_rb, dram_rb)
    else:
        remote = jnp.zeros(steps, ft)
    return durations(tf.shared_hardware(c.hw, own_dram, collective), remote), link_demand, dram_demand


def decode_boundary(inp: ServingInputs, st: ServingState, q, t, do, sh: ServingShape) -> DecodeOutcome:
    """Boundary of decode instance ``q`` at ``t`` (``do``: it is due).

    The quiet boundaries fast-forwarded after it depend only on the instance itself, except
    for a request placed later that could join at one of them: the placement then moves the
    instance's next event back to that boundary (:func:`mocap_jax.wsc.serving_prefill.prefill_event`).
    """
    N, B, K, A = sh.requests, sh.slots, sh.leap, sh.admit
    req, c, dec = inp.requests, inp.cost, st.decode
    ft = req.arrival.dtype
    inf = jnp.asarray(jnp.inf, ft)
    i32 = jnp.int32
    sr = dec.slot_request[q]
    act = sr >= 0
    prompt, out = dec.slot_prompt[q], dec.slot_output[q]
    ended = ~dec.continuing[q] & jnp.any(act)            # an iteration ends now: every request gains a token
    gen = dec.slot_generated[q] + jnp.where(act & ended, 1.0, 0.0).astype(ft)
    rt, fr = dec.remote_context[q], dec.remote_growth[q]
    outside = (inp.layout.decode_die_hops[q] > 0).astype(ft)
    if sh.remote:
        rt = rt + jnp.where(ended, 1.0, 0.0).astype(ft) * fr
    # finishes (at most A this step)
    fin_all = act & (gen >= out)
    fslot = first_true(fin_all & do, A, B)                                          # the first A finishes
    fvalid = fslot < B
    fin = jnp.zeros(B, bool).at[fslot].set(True, mode="drop")
    more_fin = jnp.sum(fin_all, dtype=i32) > A
    fs = jnp.clip(fslot, 0, B - 1)
    freq = jnp.where(fvalid, sr[fs], N)
    fneed = jnp.where(fvalid, (prompt[fs] + out[fs]) * c.kv_bytes_per_token, 0.0)
    frows = st.requests.allocation[jnp.clip(freq, 0, N - 1)] * fvalid[:, None].astype(ft)       # [A, D]
    placed_t = st.requests.placed_t[jnp.clip(freq, 0, N - 1)]
    kv_area = jnp.sum(jnp.where(fvalid, fneed * (t - placed_t), 0.0))
    nfin = jnp.sum(fin, dtype=i32)
    if sh.remote:
        frac = frows / jnp.maximum(fneed, 1e-30)[:, None]
        rt = rt - jnp.sum((prompt[fs] + out[fs])[:, None] * frac, axis=0) * outside
        fr = fr - jnp.sum(frac, axis=0) * outside
    act2 = act & ~fin
    # admission from the FCFS queue head while KV has arrived and the batch has room (at most A)
    room = jnp.maximum(c.batch_cap - jnp.sum(act2, dtype=i32), 0)
    head, tail = dec.head[q], dec.tail[q]
    pos = head + jnp.arange(A + 1, dtype=i32)
    valid = pos < tail
    cand = dec.queue[q, jnp.clip(pos, 0, N - 1)]
    cready = jnp.where(valid, st.requests.ready_t[jnp.where(valid, cand, 0)], inf)
    n_ready = leading_true(cready <= t)
    admit_now = do & ~more_fin
    n_adm = jnp.where(admit_now, jnp.minimum(jnp.minimum(n_ready, room), A), 0)
    more_adm = admit_now & (n_ready > A) & (room > A)
    empty = ~act2
    rank = running_count(empty) - 1
    take = empty & (rank < n_adm)
    jn = jnp.arange(A + 1) < n_adm
    jreq = jnp.where(jn, cand, 0)
    js, jo = req.prompt[jreq], req.output[jreq]
    crank = jnp.clip(rank, 0, A)
    new_req = jnp.where(take, select_from(cand, crank), jnp.where(act2, sr, -1))
    new_gen = jnp.where(take, 1.0, jnp.where(act2, gen, 0.0)).astype(ft)
    new_pr = jnp.where(take, select_from(js, crank), jnp.where(act2, prompt, 0.0))
    new_out = jnp.where(take, select_from(jo, crank), jnp.where(act2, out, 0.0))
    head2 = head + n_adm
    if sh.remote:
        jfrac = st.requests.allocation[jreq] / ((js + jo) * c.kv_bytes_per_token)[:, None] * jn[:, None].astype(ft)
        rt = jnp.maximum(rt + jnp.sum((js + 1.0)[:, None] * jfrac, axis=0) * outside, 0.0)
        fr = jnp.maximum(fr + jnp.sum(jfrac, axis=0) * outside, 0.0)
    cont = more_fin | more_adm                # the boundary continues next step at the same time
    # the batch that runs next, and the quiet boundaries after it
    act3 = new_req >= 0
    n = jnp.sum(act3, dtype=i32).astype(ft)
    c1 = jnp.sum(jnp.where(act3, new_pr + new_gen, 0.0))
    r_min = jnp.min(jnp.where(act3, new_out - new_gen, inf))
    h_valid = head2 < tail
    h_ready = jnp.where(h_valid, st.requests.ready_t[dec.queue[q, jnp.clip(head2, 0, N - 1)]], inf)
    join_possible = h_valid & (n < c.batch_cap.astype(ft))
    durations, link_demand, dram_demand = _iterations(inp, st, q, n, c1, rt, fr, t, sh)
    running = do & ~cont & (n > 0)
    dts = jnp.where(n > 0, durations, 0.0)
    ends = t + jnp.cumsum(dts)
    jj = jnp.arange(1, K + 1, dtype=ft)
    quiet = (jj < r_min) & ~(join_possible & (h_ready <= ends[:K]))
    k = jnp.where(cont, 0, leading_true(quiet))
    nxt = jnp.where(cont, t, jnp.where(n > 0, ends[k], h_ready))
    kf = k.astype(ft)
    gen_out = new_gen + jnp.where(act3, kf, 0.0)
    if sh.remote:
        rt = rt + kf * fr
    if sh.contention:
        link_demand = jnp.where(running, link_demand, 0.0)
        dram_demand = jnp.where(running, dram_demand, 0.0)
    else:
        link_demand = jnp.zeros_like(st.traffic.decode_link[q])
        dram_demand = jnp.zeros_like(st.traffic.decode_dram[q])
    return DecodeOutcome(
        instance=jnp.where(do, q, sh.decode).astype(i32), slot_request=new_req, slot_generated=gen_out,
        slot_prompt=new_pr, slot_output=new_out, head=head2, continuing=cont, next_t=nxt,
        leap_ends=jnp.where(running, ends[:max(K, 1)], jnp.inf), leap_count=k, remote_context=rt,
        remote_growth=fr, load_change=-nfin, finished=freq.astype(i32),
        freed=jnp.sum(frows, axis=0), kv_area=kv_area, any_finish=nfin > 0,
        leaped=jnp.where(do, k, 0), link_demand=link_demand, dram_demand=dram_demand)


__all__ = ["DecodeOutcome", "idle_value", "decode_boundary"]
