"""MBKR: memory-balanced KV reallocation (DESIGN §6; docs/semantics.md "MBKR").

Stages are paired; the one under memory pressure (debtor) spills KV to its partner
(creditor) and later chunks of the same requests read it back remotely, while the
creditor spends HBM time serving those reads.  This module holds

* the pairing policies (:func:`partner_of`),
* the spill state machine as array programs: :func:`pair_spills` (static pairings:
  one scan per pair over the merged events of its two stages, all pairs and points
  in parallel) and :func:`dynamic_spills` (dynamic re-matching: one scan over every
  stage's events),
* the costs the spills add to item times (:func:`spill_costs`).

Shapes: ``E`` events-items per stage (``num_batches x K_pad``), ``N`` = ``N_pad`` stages.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .specs import mesh
from .costs import pytree
from .specs import HardwareSpec

Array = Any

PAIRINGS = ("cross-half", "none", "head-to-tail", "dynamic")
STATIC_PAIRING_CODE = {"none": 0, "cross-half": 1, "head-to-tail": 2}
DEFAULT_P1 = 0.0
DEFAULT_P2 = 0.85
DEFAULT_READ_OVERLAP = 0.5
UNROLL = 1   # event scans are not unrolled (unrolling measured slower on CPU)
#: dynamic pairing ranks stages by local / cap at this resolution (ties go to the lower stage index), so
#: loads equal in exact arithmetic are not ordered by rounding noise
RANK_RESOLUTION = 2.0 ** -20


@pytree
class MBKRParams:
    """Traced MBKR numbers of one configuration.

    Fields:
      p1, p2: role thresholds, fractions of a stage's KV budget (0 <= p1 <= p2 <= 1).
      read_overlap: fraction of the debtor's local attention time that hides a remote read.
      pairing: int code of a static pairing (0 none, 1 cross-half, 2 head-to-tail);
        ignored by the dynamic path.
      stage_hops: ``[N_pad, N_pad]`` hops between the dies of two stages.
      stage_bandwidth: ``[N_pad, N_pad]`` effective raw bandwidth (bytes/s) of that
        route, already divided among transfers that share its busiest link.
    """

    p1: Array
    p2: Array
    read_overlap: Array
    pairing: Array
    stage_hops: Array
    stage_bandwidth: Array


def check_thresholds(p1: float, p2: float, read_overlap: float = DEFAULT_READ_OVERLAP) -> None:
    """Raise ``ValueError`` for thresholds outside [0, 1] or p1 > p2."""
    for name, v in (("p1", p1), ("p2", p2), ("read_overlap", read_overlap)):
        if not isinstance(v, (int, float, np.floating)) or isinstance(v, bool) or not 0.0 <= float(v) <= 1.0:
            raise ValueError(f"MBKR threshold {name} must be a fraction in [0, 1], got {v!r}")
    if p1 > p2:
        raise ValueError(f"MBKR thresholds need p1 <= p2 (creditor band below the debtor threshold), got p1={p1}, p2={p2}")


def partner_of(pairing, num_stages, n_pad: int, xp=jnp):
    """Static partner of each stage, ``[N_pad]`` int (-1 = unpaired or padding).

    ``pairing`` is the int code (0 none, 1 cross-half, 2 head-to-tail); ``num_stages``
    may be traced.
    """
    s = xp.arange(n_pad)
    n = num_stages
    h = n // 2
    off = n - h
    cross = xp.where(s < h, s + off, xp.where((s >= off) & (s < n), s - off, -1))
    tail = xp.where((s < n) & (n - 1 - s != s), n - 1 - s, -1)
    return xp.where(pairing == 1, cross, xp.where(pairing == 2, tail, -1)).astype(np.int32)


def pair_routes(hw: HardwareSpec, placement, partner: np.ndarray | None, n_pad: int, dtype=np.float32):
    """Hop and effective-bandwidth matrices between stages, ``[N_pad, N_pad]`` each.

    Links shared by several concurrent transfers share their bandwidth: the
    concurrent set is every pipeline hand-off (s -> s+1) plus every MBKR pair route
    (both directions); a route's effective bandwidth is the minimum over its links
    of ``link_bandwidth / transfers using the link``.  Results are memoised per
    (hardware, placement, partners, N_pad, dtype); callers get fresh copies.
    """
    key_partner = None if partner is None else tuple(int(q) for q in np.asarray(partner))
    hops, bw = _pair_routes_cached(hw, tuple(int(d) for d in np.asarray(placement)), key_partner, int(n_pad),
                                   np.dtype(dtype).str)
    return hops.copy(), bw.copy()


@functools.lru_cache(maxsize=256)
def _pair_routes_cached(hw: HardwareSpec, placement: tuple, partner: tuple | None, n_pad: int, dtype: str):
    placement = np.asarray(placement)
    n = len(placement)
    routes = [(int(placement[s]), int(placement[s + 1])) for s in range(n - 1)]
    if partner is not None:
        for s in range(n):
            q = int(partner[s])
            if 0 <= q < n and q != s:
                routes.append((int(placement[s]), int(placement[q])))
    share: dict = {}
    for a, b in routes:
        for l in mesh.xy_route(hw, a, b):
            share[l] = share.get(l, 0) + 1
    hops = np.zeros((n_pad, n_pad))
    bw = np.ones((n_pad, n_pad))
    hm = mesh.hop_matrix(hw)
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            a, b = int(placement[i]), int(placement[j])
            hops[i, j] = hm[a, b]
            bw[i, j] = min(mesh.link_bandwidth(hw, l) / max(share.get(l, 0), 1) for l in mesh.xy_route(hw, a, b))
    return hops.astype(dtype), bw.astype(dtype)


# --------------------------------------------------------------------------- state machine


def _decide(x, local_a, local_b, cap_a, cap_b, b_ok, p1, p2):
    """Keep / move split of an addition of ``x`` bytes (docs/semantics.md)."""
    keep0 = jnp.clip(p2 * cap_a - local_a, 0.0, x)
    excess = x - keep0
    creditor = b_ok & (local_b >= p1 * cap_b) & (local_b < p2 * cap_b)
    room = jnp.where(creditor, p2 * cap_b - local_b, 0.0)
    moved = jnp.minimum(excess, room)
    return x - moved, moved


def _event_order(times, is_add, stage, index):
    """Processing order: time, releases before adds, stage index, then item / group order.

    For the short event lists of a pair (tens of events) the order is computed by
    counting, for each event, the events that precede it (``O(T^2)`` comparisons,
    which vectorise far better than a sort under ``vmap`` on CPU); long lists sort.
    """
    T = times.shape[0]
    kind = is_add.astype(jnp.int32)
    if T > 512:
        return jnp.lexsort((index, stage, kind, times))
    ti, tj = times[:, None], times[None, :]
    ki, kj = kind[:, None], kind[None, :]
    si, sj = stage[:, None], stage[None, :]
    ii, ij = index[:, None], index[None, :]
    before = (tj < ti) | ((tj == ti) & ((kj < ki) | ((kj == ki) & ((sj < si) | ((sj == si) & (ij < ii))))))
    rank = jnp.sum(before, axis=1)
    return jnp.zeros(T, jnp.int32).at[rank].set(jnp.arange(T, dtype=jnp.int32))


def _holds(finish, group_release, item_group):
    """``[E, N]``: the item's KV outlives its addition (released strictly later)."""
    return group_release[item_group] > finish


