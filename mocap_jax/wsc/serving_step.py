"""One scan step of the serving program, and the compiled scan over a batch of design points.

Prefill events are the only events that read what other events change (queues filled by
arrivals, memory and loads changed by decode finishes); arrivals and decode boundaries do not
interact with each other, and decode boundaries of different instances commute.  So a step
processes, in this order:

1. up to ``sh.arrivals`` arrivals no later than the next prefill event (an arrival that wakes
   an idle prefill instance makes that the next prefill event);
2. up to ``sh.decode_parallel`` decode boundaries no later than the next prefill event or
   arrival, in parallel (only the earliest while a prefill instance is blocked on memory: its
   finish makes the blocked instances retry at that time);
3. the next prefill event, if every arrival and decode boundary at or before it is done.

The result is the contract's total order (decode boundaries, then arrivals, then prefill
events at equal times), with many events per step.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp

from . import traffic as tf
from .serving_decode import DecodeOutcome, decode_boundary
from .serving_inputs import ServingInputs, ServingShape
from .serving_prefill import arrivals, prefill_event
from .serving_state import ServingState, initial_state


def _apply_decode(st: ServingState, out: DecodeOutcome, times, sh: ServingShape) -> ServingState:
    """Write the outcomes ``[R]`` of parallel decode boundaries into the state."""
    dec, rs, tot, tr = st.decode, st.requests, st.totals, st.traffic
    q = out.instance
    rows = lambda x, v: x.at[q].set(v, mode="drop")
    dec = dataclasses.replace(
        dec, slot_request=rows(dec.slot_request, out.slot_request),
        slot_generated=rows(dec.slot_generated, out.slot_generated), slot_prompt=rows(dec.slot_prompt, out.slot_prompt),
        slot_output=rows(dec.slot_output, out.slot_output), head=rows(dec.head, out.head),
        continuing=rows(dec.continuing, out.continuing), next_t=rows(dec.next_t, out.next_t),
        leap_ends=rows(dec.leap_ends, out.leap_ends), leap_count=rows(dec.leap_count, out.leap_count),
        remote_context=rows(dec.remote_context, out.remote_context),
        remote_growth=rows(dec.remote_growth, out.remote_growth),
        load=dec.load.at[q].add(out.load_change, mode="drop"))
    done = q < sh.decode
    finished_t = jnp.broadcast_to(times[:, None], out.finished.shape)
    rs = dataclasses.replace(rs, finish_t=rs.finish_t.at[out.finished.reshape(-1)].set(finished_t.reshape(-1),
                                                                                         mode="drop"))
    tot = dataclasses.replace(
        tot, free=tot.free + jnp.sum(out.freed, axis=0), kv_area=tot.kv_area + jnp.sum(out.kv_area),
        events=tot.events + jnp.sum(done, dtype=jnp.int32), leaped=tot.leaped + jnp.sum(out.leaped, dtype=jnp.int32),
        last_t=jnp.maximum(tot.last_t, jnp.max(jnp.where(done, times, -jnp.inf))))
    if sh.contention:
        tr = tf.set_instance_demand(tr, "decode", q, out.link_demand, out.dram_demand)
    return dataclasses.replace(st, decode=dec, requests=rs, totals=tot, traffic=tr)


def step(inp: ServingInputs, st: ServingState, sh: ServingShape) -> ServingState:
    """Arrivals, parallel decode boundaries and one prefill event (see the module docstring)."""
    lay, req = inp.layout, inp.requests
    ft = req.arrival.dtype
    inf = jnp.asarray(jnp.inf, ft)
    st = arrivals(inp, st, sh)
    pre, dec = st.prefill, st.decode
    t_prefill = jnp.min(pre.next_t)
    i = jnp.clip(st.requests.next_arrival, 0, sh.requests - 1)
    t_arrival = jnp.where(st.requests.next_arrival < req.count, req.arrival[i], inf)
    horizon = jnp.minimum(t_prefill, t_arrival)
    blocked = lay.prefill_valid & ~pre.busy & (pre.pending > 0)
    any_blocked = jnp.any(blocked)
    # 2. decode boundaries due by the horizon, earliest first
    due = jnp.where(lay.decode_valid & (dec.next_t <= horizon), dec.next_t, inf)
    r = min(sh.decode_parallel, sh.decode)
    order = jnp.argsort(due)[:r].astype(jnp.int32)
    times = due[order]
    rank = jnp.arange(r)
    do = jnp.isfinite(times) & (~any_blocked | (rank == 0))
    out = jax.vmap(decode_boundary, in_axes=(None, None, 0, 0, 0, None))(inp, st, order, times, do, sh)
    st = _apply_decode(st, out, times, sh)
    retry = any_blocked & do[0] & out.any_finish[0]
    pre = dataclasses.replace(st.prefill, next_t=jnp.where(retry & blocked, times[0], st.prefill.next_t))
    st = dataclasses.replace(st, prefill=pre)
    # 3. the prefill event, when nothing at or before it is left
    p = jnp.argmin(pre.next_t).astype(jnp.int32)
    t_p = pre.next_t[p]
    ready = jnp.isfinite(t_p) & (t_arrival > t_p) & (jnp.min(jnp.where(lay.decode_valid, st.decode.next_t, inf)) > t_p)
    return prefill_event(inp, st, p, t_p, ready, sh)


def finished(inp: ServingInputs, st: ServingState):
    """Every request has arrived and no instance has an event left."""
    return (st.requests.next_arrival >= inp.requests.count) & ~jnp.any(jnp.isfinite(st.prefill.next_t)) \
        & ~jnp.any(jnp.isfinite(st.decode.next_t))


def restart_lanes(inp: ServingInputs, st: ServingState, restart, sh: ServingShape) -> ServingState:
    """The lanes flagged in ``restart [G]`` start their design points from the initial state.

    Done inside the scan's program, so that a lane taking a new point needs no program of its
    own; the reset runs only when some lane restarts (``lax.cond``), once per chunk of steps.
    """
    def reset(st):
        fresh = jax.vmap(lambda x: initial_state(x, sh))(inp)
        lane = lambda x: restart.reshape(restart.shape + (1,) * (x.ndim - 1))
        return jax.tree_util.tree_map(lambda new, old: jnp.where(lane(old), new, old), fresh, st)

    return jax.lax.cond(jnp.any(restart), reset, lambda st: st, st)


def state_shapes(inp: ServingInputs, sh: ServingShape):
    """Shapes and dtypes of the states of a batch of design points (``jax.ShapeDtypeStruct`` leaves)."""
    return jax.eval_shape(jax.vmap(lambda x: initial_state(x, sh)), inp)


def scan_batch(inp: ServingInputs, st: ServingState, restart, sh: ServingShape, steps: int):
    """``steps`` scan steps of every design point of a batch, the lanes flagged in ``restart [G]``
    starting from the initial state; returns the states and which are finished."""
    st = restart_lanes(inp, st, restart, sh)
    stepper = jax.vmap(lambda x, s: step(x, s, sh))
    st, _ = jax.lax.scan(lambda c, _: (stepper(inp, c), None), st, None, length=steps)
    return st, jax.vmap(finished)(inp, st)


def run_batch(sh: ServingShape, steps: int, mesh=None):
    """:func:`scan_batch` as one jitted program (the state donated); with ``mesh`` (1-D, axis ``points``),
    each device runs its share of the lanes on its own (``shard_map``).

    The lanes never exchange anything, and under ``vmap`` the loops inside a step (the placement
    ``while_loop``) run until every lane's condition ends.  Partitioned automatically over the
    devices instead, every iteration of such a loop agrees on that condition across the devices (an
    all-reduce and a rendezvous per iteration), so each device would wait for the other's lanes.
    """
    fn = partial(scan_batch, sh=sh, steps=steps)
    if mesh is not None:
        from jax.sharding import PartitionSpec

        lanes = PartitionSpec("points")
        fn = jax.shard_map(fn, mesh=mesh, in_specs=(lanes, lanes, lanes), out_specs=(lanes, lanes), check_vma=False)
    return jax.jit(fn, donate_argnums=(1,))


__all__ = ["step", "finished", "restart_lanes", "state_shapes", "scan_batch", "run_batch"]
