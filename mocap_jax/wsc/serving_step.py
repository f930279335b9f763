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
events at equal times), with many events per step.  A batch's step (:func:`step_batch`) computes
only the decode boundaries that are due, packed over its lanes, at most ``BOUNDARIES_PER_LANE``
per lane on average; one left over waits for the next step, as one past the ``decode_parallel``-th
does, which leaves that order as it is.
"""

from __future__ import annotations

import dataclasses
import math
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp

from . import traffic as tf
from ..costs import pytree
from .serving_decode import DecodeOutcome, decode_boundary, idle_value
from .serving_inputs import ServingInputs, ServingShape
from .serving_prefill import arrivals, prefill_event
from .serving_state import ServingState, initial_state

Array = Any


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


@pytree
class DueBoundaries:
    """The decode boundaries a step processes (rank ``r`` in ``[R]``, earliest first)."""

    instance: Array            # [R] int32 decode instances
    times: Array               # [R] s, their event times
    do: Array                  # [R] bool, processed this step
    t_arrival: Array           # [] s, the next arrival (inf if none)
    blocked: Array             # [P] bool, prefill instances idle with prefilled requests waiting for memory


def due_boundaries(inp: ServingInputs, st: ServingState, sh: ServingShape):
    """Arrivals, then the decode boundaries due by the horizon: ``(state, DueBoundaries)``."""
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
    due = jnp.where(lay.decode_valid & (dec.next_t <= horizon), dec.next_t, inf)
    r = sh.boundaries
    order = jnp.argsort(due)[:r].astype(jnp.int32)
    times = due[order]
    do = jnp.isfinite(times) & (~any_blocked | (jnp.arange(r) == 0))
    return st, DueBoundaries(instance=order, times=times, do=do, t_arrival=t_arrival, blocked=blocked)


def finish_step(inp: ServingInputs, st: ServingState, due: DueBoundaries, out: DecodeOutcome, sh: ServingShape):
    """Write the decode boundaries' outcomes ``[R]``, then run the prefill event if nothing at or before it is left."""
    ft = inp.requests.arrival.dtype
    inf = jnp.asarray(jnp.inf, ft)
    st = _apply_decode(st, out, due.times, sh)
    retry = jnp.any(due.blocked) & due.do[0] & out.any_finish[0]
    pre = dataclasses.replace(st.prefill, next_t=jnp.where(retry & due.blocked, due.times[0], st.prefill.next_t))
    st = dataclasses.replace(st, prefill=pre)
    p = jnp.argmin(pre.next_t).astype(jnp.int32)
    t_p = pre.next_t[p]
    ready = jnp.isfinite(t_p) & (due.t_arrival > t_p) & (
        jnp.min(jnp.where(inp.layout.decode_valid, st.decode.next_t, inf)) > t_p)
    return prefill_event(inp, st, p, t_p, ready, sh)


def step(inp: ServingInputs, st: ServingState, sh: ServingShape) -> ServingState:
    """Arrivals, parallel decode boundaries and one prefill event (see the module docstring)."""
    st, due = due_boundaries(inp, st, sh)
    out = jax.vmap(decode_boundary, in_axes=(None, None, 0, 0, 0, None))(inp, st, due.instance, due.times, due.do, sh)
    return finish_step(inp, st, due, out, sh)


class _LaneRows:
    """One lane's rows of a batch's ``[G, ...]`` table, read without copying the lane's table.

    Only indexing is offered: code that used such a table whole would fail while tracing, not
    copy it silently.
    """

    def __init__(self, table, lane):
        self.table, self.lane = table, lane

    @property
    def shape(self):
        return self.table.shape[1:]

    @property
    def dtype(self):
        return self.table.dtype

    def __getitem__(self, index):
        return self.table[(self.lane,) + (index if isinstance(index, tuple) else (index,))]