def pair_spills(finish, group_release, kv, item_group, cap, partner, p1, p2, num_stages, slots: int | None = None):
    """Spill decisions of static pairings: one merged event scan per pair, group-level state.

    Args:
      finish: ``[E, N]`` time each item adds its KV on each stage.
      group_release: ``[G, N]`` time each request group's KV is freed on each stage.
      kv: ``[E, N]`` bytes each item adds.
      item_group: ``[E]`` int group of each item (items of a group are freed together).
      cap: ``[N]`` KV budget per stage (bytes).
      partner: ``[N]`` int static partner (-1 none).
      p1, p2: role thresholds; num_stages: traced N.
      slots: static number of leading stages that can lead a pair (default all; ``ceil(N_pad / 2)``
        suffices for cross-half and head-to-tail pairings, whose leaders are the first half).

    Returns:
      dict with ``moved`` [E, N] bytes spilled at each addition, ``partner_at_add`` [E, N],
      ``migrate_bytes`` / ``migrate_from`` [E, N] (no migration with static pairs),
      ``peak`` [N] peak local bytes (own + hosted), ``overflow`` (some stage exceeded its
      budget), and per-slot event series ``event_time`` [N, T], ``event_local`` [N, T]
      (slot = stage s paired with a later stage or unpaired; its first side),
      ``event_local_partner`` [N, T] and ``slot_active`` [N].
    """
    E, N = finish.shape
    G = group_release.shape[0]
    dt = kv.dtype
    inf = jnp.asarray(jnp.inf, dt)
    holds = _holds(finish, group_release, item_group)
    L = N if slots is None else slots
    s_idx = jnp.arange(L)
    b_idx = jnp.where(partner[:L] >= 0, partner[:L], s_idx)
    b_ok = partner[:L] >= 0
    active = (s_idx < num_stages) & (~b_ok | (partner[:L] > s_idx))
    gid = jnp.arange(G)

    def slot(a, b, ok):
        sides = jnp.stack([a, b])
        okv = jnp.stack([True, ok])
        t_add = jnp.where(okv[:, None], finish[:, sides].T, inf)                         # [2, E]
        t_rel = jnp.where(okv[:, None], group_release[:, sides].T, inf)                  # [2, G]
        x = jnp.where(okv[:, None] & holds[:, sides].T, kv[:, sides].T, 0.0)             # [2, E]
        times = jnp.concatenate([t_rel, t_add], axis=1).reshape(-1)                      # [2 (G+E)]
        is_add = jnp.concatenate([jnp.zeros((2, G), bool), jnp.ones((2, E), bool)], axis=1).reshape(-1)
        side = jnp.repeat(jnp.arange(2), G + E)
        index = jnp.tile(jnp.concatenate([gid, jnp.arange(E)]), 2)
        stage = jnp.where(side == 0, a, jnp.where(ok, b, N))
        order = _event_order(times, is_add, stage, index)
        caps = jnp.stack([cap[a], jnp.where(ok, cap[b], 1.0)])

        # everything an event needs, gathered once in processing order
        ev_side, ev_index, ev_add, ev_time = side[order], index[order], is_add[order], times[order]
        ev_item = jnp.minimum(ev_index, E - 1)
        ev_group = jnp.where(ev_add, item_group[ev_item], ev_index)
        ev_x = jnp.where(ev_add, x[ev_side, ev_item], 0.0)

        def step(state, ev):
            own, spill = state                                                           # [2, G] each
            sd, g, add, xv = ev
            onehot = gid == g
            local = own.sum(1) + spill[::-1].sum(1)
            keep, moved = _decide(xv, local[sd], local[1 - sd], caps[sd], caps[1 - sd], ok, p1, p2)
            own_sd = jnp.where(add, own[sd] + jnp.where(onehot, keep, 0.0), jnp.where(onehot, 0.0, own[sd]))
            spill_sd = jnp.where(add, spill[sd] + jnp.where(onehot, moved, 0.0), jnp.where(onehot, 0.0, spill[sd]))
            this = (jnp.arange(2) == sd)[:, None]
            own = jnp.where(this, own_sd[None], own)
            spill = jnp.where(this, spill_sd[None], spill)
            local = own.sum(1) + spill[::-1].sum(1)
            return (own, spill), (moved, local)

        zeros = jnp.zeros((2, G), dt)
        ev = (ev_side, ev_index, ev_add, ev_time)
        _, (moved_ev, local_ev) = lax.scan(step, (zeros, zeros), (ev_side, ev_group, ev_add, ev_x),
                                           unroll=UNROLL if len(ev_time) <= 4 * UNROLL else 1)
        live = jnp.isfinite(ev[3])
        peak = jnp.max(jnp.where(live[:, None], local_ev, 0.0), axis=0)
        over = jnp.any(live[:, None] & (local_ev > caps[None, :] * (1 + 1e-6)))
        # moved of each addition back to (side, item)
        tgt = jnp.where(ev[2], ev[0] * E + ev[1], 2 * E)
        moved_rec = jnp.zeros((2 * E + 1,), dt).at[tgt].add(moved_ev)[: 2 * E].reshape(2, E)
        return moved_rec, peak, over, ev[3], local_ev

    moved_rec, peak, over, ev_t, ev_local = jax.vmap(slot)(s_idx, b_idx, b_ok)
    tgt_a = jnp.where(active, s_idx, N)
    tgt_b = jnp.where(active & b_ok, b_idx, N)
    moved = jnp.zeros((N + 1, E), dt).at[tgt_a].set(moved_rec[:, 0]).at[tgt_b].set(moved_rec[:, 1])[:N].T
    pk = jnp.zeros((N + 1,), dt).at[tgt_a].set(peak[:, 0]).at[tgt_b].set(peak[:, 1])[:N]
    overflow = jnp.any(over & active)
    pad = lambda x, fill: jnp.concatenate([x, jnp.full((N - L,) + x.shape[1:], fill, x.dtype)]) if L < N else x
    return dict(moved=moved, partner_at_add=jnp.broadcast_to(partner, (E, N)), migrate_bytes=jnp.zeros((E, N), dt),
                migrate_from=jnp.broadcast_to(partner, (E, N)), peak=pk, overflow=overflow,
                event_time=pad(ev_t, jnp.inf), event_local=pad(ev_local[:, :, 0], 0.0),
                event_local_partner=pad(ev_local[:, :, 1], 0.0), slot_active=pad(active, False))


