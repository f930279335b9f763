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

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import mesh
from .costs import _pytree
from .specs import HardwareSpec

Array = Any

PAIRINGS = ("cross-half", "none", "head-to-tail", "dynamic")
STATIC_PAIRING_CODE = {"none": 0, "cross-half": 1, "head-to-tail": 2}
DEFAULT_P1 = 0.0
DEFAULT_P2 = 0.85
DEFAULT_READ_OVERLAP = 0.5


@_pytree
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
    of ``link_bandwidth / transfers using the link``.
    """
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


def _event_order(times, is_add, stage, item):
    """Processing order: time, releases before adds, stage index, item order."""
    return jnp.lexsort((item, stage, is_add.astype(jnp.int32), times))


def pair_spills(finish, release, kv, cap, partner, p1, p2, num_stages):
    """Spill decisions of static pairings (one merged event scan per pair).

    Args:
      finish, release, kv: ``[E, N]`` add time, release time and bytes of each item on each stage.
      cap: ``[N]`` KV budget per stage (bytes).
      partner: ``[N]`` int partner (-1 none).
      p1, p2: thresholds.
      num_stages: traced N.

    Returns:
      dict with ``moved`` [E, N] bytes spilled at each addition, ``partner_at_add`` [E, N],
      ``migrate_bytes`` [E, N] (zeros), ``peak`` [N] peak local bytes, ``overflow`` bool,
      ``event_time`` [N, 4E] and ``event_local`` [N, 4E] (occupancy of each slot's
      first stage after each of its events; rows are slots = stages) and
      ``event_local_partner`` [N, 4E].
    """
    E, N = finish.shape
    dt = kv.dtype
    s_idx = jnp.arange(N)
    b_idx = jnp.where(partner >= 0, partner, 0)
    b_ok = partner >= 0
    active = (s_idx < num_stages) & (~b_ok | (partner > s_idx))

    def slot(a, b, ok):
        bsafe = jnp.where(ok, b, a)
        inf = jnp.asarray(jnp.inf, dt)
        t_add = jnp.stack([finish[:, a], jnp.where(ok, finish[:, bsafe], inf)])       # [2, E]
        t_rel = jnp.stack([release[:, a], jnp.where(ok, release[:, bsafe], inf)])
        # an item released at (or before) its own addition never holds KV
        x = jnp.stack([jnp.where(release[:, a] > finish[:, a], kv[:, a], 0.0),
                       jnp.where(ok & (release[:, bsafe] > finish[:, bsafe]), kv[:, bsafe], 0.0)])
        times = jnp.concatenate([t_rel, t_add], axis=1).reshape(-1)                    # [4E]
        is_add = jnp.concatenate([jnp.zeros((2, E), bool), jnp.ones((2, E), bool)], axis=1).reshape(-1)
        side = jnp.broadcast_to(jnp.arange(2)[:, None], (2, 2 * E)).reshape(-1)
        item = jnp.broadcast_to(jnp.concatenate([jnp.arange(E), jnp.arange(E)])[None, :], (2, 2 * E)).reshape(-1)
        stage = jnp.where(side == 0, a, jnp.where(ok, bsafe, N))
        order = _event_order(times, is_add, stage, item)
        caps = jnp.stack([cap[a], jnp.where(ok, cap[bsafe], 1.0)])

        def step(state, ev):
            own, spill, tot_own, tot_spill, peak, over, moved_rec = state
            sd, it, add, tm = ev
            other = 1 - sd
            local = tot_own + tot_spill[::-1]                                          # [2]
            xv = jnp.where(add, x[sd, it], 0.0)
            keep, moved = _decide(xv, local[sd], local[other], caps[sd], caps[other], ok, p1, p2)
            # release frees the item's own and spilled bytes
            rel_own = jnp.where(add, 0.0, own[sd, it])
            rel_spill = jnp.where(add, 0.0, spill[sd, it])
            own = own.at[sd, it].set(jnp.where(add, keep, 0.0))
            spill = spill.at[sd, it].set(jnp.where(add, moved, 0.0))
            tot_own = tot_own.at[sd].add(jnp.where(add, keep, -rel_own))
            tot_spill = tot_spill.at[sd].add(jnp.where(add, moved, -rel_spill))
            local = tot_own + tot_spill[::-1]
            live = jnp.isfinite(tm)
            over = over | (live & (local[sd] > caps[sd] * (1 + 1e-6)))
            peak = jnp.where(live, jnp.maximum(peak, local), peak)
            moved_rec = moved_rec.at[sd, it].add(jnp.where(add, moved, 0.0))
            return (own, spill, tot_own, tot_spill, peak, over, moved_rec), (tm, local)

        z2e = jnp.zeros((2, E), dt)
        z2 = jnp.zeros((2,), dt)
        init = (z2e, z2e, z2, z2, z2, jnp.zeros((), bool), z2e)
        evs = (side[order], item[order], is_add[order], times[order])
        (_, _, _, _, peak, over, moved_rec), (ev_t, ev_local) = lax.scan(step, init, evs)
        return moved_rec, peak, over, ev_t, ev_local

    moved_rec, peak, over, ev_t, ev_local = jax.vmap(slot)(s_idx, b_idx, b_ok)
    # scatter slot results back to stages (inactive slots dropped)
    tgt_a = jnp.where(active, s_idx, N)
    tgt_b = jnp.where(active & b_ok, b_idx, N)
    moved = jnp.zeros((N + 1, E), dt).at[tgt_a].set(moved_rec[:, 0]).at[tgt_b].set(moved_rec[:, 1])[:N].T
    pk = jnp.zeros((N + 1,), dt).at[tgt_a].set(peak[:, 0]).at[tgt_b].set(peak[:, 1])[:N]
    overflow = jnp.any(over & active)
    return dict(moved=moved, partner_at_add=jnp.broadcast_to(partner, (E, N)), migrate_bytes=jnp.zeros((E, N), dt),
                migrate_from=jnp.broadcast_to(partner, (E, N)), peak=pk, overflow=overflow, event_time=ev_t,
                event_local=ev_local[:, :, 0], event_local_partner=ev_local[:, :, 1], slot_active=active)


def dynamic_spills(finish, release, kv, cap, p1, p2, num_stages):
    """Spill decisions with dynamic re-matching (one scan over every stage's events).

    At each addition on stage a, stages are matched most-loaded with least-loaded
    (by ``local / cap``); a's partner becomes its match.  If a's partner changes while
    a has spilled KV, that KV migrates to the new partner.

    Returns the same keys as :func:`pair_spills` with ``event_time`` [2EN] and
    ``event_local`` [2EN, N] (every stage's occupancy after each event).
    """
    E, N = finish.shape
    dt = kv.dtype
    live_stage = jnp.arange(N) < num_stages
    inf = jnp.asarray(jnp.inf, dt)
    t_add = jnp.where(live_stage, finish, inf)
    t_rel = jnp.where(live_stage, release, inf)
    times = jnp.concatenate([t_rel, t_add], axis=0).reshape(-1)                        # [2E*N]
    is_add = jnp.concatenate([jnp.zeros((E, N), bool), jnp.ones((E, N), bool)], axis=0).reshape(-1)
    stage = jnp.broadcast_to(jnp.arange(N)[None, :], (2 * E, N)).reshape(-1)
    item = jnp.broadcast_to(jnp.concatenate([jnp.arange(E), jnp.arange(E)])[:, None], (2 * E, N)).reshape(-1)
    order = _event_order(times, is_add, stage, item)
    capv = jnp.where(live_stage, cap, 1.0)

    def match(local):
        u = jnp.where(live_stage, local / capv, jnp.inf)
        rank_order = jnp.argsort(u)                     # ascending load, live stages first
        n = num_stages
        pos = jnp.argsort(rank_order)                   # rank of each stage
        mate_pos = n - 1 - pos
        mate = rank_order[jnp.clip(mate_pos, 0, N - 1)]
        return jnp.where(live_stage & (mate_pos != pos), mate, -1)

    def step(state, ev):
        own, spill, tot_own, tot_spill, partner, peak, over, moved_rec, part_rec, mig_rec, mig_from = state
        a, it, add, tm = ev
        hosted = jnp.zeros((N,), dt).at[jnp.where(partner >= 0, partner, N)].add(tot_spill, mode="drop")
        local = tot_own + hosted
        # re-match on additions; migrate a's spilled KV if its partner changes
        new_p = jnp.where(add, match(local)[a], partner[a])
        old_p = partner[a]
        migrate = add & (new_p != old_p) & (tot_spill[a] > 0)
        mig_bytes = jnp.where(migrate, tot_spill[a], 0.0)
        # if the new partner is -1, a's spilled KV stays where it is
        new_p = jnp.where(migrate & (new_p < 0), old_p, new_p)
        mig_bytes = jnp.where(new_p == old_p, 0.0, mig_bytes)
        new_p = new_p.astype(partner.dtype)
        partner = partner.at[a].set(new_p)
        hosted = jnp.zeros((N,), dt).at[jnp.where(partner >= 0, partner, N)].add(tot_spill, mode="drop")
        local = tot_own + hosted
        b = new_p
        b_ok = b >= 0
        bs = jnp.where(b_ok, b, a)
        holds = release[it, a] > finish[it, a]   # an item released at its own addition never holds KV
        xv = jnp.where(add & holds, kv[it, a], 0.0)
        keep, moved = _decide(xv, local[a], local[bs], capv[a], capv[bs], b_ok, p1, p2)
        rel_own = jnp.where(add, 0.0, own[it, a])
        rel_spill = jnp.where(add, 0.0, spill[it, a])
        own = own.at[it, a].set(jnp.where(add, keep, 0.0))
        spill = spill.at[it, a].set(jnp.where(add, moved, 0.0))
        tot_own = tot_own.at[a].add(jnp.where(add, keep, -rel_own))
        tot_spill = tot_spill.at[a].add(jnp.where(add, moved, -rel_spill))
        hosted = jnp.zeros((N,), dt).at[jnp.where(partner >= 0, partner, N)].add(tot_spill, mode="drop")
        local = tot_own + hosted
        live = jnp.isfinite(tm)
        over = over | (live & jnp.any(local > capv * (1 + 1e-6)))
        peak = jnp.where(live, jnp.maximum(peak, local), peak)
        moved_rec = moved_rec.at[it, a].add(jnp.where(add, moved, 0.0))
        part_rec = part_rec.at[it, a].set(jnp.where(add, partner[a], part_rec[it, a]).astype(part_rec.dtype))
        mig_rec = mig_rec.at[it, a].add(mig_bytes)
        mig_from = mig_from.at[it, a].set(jnp.where(mig_bytes > 0, old_p, mig_from[it, a]).astype(mig_from.dtype))
        state = (own, spill, tot_own, tot_spill, partner, peak, over, moved_rec, part_rec, mig_rec, mig_from)
        return state, (tm, jnp.where(live_stage, local, 0.0))

    zen = jnp.zeros((E, N), dt)
    zn = jnp.zeros((N,), dt)
    m1 = jnp.full((E, N), -1, jnp.int32)
    init = (zen, zen, zn, zn, jnp.full((N,), -1, jnp.int32), zn, jnp.zeros((), bool), zen, m1, zen, m1)
    evs = (stage[order], item[order], is_add[order], times[order])
    final, (ev_t, ev_local) = lax.scan(step, init, evs)
    _, _, _, _, _, peak, over, moved_rec, part_rec, mig_rec, mig_from = final
    return dict(moved=moved_rec, partner_at_add=part_rec, migrate_bytes=mig_rec, migrate_from=mig_from,
                peak=jnp.where(live_stage, peak, 0.0), overflow=over, event_time=ev_t, event_local=ev_local)


# --------------------------------------------------------------------------- costs


def spill_costs(spills: dict, attention: Array, same_group_before: Array, mb: MBKRParams, link_latency_s,
                eff_link, hbm_bandwidth, eff_hbm, num_batches: int):
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
    # charge each read's serving time to the creditor's item with the same index
    block = jnp.zeros((num_batches, K, N + 1), moved.dtype)
    tgt = jnp.where((read_bytes > 0) & (prev_partner >= 0), prev_partner, N)
    jj = jnp.broadcast_to(jnp.arange(num_batches)[:, None, None], tgt.shape)
    kk = jnp.broadcast_to(jnp.arange(K)[None, :, None], tgt.shape)
    block = block.at[jj, kk, tgt].add(serve)[..., :N]
    return dict(extra=write + read_extra + migrate + block, write=write, read=read, read_extra=read_extra,
                block=block, migrate=migrate, read_bytes=read_bytes)