def _lane_leaves(tree, lane):
    """Lane ``lane`` of every leaf of ``tree`` but its :class:`_LaneRows` (read where they are used).
    The lanes' scalars (``[G]`` leaves) are read as one row of a ``[G, n]`` stack per dtype: read one
    by one, each is a gather of its own, a kernel that XLA:CPU compiles and launches separately (some
    forty of them per decode boundary), while the stack of the inputs' scalars is computed once per call."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    out = list(leaves)
    scalars: dict = {}
    for i, x in enumerate(leaves):
        if isinstance(x, _LaneRows):
            continue
        if x.ndim == 1:
            scalars.setdefault(x.dtype, []).append(i)
        else:
            out[i] = x[lane]
    for index in scalars.values():
        row = jnp.stack([leaves[i] for i in index], axis=1)[lane]
        for j, i in enumerate(index):
            out[i] = row[j]
    return jax.tree_util.tree_unflatten(treedef, out)


def _lane_view(inp: ServingInputs, st: ServingState, lane):
    """What a decode boundary reads of lane ``lane`` of a batch: the tables with a row per decode
    instance or per request (the state's decode and request tables, the requests, and the ``decode_*``
    and ``read_*`` inputs) as rows (:class:`_LaneRows`), the rest (scalars, per-die and per-link
    vectors, the transfers in flight) whole (:func:`_lane_leaves`)."""
    rows = lambda tree: jax.tree_util.tree_map(lambda x: _LaneRows(x, lane), tree)

    def by_name(tree):
        pick = lambda name: name.startswith(("decode_", "read_"))
        return dataclasses.replace(tree, **{f.name: rows(getattr(tree, f.name)) for f in dataclasses.fields(tree)
                                            if pick(f.name)})

    lane_inp = dataclasses.replace(inp, requests=rows(inp.requests), layout=by_name(inp.layout),
                                   traffic=by_name(inp.traffic))
    lane_st = dataclasses.replace(st, decode=rows(st.decode), requests=rows(st.requests), traffic=by_name(st.traffic))
    return _lane_leaves(lane_inp, lane), _lane_leaves(lane_st, lane)


def _packed_boundaries(inp: ServingInputs, st: ServingState, due: DueBoundaries, sh: ServingShape, capacity: int):
    """The first ``capacity`` due decode boundaries of a batch of lanes, ranks first: which are
    processed ``[G, R]`` and their outcomes ``[G, R]`` (:func:`~mocap_jax.wsc.serving_decode.idle_value`
    for the rest).

    About one boundary per lane is due in a step, and the step has room for ``R``: computing every
    lane's ``R`` would mostly compute boundaries that are not due.  The due ones are packed, every
    lane's earliest before any lane's second, and the first ``capacity`` computed.  A due boundary
    left over waits for the next step, as one past the ``R``-th does: decode boundaries commute and
    do not interact with arrivals, and the prefill event waits for every boundary at or before it.
    """
    G, R = due.do.shape
    n = G * R
    # places in rank-major order (every lane's earliest first), kept in the lanes' [G, R] layout
    place = (jnp.cumsum(due.do.T.reshape(-1), dtype=jnp.int32) - 1).reshape(R, G).T.reshape(-1)
    flat = due.do.reshape(-1)                                                # lane * R + rank
    packed = jnp.full(capacity, n, jnp.int32).at[jnp.where(flat, place, capacity)].set(
        jnp.arange(n, dtype=jnp.int32), mode="drop")                         # n: none
    instance, times = due.instance.reshape(-1), due.times.reshape(-1)

    def boundary(k, valid):
        lane_inp, lane_st = _lane_view(inp, st, k // R)
        return decode_boundary(lane_inp, lane_st, instance[k], times[k], valid, sh)

    out = jax.vmap(boundary)(jnp.minimum(packed, n - 1), packed < n)
    done = flat & (place < capacity)
    at = jnp.where(done, place, 0)

    def spread(name, o):
        mask = done.reshape((n,) + (1,) * (o.ndim - 1))
        o = jnp.where(mask, o[at], jnp.asarray(idle_value(name, sh), o.dtype))
        return o.reshape((G, R) + o.shape[1:])

    out = DecodeOutcome(**{f.name: spread(f.name, getattr(out, f.name)) for f in dataclasses.fields(DecodeOutcome)})
    return done.reshape(G, R), out


def step_batch(inp: ServingInputs, st: ServingState, sh: ServingShape, capacity: int) -> ServingState:
    """:func:`step` of every lane of a batch ``[G]``, computing at most ``capacity`` decode boundaries
    (:func:`_packed_boundaries`; at least ``G``, so that every lane's earliest due boundary is
    processed in every step); with room for every lane's, the plain vmapped step."""
    G = inp.requests.count.shape[0]
    capacity = max(capacity, G)
    if capacity >= G * sh.boundaries:
        return jax.vmap(lambda x, s: step(x, s, sh))(inp, st)
    st, due = jax.vmap(lambda x, s: due_boundaries(x, s, sh))(inp, st)
    do, out = _packed_boundaries(inp, st, due, sh, capacity)
    due = dataclasses.replace(due, do=do)
    return jax.vmap(lambda x, s, d, o: finish_step(x, s, d, o, sh))(inp, st, due, out)


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


# Decode boundaries computed per lane of a batch and step (:func:`step_batch`): about one is due
# per lane and step on the default exploration, a few more now and then (docs/wsc_llm.md, "Performance").
BOUNDARIES_PER_LANE = 1.25


def scan_batch(inp: ServingInputs, st: ServingState, restart, sh: ServingShape, steps: int,
               capacity: int | None = None):
    """``steps`` scan steps of every design point of a batch, the lanes flagged in ``restart [G]``
    starting from the initial state; returns the states and which are finished.  ``capacity``:
    decode boundaries computed per step (:func:`step_batch`; default ``BOUNDARIES_PER_LANE`` per lane)."""
    st = restart_lanes(inp, st, restart, sh)
    if capacity is None:
        capacity = math.ceil(BOUNDARIES_PER_LANE * inp.requests.count.shape[0])
    stepper = partial(step_batch, sh=sh, capacity=capacity)
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


__all__ = ["DueBoundaries", "due_boundaries", "finish_step", "step", "step_batch", "BOUNDARIES_PER_LANE", "finished",
           "restart_lanes", "state_shapes", "scan_batch", "run_batch"]