def dynamic_spills(finish, group_release, kv, item_group, cap, p1, p2, num_stages):
    """Spill decisions with dynamic re-matching: one scan over every stage's events.

    At each addition on stage a, live stages are matched most-loaded with
    least-loaded (by ``local / cap``) and a's partner becomes its match.  If a's
    partner changes while a has spilled KV, that KV migrates to the new partner.

    Returns the keys of :func:`pair_spills`, with ``event_time`` [T] and
    ``event_local`` [T, N] (every stage's occupancy after each event).
    """
    E, N = finish.shape
    G = group_release.shape[0]
    dt = kv.dtype
    inf = jnp.asarray(jnp.inf, dt)
    live_stage = jnp.arange(N) < num_stages
    holds = _holds(finish, group_release, item_group)
    x_all = jnp.where(holds & live_stage, kv, 0.0)
    t_add = jnp.where(live_stage, finish, inf)                                        # [E, N]
    t_rel = jnp.where(live_stage, group_release, inf)                                 # [G, N]
    times = jnp.concatenate([t_rel, t_add], axis=0).T.reshape(-1)                     # [N (G+E)]
    is_add = jnp.tile(jnp.concatenate([jnp.zeros(G, bool), jnp.ones(E, bool)]), N)
    stage = jnp.repeat(jnp.arange(N), G + E)
    index = jnp.tile(jnp.concatenate([jnp.arange(G), jnp.arange(E)]), N)
    order = _event_order(times, is_add, stage, index)
    capv = jnp.where(live_stage, cap, 1.0)
    gid = jnp.arange(G)
    sidx = jnp.arange(N)

    def hosted_of(spill, partner):
        host = (partner[:, None] == sidx[None, :]) & (partner[:, None] >= 0)         # [a, x]
        return jnp.sum(jnp.where(host, spill.sum(1)[:, None], 0.0), axis=0)

    def match(local):
        u = jnp.where(live_stage, jnp.round(local / capv / RANK_RESOLUTION), jnp.inf)
        rank_order = jnp.argsort(u)
        pos = jnp.argsort(rank_order)
        mate_pos = num_stages - 1 - pos
        mate = rank_order[jnp.clip(mate_pos, 0, N - 1)]
        return jnp.where(live_stage & (mate_pos != pos), mate, -1).astype(jnp.int32)

    def step(state, ev):
        own, spill, partner = state                                                   # [N, G], [N, G], [N]
        a, idx, add, tm = ev
        i = jnp.minimum(idx, E - 1)
        g = jnp.where(add, item_group[i], idx)
        onehot = gid == g
        local = own.sum(1) + hosted_of(spill, partner)
        old_p = partner[a]
        new_p = jnp.where(add, match(local)[a], old_p)
        has_spill = spill[a].sum() > 0
        new_p = jnp.where(has_spill & (new_p < 0), old_p, new_p)                     # spilled KV stays put
        mig = jnp.where(add & has_spill & (new_p != old_p), spill[a].sum(), 0.0)
        partner = partner.at[a].set(new_p)
        local = own.sum(1) + hosted_of(spill, partner)
        b_ok = new_p >= 0
        bs = jnp.where(b_ok, new_p, a)
        xv = jnp.where(add, x_all[i, a], 0.0)
        keep, moved = _decide(xv, local[a], local[bs], capv[a], capv[bs], b_ok, p1, p2)
        own_a = jnp.where(add, own[a] + jnp.where(onehot, keep, 0.0), jnp.where(onehot, 0.0, own[a]))
        spill_a = jnp.where(add, spill[a] + jnp.where(onehot, moved, 0.0), jnp.where(onehot, 0.0, spill[a]))
        own = own.at[a].set(own_a)
        spill = spill.at[a].set(spill_a)
        local = jnp.where(live_stage, own.sum(1) + hosted_of(spill, partner), 0.0)
        return (own, spill, partner), (moved, new_p, mig, old_p, local)

    zeros = jnp.zeros((N, G), dt)
    init = (zeros, zeros, jnp.full((N,), -1, jnp.int32))
    ev = (stage[order], index[order], is_add[order], times[order])
    _, (moved_ev, part_ev, mig_ev, from_ev, local_ev) = lax.scan(step, init, ev)
    live = jnp.isfinite(ev[3])
    tgt = jnp.where(ev[2] & live, ev[1] * N + ev[0], E * N)
    rec = lambda vals, fill, dtype: jnp.full((E * N + 1,), fill, dtype).at[tgt].set(vals.astype(dtype))[: E * N].reshape(E, N)
    moved = jnp.zeros((E * N + 1,), dt).at[tgt].add(moved_ev)[: E * N].reshape(E, N)
    peak = jnp.max(jnp.where(live[:, None], local_ev, 0.0), axis=0)
    overflow = jnp.any(live[:, None] & (local_ev > capv[None, :] * (1 + 1e-6)))
    return dict(moved=moved, partner_at_add=rec(part_ev, -1, jnp.int32), migrate_bytes=rec(mig_ev, 0.0, dt),
                migrate_from=rec(from_ev, -1, jnp.int32), peak=jnp.where(live_stage, peak, 0.0), overflow=overflow,
                event_time=ev[3], event_local=local_ev)


