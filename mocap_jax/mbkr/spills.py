"""MBKR spill decisions: the one rule, and the two event programs that apply it.

The rule (:func:`decide`), taken when an item starts on stage x with partner y: x needs room for
what it holds (own KV and KV it hosts) plus the new item's workspace (the KV it writes and its
activation buffers).  What would overflow x's KV budget (usable HBM minus weights) is written to
y instead, if y is a creditor (its occupancy in ``[p1, p2)`` of its budget) with room below
``p2`` of its budget and beside its own in-flight workspace; the moved bytes come out of the new
item's KV.  If some of the overflow finds no room the configuration is infeasible.  So a
configuration that fits without MBKR spills nothing ("spill only what cannot stay local");
``Spill.EAGER`` instead also moves whatever of the new KV lies above ``p2`` of x's budget.
Spilled KV stays on its host until its group's release on the debtor.

Events of a stage: item starts (the decision), and group releases; at one instant releases come
first, then starts in stage order, then item order.  :func:`pair_spills` runs the events of each
static pair (all pairs and, under ``vmap``, all configurations at once); :func:`dynamic_spills`
runs every stage's events together and re-matches partners at each start (the i-th most loaded
stage with the i-th least loaded), migrating a debtor's spilled KV when its partner changes.

Shapes: ``E`` timeline items, ``N`` stages, ``G`` timeline group slots, ``L`` pair slots.
Units: bytes, seconds.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from ..costs import pytree
from ..costs.computed_once import computed_once
from ..schedule.prefix import count_sorted
from ..schedule.shape import Spill

Array = Any

#: a stage that a spill or migration touched fits its budget when it exceeds it by at most this
#: fraction: the spilled amount is the exact excess, and rounding may leave the remainder (or a host's
#: fill) a few ulps above the budget.  A stage no spill touched is judged exactly, as without MBKR.
FIT_TOLERANCE = 1e-6
#: dynamic pairing ranks stages by occupancy at this resolution (ties go to the lower stage), so
#: loads equal in exact arithmetic are not ordered by rounding noise
RANK_RESOLUTION = 2.0 ** -20


def decide(local, kv, activation, budget, partner_local, partner_activation, partner_budget, has_partner, p1, p2,
           spill: Spill):
    """The spill rule at an item start on a stage.

    Args:
      local: KV the stage holds (own + hosted), bytes.
      kv, activation: the starting item's KV and activation bytes on the stage.
      budget: the stage's KV budget (usable HBM - weights), bytes.
      partner_local, partner_activation, partner_budget: the same for the partner (its in-flight
        item's activation bytes).
      has_partner: bool, the stage has a partner now.
      p1, p2: role thresholds; spill: :class:`Spill` policy (static).

    Returns:
      ``(moved, overflow)``: bytes of the new KV written to the partner, and whether the stage
      still overflows.
    """
    need = local + kv + activation
    over = jnp.maximum(need - budget, 0.0)
    if spill == Spill.EAGER:
        over = jnp.maximum(over, jnp.minimum(kv, local + kv - p2 * budget))
    creditor = has_partner & (partner_local >= p1 * partner_budget) & (partner_local < p2 * partner_budget)
    room = jnp.minimum(p2 * partner_budget - partner_local, partner_budget - partner_local - partner_activation)
    room = jnp.where(creditor, jnp.maximum(room, 0.0), 0.0)
    moved = jnp.clip(jnp.minimum(over, room), 0.0, kv)
    return moved, need - moved > budget * jnp.where(moved > 0, 1 + FIT_TOLERANCE, 1.0)


@pytree
class Spills:
    """Spill decisions of one configuration.

    Fields:
      moved: ``[E, N]`` bytes of each item's KV written to the stage's partner when it starts.
      host: ``[E, N]`` int stage hosting each item's spilled KV, and the KV its group spilled before
        it (the partner when the item starts; -1 if none).
      migrated: ``[E, N]`` bytes of earlier spills moved to a new partner when the item starts (dynamic).
      migrated_from: ``[E, N]`` int their previous host (-1 if none).
      peak: ``[N]`` largest memory of each stage (weights + KV held or hosted + in-flight workspace), bytes.
      kv_peak: ``[N]`` largest KV each stage holds or hosts (including the KV being written), bytes.
      overflow: bool, some stage overflowed with nowhere to spill.
    """

    moved: Array
    host: Array
    migrated: Array
    migrated_from: Array
    peak: Array
    kv_peak: Array
    overflow: Array


def touched_stages(spills: Spills) -> Array:
    """``[N]`` bool: the stages whose memory a spill or a migration changed (debtors that wrote KV to
    a partner, the stages hosting it, the former hosts of migrated KV): those :data:`FIT_TOLERANCE`
    applies to."""
    stage = jnp.arange(spills.moved.shape[1])
    moved, migrated = spills.moved > 0, spills.migrated > 0

    def named(index, mask):
        return jnp.any((index[..., None] == stage) & mask[..., None], axis=(0, 1))

    return jnp.any(moved, axis=0) | named(spills.host, moved | migrated) | named(spills.migrated_from, migrated)


class Stages(NamedTuple):
    """Per-stage inputs of the spill programs (one configuration).

    Fields: ``start``, ``finish``, ``kv``, ``activation`` ``[E, N]``; ``valid`` ``[E]`` real items;
    ``group`` ``[E]`` timeline group slot of each item; ``release`` ``[G, N]`` release time of
    each group slot (unused slots repeat their predecessor); ``weights``, ``budget`` ``[N]``
    bytes; ``live`` ``[N]`` real stages.
    """

    start: Array
    finish: Array
    kv: Array
    activation: Array
    valid: Array
    group: Array
    release: Array
    weights: Array
    budget: Array
    live: Array


def merge_ranks(lists):
    """Position of every element of several sorted sequences in their merged order.

    ``lists`` are 1-D arrays, each nondecreasing, given in tie order: at equal values an element
    of an earlier list comes first, and within a list the lower index.  The merged order is the
    stable sort of the concatenation by (value, list, index); counting the elements that precede
    each one gives it without sorting (a comparison sort is the slowest operation XLA:CPU runs on
    many small rows).  Returns one ``int32`` array of positions per list.
    """
    ranks = []
    for p, x in enumerate(lists):
        r = jnp.arange(x.shape[0], dtype=jnp.int32)
        for q, y in enumerate(lists):
            if q != p:
                r = r + count_sorted(y, x, side="right" if q < p else "left")
        ranks.append(r)
    return ranks


def _in_flight_activation(times, start, finish, activation, inclusive: bool):
    """Activation bytes of the item a stage is running at each of ``times`` (items sorted by start);
    ``inclusive``: an item starting exactly then already runs (it comes first in the event order)."""
    side = "right" if inclusive else "left"
    j = count_sorted(start, times, side=side) - 1
    jj = jnp.maximum(j, 0)
    running = (j >= 0) & (finish[jj] > times)
    return jnp.where(running, activation[jj], 0.0)


#: a pair's per-group ledgers keep up to this many group slots as separate scalars: under ``vmap`` a
#: trailing axis of a few slots vectorises badly (a static pair's spill decisions at 64 items and two
#: slots took about 25% less time); more slots stay one array, since unrolled scalars would make the
#: scan body, and its compile time, grow with the slots
SCALAR_SLOTS = 4


def _slot_ids(G: int) -> tuple:
    """Slot ids of each part of a ledger of ``G`` group slots: one scalar per slot, or one array."""
    return tuple(jnp.asarray(k) for k in range(G)) if G <= SCALAR_SLOTS else (jnp.arange(G),)


def _total(parts):
    """Sum of a ledger's parts, in slot order."""
    total = parts[0].sum()
    for v in parts[1:]:
        total = total + v.sum()
    return total


def _pair(a, b, ok, st: Stages, p1, p2, spill: Spill):
    """Events of the pair (a, b) (``ok``: b is a's partner; else a alone), processed in order."""
    E = st.start.shape[0]
    G = st.release.shape[0]
    inf = jnp.asarray(jnp.inf, st.start.dtype)
    sides = jnp.stack([a, b])
    okv = jnp.stack([jnp.asarray(True), ok])
    # padded item slots keep their (repeated) start time: they hold no KV and keep the times sorted
    start = jnp.where(okv[:, None], st.start[:, sides].T, inf)                           # [2, E]
    finish = st.finish[:, sides].T
    kv = jnp.where(st.valid[None, :], st.kv[:, sides].T, 0.0)
    act = st.activation[:, sides].T
    release = jnp.where(okv[:, None], st.release[:, sides].T, inf)                       # [2, G]
    budget = jnp.where(okv, st.budget[sides], 1.0)
    weights = st.weights[sides]
    # the counts below compare every element with every other: gathered once, not per compare
    start, finish, kv, act, release = computed_once((start, finish, kv, act, release))

    # processing order: time, then releases before starts, then side a before b, then index; each
    # sequence is sorted (a stage starts its items and releases its groups in order), so counting merges them
    T = 2 * E + 2 * G
    times_id = jnp.concatenate([start.reshape(-1), release.reshape(-1)])
    kind = jnp.concatenate([jnp.ones(2 * E, jnp.int32), jnp.zeros(2 * G, jnp.int32)])
    side = jnp.concatenate([jnp.zeros(E, jnp.int32), jnp.ones(E, jnp.int32), jnp.zeros(G, jnp.int32),
                            jnp.ones(G, jnp.int32)])
    release_a, release_b, start_a, start_b = merge_ranks([release[0], release[1], start[0], start[1]])
    rank = jnp.concatenate([start_a, start_b, release_a, release_b])
    order = jnp.zeros(T, jnp.int32).at[rank].set(jnp.arange(T, dtype=jnp.int32))

    # event attributes by event id, then in processing order
    other_act = jnp.stack([_in_flight_activation(start[0], start[1], finish[1], act[1], inclusive=False),
                           _in_flight_activation(start[1], start[0], finish[0], act[0], inclusive=True)])
    group = jnp.concatenate([st.group, st.group, jnp.arange(G), jnp.arange(G)])
    zeros = jnp.zeros(2 * G, kv.dtype)
    # one gather of stacked rows: XLA:CPU pays per gathered index, not per byte; the rows are stored
    # first (left to XLA, the gather's kernel counts each in-flight activation again per element)
    rows = computed_once(jnp.stack([times_id, jnp.concatenate([kv.reshape(-1), zeros]),
                                    jnp.concatenate([act.reshape(-1), zeros]),
                                    jnp.concatenate([other_act.reshape(-1), zeros])], axis=-1))
    by_order = rows[order]
    ev = (side[order], kind[order] == 1, group[order], by_order[:, 1], by_order[:, 2], by_order[:, 3],
          jnp.isfinite(by_order[:, 0]))
    slot_ids = _slot_ids(G)

    def step(state, e):
        # per side (a, b), ledgers of the group slots (:data:`SCALAR_SLOTS`): its own KV, and the KV it
        # spilled to the other side; then the running peaks and overflow (kept in the carry: reducing
        # stacked per-event values costs more)
        own_a, own_b, spilled_a, spilled_b, peak, kv_peak, overflow = state
        x, starting, g, kv_e, act_e, act_other, real = e
        on_b = x == 1                                          # the event is on side b
        this = lambda va, vb: jnp.where(on_b, vb, va)
        local_a, local_b = _total(own_a) + _total(spilled_b), _total(own_b) + _total(spilled_a)
        moved, over = decide(this(local_a, local_b), kv_e, act_e, this(budget[0], budget[1]),
                             this(local_b, local_a), act_other, this(budget[1], budget[0]), ok, p1, p2, spill)
        moved = jnp.where(starting, moved, 0.0)
        moved, over = computed_once((moved, over))       # read by every ledger, peak and flag update
        # a start adds the item's kept and moved KV to its group on the event's side; a release frees the group
        def keep(mine, parts, add):
            return tuple(jnp.where(mine & (g == k), jnp.where(starting, v + add, 0.0), v)
                         for k, v in zip(slot_ids, parts))
        own_a, own_b = keep(~on_b, own_a, kv_e - moved), keep(on_b, own_b, kv_e - moved)
        spilled_a, spilled_b = keep(~on_b, spilled_a, moved), keep(on_b, spilled_b, moved)
        held = (_total(own_a) + _total(spilled_b), _total(own_b) + _total(spilled_a))
        in_flight = (this(act_e, act_other), this(act_other, act_e))
        peak = tuple(jnp.where(starting, jnp.maximum(p, w + h + f), p)
                     for p, w, h, f in zip(peak, weights, held, in_flight))
        kv_peak = tuple(jnp.where(real, jnp.maximum(p, h), p) for p, h in zip(kv_peak, held))
        # a stage without a partner runs with an absent side b, whose events all lie at infinity: they
        # decide nothing, and cannot overflow
        overflow = overflow | (starting & over & real)
        return (own_a, own_b, spilled_a, spilled_b, peak, kv_peak, overflow), moved

    zero = jnp.zeros((), kv.dtype)
    ledger = tuple(jnp.zeros(k.shape, kv.dtype) for k in slot_ids)
    init = (ledger,) * 4 + ((weights[0], weights[1]), (zero, zero), jnp.zeros((), bool))
    (*_, peak, kv_peak, overflow), moved = lax.scan(step, init, ev)
    peak, kv_peak = jnp.stack(peak), jnp.stack(kv_peak)
    moved_items = moved[rank][: 2 * E].reshape(2, E)           # back from processing order to event ids
    return moved_items, peak, kv_peak, overflow


def pair_spills(st: Stages, partner, num_stages, p1, p2, spill: Spill, slots: int) -> Spills:
    """Spill decisions of static pairs (one configuration; ``vmap`` over configurations).

    Args:
      st: the stages' inputs.
      partner: ``[N]`` int static partner of each stage (-1 none).
      num_stages: live stages (traced).
      slots: static number of leading stages that may lead a pair (``ceil(N_pad / 2)`` covers
        cross-half and head-to-tail pairs, whose leaders are in the first half).
    """
    E, N = st.start.shape
    s = jnp.arange(slots)
    paired = partner[:slots] >= 0
    b = jnp.where(paired, partner[:slots], s)
    active = (s < num_stages) & (~paired | (partner[:slots] > s))
    moved, peak, kv_peak, over = jax.vmap(
        lambda a, bb, ok: _pair(a, bb, ok, st, p1, p2, spill))(s, b, paired)
    lead = jnp.where(active, s, N)
    follow = jnp.where(active & paired, b, N)
    scatter = lambda x, fill: jnp.full((N + 1,) + x.shape[2:], fill, x.dtype).at[lead].set(x[:, 0]) \
        .at[follow].set(x[:, 1])[:N]
    host = jnp.broadcast_to(jnp.where(partner >= 0, partner, -1), (E, N)).astype(jnp.int32)
    return Spills(moved=scatter(moved, 0.0).T, host=host, migrated=jnp.zeros((E, N), st.kv.dtype),
                  migrated_from=jnp.full((E, N), -1, jnp.int32), peak=jnp.where(st.live, scatter(peak, 0.0), 0.0),
                  kv_peak=jnp.where(st.live, scatter(kv_peak, 0.0), 0.0), overflow=jnp.any(over & active))


def dynamic_spills(st: Stages, num_stages, p1, p2, spill: Spill) -> Spills:
    """Spill decisions with partners re-matched at every item start (one configuration).

    At a start on stage a the live stages are ranked by occupancy (``local / budget``); the i-th
    most loaded is matched with the i-th least loaded (the middle one of an odd count with nobody)
    and a's partner becomes its match.  If that changes a's partner while a has spilled KV, all of
    it migrates to the new partner first when the new partner is a creditor with room for it
    (else a keeps its old partner).  Finishes are events too (they end an item's activation).
    """
    E, N = st.start.shape
    G = st.release.shape[0]
    inf = jnp.asarray(jnp.inf, st.start.dtype)
    dt = st.kv.dtype
    live = st.live
    start = jnp.where(live[None, :] & st.valid[:, None], st.start, inf)
    finish = jnp.where(live[None, :] & st.valid[:, None], st.finish, inf)
    release = jnp.where(live[None, :], st.release, inf)
    kind = jnp.concatenate([jnp.zeros((G, N), jnp.int32), jnp.ones((E, N), jnp.int32),
                            jnp.full((E, N), 2, jnp.int32)])              # release, finish, start
    times = jnp.concatenate([release, finish, start])
    stage = jnp.broadcast_to(jnp.arange(N), times.shape)
    index = jnp.broadcast_to(jnp.concatenate([jnp.arange(G), jnp.arange(E), jnp.arange(E)])[:, None], times.shape)
    order = jnp.lexsort((index.reshape(-1), stage.reshape(-1), kind.reshape(-1), times.reshape(-1)))
    ev_kind, ev_stage, ev_index = kind.reshape(-1)[order], stage.reshape(-1)[order], index.reshape(-1)[order]
    ev_time = times.reshape(-1)[order]
    budget = jnp.where(live, st.budget, 1.0)
    gid = jnp.arange(G)
    sidx = jnp.arange(N)

    def hosted(spilled, partner):
        host = (partner[:, None] == sidx[None, :]) & (partner[:, None] >= 0)
        return jnp.sum(jnp.where(host, spilled.sum(1)[:, None], 0.0), axis=0)

    def match(local):
        # a stage without KV budget (weights fill its HBM) is full, whatever it holds; the stable sort
        # puts it before the dead stages, which follow the live ones
        u = jnp.where(live & (budget > 0), jnp.round(local / budget / RANK_RESOLUTION), jnp.inf)
        ranked = jnp.argsort(u)
        pos = jnp.argsort(ranked)
        mate_pos = num_stages - 1 - pos
        mate = ranked[jnp.clip(mate_pos, 0, N - 1)]
        return jnp.where(live & (mate_pos != pos), mate, -1).astype(jnp.int32)

    def step(state, e):
        # [N, G], [N, G], [N], [N]; then the running peaks [N] and overflow (kept in the carry:
        # reducing stacked per-event values costs more)
        own, spilled, partner, running, peak, kv_peak, overflow = state
        k, a, i, tm = e
        starting = k == 2
        item = jnp.minimum(i, E - 1)
        g = jnp.where(starting | (k == 1), st.group[item], i)
        local = own.sum(1) + hosted(spilled, partner)
        old = partner[a]
        mine = spilled[a].sum()
        new = jnp.where(starting, match(local)[a], old)          # -1: the middle stage of an odd count
        new_ok = new >= 0
        room = jnp.minimum(p2 * budget[new] - local[new], budget[new] - local[new] - running[new])
        movable = new_ok & (local[new] >= p1 * budget[new]) & (local[new] < p2 * budget[new]) & (room >= mine)
        change = starting & (mine > 0) & (new != old)
        new = jnp.where(change & ~movable, old, new)
        migrated = jnp.where(change & movable, mine, 0.0)
        partner = partner.at[a].set(jnp.where(starting, new, old))
        local = own.sum(1) + hosted(spilled, partner)
        p = partner[a]
        has = p >= 0
        q = jnp.where(has, p, a)
        kv_e = jnp.where(starting, st.kv[item, a], 0.0)
        act_e = st.activation[item, a]
        moved, over = decide(local[a], kv_e, act_e, budget[a], local[q], running[q], budget[q], has, p1, p2, spill)
        moved = jnp.where(starting, moved, 0.0)
        onehot = gid == g
        releasing = k == 0
        own = own.at[a].set(jnp.where(starting, own[a] + jnp.where(onehot, kv_e - moved, 0.0),
                                      jnp.where(releasing & onehot, 0.0, own[a])))
        spilled = spilled.at[a].set(jnp.where(starting, spilled[a] + jnp.where(onehot, moved, 0.0),
                                              jnp.where(releasing & onehot, 0.0, spilled[a])))
        running = running.at[a].set(jnp.where(starting, act_e, jnp.where(k == 1, 0.0, running[a])))
        held = jnp.where(live, own.sum(1) + hosted(spilled, partner), 0.0)
        peak = jnp.maximum(peak, jnp.where(live, st.weights + held + running, 0.0))
        kv_peak = jnp.where(jnp.isfinite(tm), jnp.maximum(kv_peak, held), kv_peak)
        out = (moved, jnp.where(starting, p, -1), migrated, jnp.where(migrated > 0, old, -1))
        # events at infinity (stages that do not exist, padded items) decide nothing, and cannot overflow
        overflow = overflow | (starting & over & jnp.isfinite(tm))
        return (own, spilled, partner, running, peak, kv_peak, overflow), out

    zeros = jnp.zeros((N, G), dt)
    init = (zeros, zeros, jnp.full((N,), -1, jnp.int32), jnp.zeros((N,), dt), st.weights, jnp.zeros((N,), dt),
            jnp.zeros((), bool))
    (*_, peak, kv_peak, overflow), (moved, host, migrated, migrated_from) = lax.scan(
        step, init, (ev_kind, ev_stage, ev_index, ev_time))
    target = jnp.where(ev_kind == 2, ev_index * N + ev_stage, E * N)
    to_items = lambda v, fill, dtype: jnp.full((E * N + 1,), fill, dtype).at[target].set(v.astype(dtype))[: E * N] \
        .reshape(E, N)
    return Spills(moved=to_items(moved, 0.0, dt), host=to_items(host, -1, jnp.int32),
                  migrated=to_items(migrated, 0.0, dt), migrated_from=to_items(migrated_from, -1, jnp.int32),
                  peak=jnp.where(live, peak, 0.0), kv_peak=jnp.where(live, kv_peak, 0.0), overflow=overflow)