# --------------------------------------------------------------------------- costs


def spill_costs(spills: dict, attention: Array, same_group_before: Array, mb: MBKRParams, link_latency_s,
                eff_link, hbm_bandwidth, eff_hbm, num_batches: int, finish=None, start=None):
    """Extra seconds MBKR adds to each item on each stage, ``[nb, K, N]``.

    Args:
      spills: output of :func:`pair_spills` / :func:`dynamic_spills` (``E = nb x K``).
      attention: ``[K, N]`` local attention seconds of each item (read overlap).
      same_group_before: ``[K, K]`` bool, item q is before item k in k's group.

    Returns:
      dict with ``extra`` [nb, K, N] (write + unhidden read + migration on the debtor,
      blocking on the creditor), and the parts ``write``, ``read``, ``block``,
      ``migrate`` [nb, K, N] and ``read_bytes`` [nb, K, N].
    """
    moved = spills["moved"]
    E, N = moved.shape
    K = E // num_batches
    moved_b = moved.reshape(num_batches, K, N)
    partner_b = spills["partner_at_add"].reshape(num_batches, K, N)
    s = jnp.arange(N)
    # KV of the group spilled before item k (read by item k), and where it lives:
    read_bytes = jnp.einsum("kq,jqn->jkn", same_group_before.astype(moved.dtype), moved_b)
    prev_partner = jnp.concatenate([partner_b[:, :1], partner_b[:, :-1]], axis=1)
    p_read = jnp.where(prev_partner >= 0, prev_partner, s)
    p_write = jnp.where(partner_b >= 0, partner_b, s)
    hops_r = mb.stage_hops[s, p_read]
    bw_r = mb.stage_bandwidth[s, p_read]
    hops_w = mb.stage_hops[s, p_write]
    bw_w = mb.stage_bandwidth[s, p_write]
    read = jnp.where(read_bytes > 0, hops_r * link_latency_s + read_bytes / (bw_r * eff_link), 0.0)
    hidden = mb.read_overlap * attention[None]
    read_extra = jnp.maximum(read - hidden, 0.0)
    write = jnp.where(moved_b > 0, hops_w * link_latency_s + moved_b / (bw_w * eff_link), 0.0)
    mig_bytes = spills["migrate_bytes"].reshape(num_batches, K, N)
    mig_from = spills["migrate_from"].reshape(num_batches, K, N)
    m_from = jnp.where(mig_from >= 0, mig_from, s)
    hops_m = mb.stage_hops[m_from, p_write]
    bw_m = mb.stage_bandwidth[m_from, p_write]
    migrate = jnp.where(mig_bytes > 0, hops_m * link_latency_s + mig_bytes / (bw_m * eff_link), 0.0)
    serve = read_bytes / (hbm_bandwidth * eff_hbm)
    tgt = jnp.where((read_bytes > 0) & (prev_partner >= 0), prev_partner, N)
    if finish is None:
        # charge each read's serving time to the creditor's item with the same index
        block = jnp.zeros((num_batches, K, N + 1), moved.dtype)
        jj = jnp.broadcast_to(jnp.arange(num_batches)[:, None, None], tgt.shape)
        kk = jnp.broadcast_to(jnp.arange(K)[None, :, None], tgt.shape)
        block = block.at[jj, kk, tgt].add(serve)[..., :N]
    else:
        # charge it to the creditor's item in progress when the debtor's item starts (on the
        # given timeline ``finish`` / ``start`` [nb, K, N]); an idle creditor is busy serving
        # from then on, which delays its next item only by what overlaps that item's start
        fin = finish.reshape(E, N)
        sta = start.reshape(E, N)
        host = jnp.where(tgt < N, tgt, 0)
        done = jnp.sum(fin.T[host] <= start[..., None], axis=-1)           # creditor items finished by then
        slot = jnp.minimum(done, E - 1)
        next_start = sta[slot, host]
        charge = jnp.where(next_start <= start, serve, jnp.clip(start + serve - next_start, 0.0, serve))
        block = jnp.zeros((E, N + 1), moved.dtype).at[slot.reshape(-1), tgt.reshape(-1)].add(
            charge.reshape(-1))[:, :N].reshape(num_batches, K, N)
    return dict(extra=write + read_extra + migrate + block, write=write, read=read, read_extra=read_extra,
                block=block, migrate=migrate, read_bytes=read_bytes)
