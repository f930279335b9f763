"""KV memory scheduler across the wafer's DRAM (DESIGN §10).

When a request finishes prefill, its KV cache must be stored somewhere until its
decode instance has generated the last token.  The WSC-LLM *memory scheduler*
places it greedily:

1. candidate dies by **location priority** for the request's (prefill instance p,
   decode instance q) pair (:func:`priority_table`):

   * 0 -- dies of the decode instance q (read locally while decoding);
   * 1 -- dies on a shortest path between p and q (inside the bounding box of the
     two centre dies), the prefill instance's own dies included;
   * 2 -- dies next to those paths (one hop outside the box);
   * 3 -- not allowed;

2. within a priority level, dies with **more free capacity** first;
3. fill dies in that order until the request's KV is placed (it may be split);
4. if the allowed dies together cannot hold it, the request is not placed and its
   prefill instance **pauses** (head-of-line: later requests of that instance wait
   behind it) until decode completions free memory.

Comparisons: ``local`` (only priority 0: KV stays on the decode instance, Splitwise
style) and an ``optimal`` allocation of a snapshot of resident requests (a linear
program, :func:`optimal_allocation`, solved with ``scipy.optimize.linprog``) that
first places as many bytes as possible anywhere on the wafer and then minimises the
decode read traffic ``sum bytes x hops(die, decode instance)`` ("KV hop-bytes").

Free capacity per die = usable DRAM - resident weights - iteration workspace, and on
prefill dies also the KV of one longest prompt in flight (:func:`die_budget`).

Everything is in bytes and seconds.  :func:`greedy_allocate` is written against an
array namespace (``numpy`` or ``jax.numpy``) and :func:`greedy_schedule` is a jitted
``lax.scan``, so a batched serving simulation can call the same rule on traced state.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..specs import ModelSpec, SpecError
from . import perf
from .hardware import WaferParams, WaferSpec, hop_matrix
from .placement import Layout

Array = Any
NOT_ALLOWED = 3
POLICIES = ("greedy", "local")


# --------------------------------------------------------------------------- capacities and priorities


@dataclass
class DieBudget:
    """Per-die DRAM budget ``[D]`` (bytes)."""

    capacity: np.ndarray     # physical DRAM
    usable: np.ndarray       # usable share
    resident: np.ndarray     # weights + workspace + prefill in-flight KV reserve
    free: np.ndarray         # usable - resident (>= 0), what the scheduler may fill with KV
    instance: np.ndarray     # instance index in layout.instances, -1 for idle dies


def die_budget(model: ModelSpec, wafer: WaferSpec, layout: Layout, prefill: perf.InstanceConfig,
               decode: perf.InstanceConfig, chunk_tokens: int = 2048, max_batch: int = 512,
               reserve_prompt_tokens: float = 0.0) -> DieBudget:
    """DRAM budget of every die given the instances placed on it.

    Args:
      prefill, decode: instance configs (shape up to rotation, and TP strategy) of the layout's instances.
      chunk_tokens, max_batch: iteration sizes for the activation workspace.
      reserve_prompt_tokens: prompt tokens of in-flight prefill KV each prefill instance keeps (e.g. the
        workload's longest prompt).

    Raises:
      SpecError: an instance's weights do not fit its dies.
    """
    mp = perf.model_params(model, jnp.float64 if jax.config.jax_enable_x64 else jnp.float32)
    hw = WaferParams.from_spec(wafer, np.float64)
    d = wafer.num_dies
    usable = np.full(d, wafer.dram_capacity * wafer.usable_dram_fraction)
    resident = np.zeros(d)
    occ = layout.occupancy().ravel()
    for kind, cfg, tokens, reserve in (("prefill", prefill, chunk_tokens, reserve_prompt_tokens),
                                       ("decode", decode, max_batch, 0.0)):
        plan = perf.tp_plan(model, wafer, cfg, np.float64)
        need = float(perf.weight_bytes_per_die(mp, hw, plan)) + float(perf.workspace_bytes(mp, hw, float(tokens))) \
            + reserve * float(perf.kv_bytes_per_token_per_die(mp, hw, plan))
        if need > usable[0]:
            raise SpecError(f"{kind} instance {cfg.label} needs {need / 1e9:.1f} GB per die but {wafer.name} dies have "
                            f"{usable[0] / 1e9:.1f} GB usable; use larger instances or dies with more DRAM")
        for i, inst in enumerate(layout.instances):
            if inst.kind != kind:
                continue
            if {inst.rows, inst.cols} != {cfg.rows, cfg.cols} or inst.rows * inst.cols != cfg.dies:
                raise SpecError(f"layout {kind} instance {inst.rows}x{inst.cols} does not match config {cfg.label}")
            resident[occ == i] = need
    return DieBudget(capacity=np.full(d, float(wafer.dram_capacity)), usable=usable, resident=resident,
                     free=np.maximum(usable - resident, 0.0), instance=occ.copy())


def priority_table(wafer: WaferSpec, layout: Layout, policy: str = "greedy") -> np.ndarray:
    """Location priority ``[P, Q, D]`` (0..2, 3 = not allowed) of every die for each (prefill, decode) pair."""
    if policy not in POLICIES:
        raise SpecError(f"unknown memory policy {policy!r}; choose from {', '.join(POLICIES)}")
    pre, dec = layout.prefill, layout.decode
    rows, cols = wafer.rows, wafer.cols
    rr, cc = np.divmod(np.arange(wafer.num_dies), cols)
    table = np.full((len(pre), len(dec), wafer.num_dies), NOT_ALLOWED, dtype=np.int32)
    for q, dq in enumerate(dec):
        in_q = np.zeros(wafer.num_dies, bool)
        for r, c in dq.cells():
            in_q[r * cols + c] = True
        for p, dp in enumerate(pre):
            t = table[p, q]
            if policy == "greedy":
                (r0, c0), (r1, c1) = dp.centre, dq.centre
                lo_r, hi_r, lo_c, hi_c = min(r0, r1), max(r0, r1), min(c0, c1), max(c0, c1)
                outside = np.maximum(lo_r - rr, 0) + np.maximum(rr - hi_r, 0) + np.maximum(lo_c - cc, 0) \
                    + np.maximum(cc - hi_c, 0)
                t[outside == 1] = 2
                t[outside == 0] = 1
                for r, c in dp.cells():
                    t[r * cols + c] = min(t[r * cols + c], 1)
            t[in_q] = 0
    return table


def decode_hops(wafer: WaferSpec, layout: Layout) -> np.ndarray:
    """``[Q, D]`` hops from each die to the nearest die of each decode instance (0 on the instance)."""
    hm = hop_matrix(wafer)
    out = np.zeros((len(layout.decode), wafer.num_dies), dtype=np.int64)
    for q, dq in enumerate(layout.decode):
        ids = [r * wafer.cols + c for r, c in dq.cells()]
        out[q] = hm[:, ids].min(axis=1)
    return out


def remote_kv(wafer: WaferSpec, layout: Layout, decode_index: int, kv_tokens_per_die, dtype=jnp.float32) -> perf.RemoteKV:
    """The KV a decode instance reads from other dies, as :class:`~mocap_jax.wsc.perf.RemoteKV`.

    Args:
      decode_index: which instance of ``layout.decode``.
      kv_tokens_per_die: ``[D]`` KV tokens of that instance's batch held on each die
        (bytes / KV bytes per token); entries on the instance itself are local.

    Returns:
      RemoteKV with one location per die (``[D]``, zero tokens on the instance and where
      nothing is held), hops to the instance, and the instance's real ingress links
      (directed links from outside dies into it, wafer edges excluded).
    """
    if not 0 <= decode_index < len(layout.decode):
        raise SpecError(f"decode_index {decode_index} out of range: the layout has {len(layout.decode)} decode instances")
    kv = np.asarray(kv_tokens_per_die, dtype=float)
    if kv.shape != (wafer.num_dies,) or np.any(kv < 0):
        raise SpecError(f"kv_tokens_per_die must be {wafer.num_dies} non-negative numbers, one per die")
    hops = decode_hops(wafer, layout)[decode_index]
    inst = layout.decode[decode_index]
    cells = set(inst.cells())
    ingress = 0
    for r, c in cells:
        for rr, cc in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
            if 0 <= rr < wafer.rows and 0 <= cc < wafer.cols and (rr, cc) not in cells:
                ingress += 1
    return perf.RemoteKV(tokens=np.where(hops > 0, kv, 0.0).astype(dtype), hops=hops.astype(dtype),
                         internode=np.zeros(wafer.num_dies, dtype), ingress_links=np.asarray(ingress, dtype))


# --------------------------------------------------------------------------- the greedy rule


def greedy_allocate(free, need, priority, xp=jnp):
    """Place ``need`` bytes on dies by (priority, most free first); all or nothing.

    Args:
      free: ``[D]`` free bytes per die.
      need: scalar bytes to place.
      priority: ``[D]`` location priority (``NOT_ALLOWED`` = 3 excludes the die).

    Returns:
      (alloc ``[D]`` bytes taken from each die (zeros if not placed), placed bool).
    """
    allowed = priority < NOT_ALLOWED
    f = xp.where(allowed, free, 0.0)
    order = xp.lexsort((-f, priority))
    fs = f[order]
    before = xp.cumsum(fs) - fs
    take = xp.clip(need - before, 0.0, fs)
    placed = xp.sum(f) >= need
    take = xp.where(placed, take, 0.0)
    alloc = take[xp.argsort(order)]
    return alloc, placed


@jax.jit
def greedy_schedule(free, prefill, decode, need, table):
    """Greedy placement of a sequence of requests with no releases (``lax.scan``).

    Args:
      free: ``[D]`` free bytes per die at the start.
      prefill, decode: ``[R]`` int instance indices of each request.
      need: ``[R]`` KV bytes of each request (0 = padding).
      table: ``[P, Q, D]`` location priorities.

    Returns:
      (alloc ``[R, D]``, placed ``[R]`` bool, paused ``[R]`` bool, free after ``[D]``).
      A request whose KV does not fit pauses its prefill instance; later requests of a
      paused instance are paused too (not placed).
    """
    n_pre = table.shape[0]

    def step(carry, x):
        free, paused_inst = carry
        p, q, b = x
        blocked = paused_inst[p]
        alloc, ok = greedy_allocate(free, b, table[p, q], jnp)
        ok = ok & ~blocked
        alloc = jnp.where(ok, alloc, 0.0)
        paused = ~ok & (b > 0)
        return (free - alloc, paused_inst.at[p].set(paused_inst[p] | paused)), (alloc, ok & (b > 0), paused)

    (free, _), (alloc, placed, paused) = jax.lax.scan(step, (free, jnp.zeros(n_pre, bool)), (prefill, decode, need))
    return alloc, placed, paused, free


# --------------------------------------------------------------------------- optimal snapshot (LP)


@dataclass
class SnapshotResult:
    """Allocation of a set of simultaneously resident requests under one policy."""

    policy: str
    alloc: np.ndarray          # [R, D] bytes
    placed_bytes: float
    demand_bytes: float
    requests_placed: int       # requests placed in full
    requests: int
    hop_bytes: float           # sum bytes x hops(die, decode instance)
    remote_bytes: float        # bytes not on the request's decode instance
    die_kv: np.ndarray         # [D] KV bytes per die

    def row(self) -> dict[str, Any]:
        return {"policy": self.policy, "requests_placed": self.requests_placed, "requests": self.requests,
                "placed_gb": self.placed_bytes / 1e9, "demand_gb": self.demand_bytes / 1e9,
                "remote_gb": self.remote_bytes / 1e9, "kv_hop_gb": self.hop_bytes / 1e9}


def optimal_allocation(free, need, cost, allowed=None):
    """LP optimum: place as many bytes as possible, then minimise ``sum cost x bytes``.

    Variables ``x[r, d] >= 0`` (bytes of request r on die d);
    ``sum_d x[r, d] <= need[r]``, ``sum_r x[r, d] <= free[d]``.  Phase 1 maximises the
    placed bytes; phase 2 keeps that total and minimises ``sum cost[r, d] x[r, d]``.
    Requests may be split over dies and placed in part (the LP relaxation).

    Requests with identical cost and admissibility rows (e.g. the same decode
    instance) are interchangeable, so the LP is solved over those groups and each
    group's allocation is split back over its requests in proportion to their bytes;
    this is exact (same placed bytes and cost) and keeps the LP at ``groups x D``
    variables.  Solved with ``scipy.optimize.linprog`` (HiGHS).

    Args:
      free: ``[D]`` bytes; need: ``[R]`` bytes; cost: ``[R, D]`` per-byte cost.
      allowed: optional ``[R, D]`` bool mask of admissible dies.

    Returns:
      x ``[R, D]`` in bytes.
    """
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix, vstack

    free = np.asarray(free, float)
    need = np.asarray(need, float)
    cost = np.asarray(cost, float)
    r, d = cost.shape
    allowed = np.ones((r, d), bool) if allowed is None else np.asarray(allowed, bool)
    if r == 0 or need.sum() <= 0 or not allowed.any():
        return np.zeros((r, d))
    keys = np.concatenate([cost, allowed.astype(float)], axis=1)
    groups, group_of = np.unique(keys, axis=0, return_inverse=True)
    group_of = group_of.ravel()
    g = len(groups)
    g_need = np.bincount(group_of, weights=need, minlength=g)
    g_cost, g_allowed = groups[:, :d], groups[:, d:] > 0.5
    idx = np.flatnonzero(g_allowed.ravel())
    scale = max(g_need.max(), 1.0)  # work in units of the largest group for conditioning
    gi, di = np.divmod(idx, d)
    n = idx.size
    a_req = coo_matrix((np.ones(n), (gi, np.arange(n))), shape=(g, n))
    a_die = coo_matrix((np.ones(n), (di, np.arange(n))), shape=(d, n))
    a_ub = vstack([a_req, a_die]).tocsr()
    b_ub = np.concatenate([g_need, free]) / scale
    res = linprog(-np.ones(n), A_ub=a_ub, b_ub=b_ub, bounds=(0, None), method="highs")
    if res.status != 0:
        raise RuntimeError(f"linprog (phase 1) failed: {res.message}")
    placed = -res.fun
    a2 = vstack([a_ub, coo_matrix(-np.ones((1, n)))]).tocsr()
    b2 = np.concatenate([b_ub, [-placed * (1 - 1e-9)]])
    res2 = linprog(g_cost.ravel()[idx], A_ub=a2, b_ub=b2, bounds=(0, None), method="highs")
    if res2.status != 0:
        raise RuntimeError(f"linprog (phase 2) failed: {res2.message}")
    y = np.zeros(g * d)
    y[idx] = np.maximum(res2.x, 0.0) * scale
    y = y.reshape(g, d)
    share = np.where(g_need[group_of] > 0, need / np.where(g_need[group_of] > 0, g_need[group_of], 1.0), 0.0)
    return y[group_of] * share[:, None]


def _snapshot_result(policy, alloc, need, q_of, dhops):
    placed_r = alloc.sum(axis=1)
    hop = float((alloc * dhops[q_of]).sum())
    remote = float((alloc * (dhops[q_of] > 0)).sum())
    full = int(np.sum(placed_r >= need * (1 - 1e-3)))
    return SnapshotResult(policy, alloc, float(placed_r.sum()), float(need.sum()), full, len(need), hop, remote,
                          alloc.sum(axis=0))


def compare_snapshot(wafer: WaferSpec, layout: Layout, free, prefill_idx, decode_idx, need) -> list[SnapshotResult]:
    """Greedy vs local-only vs LP optimum for requests resident at once (placed in the given order)."""
    free = np.asarray(free, float)
    prefill_idx = np.asarray(prefill_idx, np.int32)
    decode_idx = np.asarray(decode_idx, np.int32)
    need = np.asarray(need, float)
    dhops = decode_hops(wafer, layout)
    out = []
    for policy in POLICIES:
        table = priority_table(wafer, layout, policy)
        alloc, placed, paused, _ = greedy_schedule(jnp.asarray(free), jnp.asarray(prefill_idx),
                                                   jnp.asarray(decode_idx), jnp.asarray(need), jnp.asarray(table))
        out.append(_snapshot_result(policy, np.asarray(alloc, float), need, decode_idx, dhops))
    x = optimal_allocation(free, need, dhops[decode_idx].astype(float))
    out.append(_snapshot_result("optimal-lp", x, need, decode_idx, dhops))
    return out


# --------------------------------------------------------------------------- timed simulation


@dataclass
class KVRequests:
    """Requests whose KV the scheduler places (host arrays ``[R]``).

    Fields: arrival_s, ready_s (prefill done, KV ready to move, before any pause),
    prefill (instance index within ``layout.prefill``), kv_bytes, decode_s (decode time once it starts).
    """

    arrival_s: np.ndarray
    ready_s: np.ndarray
    prefill: np.ndarray
    kv_bytes: np.ndarray
    decode_s: np.ndarray


def synthetic_requests(layout: Layout, prompt, output, arrival_s, prefill_iter_s: float, chunk_tokens: int,
                       kv_bytes_per_token: float, tpot_s: float) -> KVRequests:
    """KV requests from arrivals and lengths: FCFS prefill on the instance that frees first.

    Prefill of a prompt of ``S`` tokens takes ``max(S / C, 1) x prefill_iter_s``; the
    request's KV is ``(S + O) x kv_bytes_per_token`` (room for the whole answer) and its
    decode lasts ``O x tpot_s`` once a decode slot is free.
    """
    n_pre = len(layout.prefill)
    if n_pre == 0 or not layout.decode:
        raise SpecError("the layout needs at least one prefill and one decode instance")
    prompt, output, arrival_s = (np.asarray(x, float) for x in (prompt, output, arrival_s))
    order = np.argsort(arrival_s, kind="stable")
    free_at = np.zeros(n_pre)
    ready = np.zeros(len(prompt))
    inst = np.zeros(len(prompt), np.int64)
    for i in order:
        p = int(np.argmin(np.maximum(free_at, arrival_s[i])))  # shortest queue = earliest start
        start = max(free_at[p], arrival_s[i])
        free_at[p] = start + max(prompt[i] / chunk_tokens, 1.0) * prefill_iter_s
        ready[i], inst[i] = free_at[p], p
    return KVRequests(arrival_s=arrival_s, ready_s=ready, prefill=inst, kv_bytes=(prompt + output) * kv_bytes_per_token,
                      decode_s=output * tpot_s)


@dataclass
class MemorySimResult:
    """Outcome of :func:`simulate_kv` for one policy."""

    policy: str
    placed: int
    unplaceable: int                 # larger than everything its policy may use, dropped
    paused_requests: int             # requests that waited for memory
    pause_total_s: float             # sum over prefill instances of the time they were paused
    pause_max_s: float               # longest accumulated pause of one prefill instance
    kv_hop_bytes: float              # sum over placed requests of bytes x hops to its decode instance
    remote_bytes: float              # bytes placed outside the request's decode instance
    peak_util: np.ndarray            # [D] peak (resident + KV) / DRAM capacity
    mean_util: np.ndarray            # [D] time-averaged (resident + KV) / DRAM capacity
    min_free: float                  # smallest free bytes seen on any die (>= 0)
    makespan_s: float
    final_free: np.ndarray           # [D] free bytes after every request finished
    request_alloc: np.ndarray = field(repr=False, default=None)    # [R, D] bytes of each request on each die
    request_placed: np.ndarray = field(repr=False, default=None)   # [R] bool
    request_decode: np.ndarray = field(repr=False, default=None)   # [R] decode instance (-1 if not placed)
    place_s: np.ndarray = field(repr=False, default=None)          # [R] when its KV was placed (nan if not)
    release_s: np.ndarray = field(repr=False, default=None)        # [R] when its decode finished (nan if not)
    peak_kv_s: float = 0.0                                          # when the wafer held the most KV

    def resident_at(self, t: float) -> np.ndarray:
        """Indices of the requests whose KV is held at time ``t``."""
        return np.flatnonzero(self.request_placed & (self.place_s <= t) & (self.release_s > t))

    def row(self) -> dict[str, Any]:
        return {"policy": self.policy, "placed": self.placed, "unplaceable": self.unplaceable,
                "paused_requests": self.paused_requests, "pause_total_s": self.pause_total_s,
                "pause_max_s": self.pause_max_s, "remote_gb": self.remote_bytes / 1e9,
                "kv_hop_gb": self.kv_hop_bytes / 1e9, "peak_util_max": float(self.peak_util.max()),
                "mean_util_avg": float(self.mean_util.mean()), "makespan_s": self.makespan_s}


def simulate_kv(wafer: WaferSpec, layout: Layout, budget: DieBudget, requests: KVRequests, decode_batch: int,
                policy: str = "greedy") -> MemorySimResult:
    """Event-driven KV placement over time with decode completions freeing memory.

    * A request is ready at ``ready_s`` plus the pauses its prefill instance has suffered.
    * Its decode instance is the one with the fewest requests assigned and not yet
      finished (ties: fewest hops from the prefill instance, then index); it starts
      decoding when one of that instance's ``decode_batch`` slots is free and keeps its
      KV until it finishes.
    * KV placement follows ``policy`` (:data:`POLICIES`); when it does not fit, the
      prefill instance pauses until a completion frees memory (head of line), and the
      delay is added to all its later requests.
    * A request that does not fit even on an empty wafer is counted ``unplaceable``.
    """
    if policy not in POLICIES:
        raise SpecError(f"unknown memory policy {policy!r}; choose from {', '.join(POLICIES)}")
    if not isinstance(decode_batch, int) or decode_batch < 1:
        raise SpecError(f"decode_batch must be a positive integer, got {decode_batch!r}")
    table = priority_table(wafer, layout, policy)
    dhops = decode_hops(wafer, layout)
    hm = hop_matrix(wafer)
    pre_c = layout.centre_dies("prefill")
    dec_c = layout.centre_dies("decode")
    n_pre, n_dec = len(pre_c), len(dec_c)
    free = budget.free.copy()
    cap = budget.capacity
    kv = np.zeros_like(free)
    peak = kv.copy()
    area = np.zeros_like(free)
    t_last = 0.0
    min_free = float(free.min())

    queues = [list(np.flatnonzero(requests.prefill == p)[np.argsort(requests.ready_s[requests.prefill == p],
                                                                       kind="stable")]) for p in range(n_pre)]
    heads = [0] * n_pre
    shift = np.zeros(n_pre)
    blocked_since = np.full(n_pre, np.nan)
    releases: list = []  # (time, seq, request, decode index)
    seq = 0
    slots = [[0.0] * decode_batch for _ in range(n_dec)]
    active_end: list[list[float]] = [[] for _ in range(n_dec)]  # heaps of unfinished end times
    placed = unplaceable = paused_n = 0
    hop_bytes = remote = 0.0
    n_req = len(requests.kv_bytes)
    req_alloc = np.zeros((n_req, wafer.num_dies))
    req_placed = np.zeros(n_req, bool)
    req_decode = np.full(n_req, -1)
    place_s = np.full(n_req, np.nan)
    release_s = np.full(n_req, np.nan)
    total_kv = peak_total = peak_t = 0.0
    was_paused = np.zeros(len(requests.kv_bytes), bool)
    capacity_allowed = {(p, q): float(np.where(table[p, q] < NOT_ALLOWED, budget.free, 0.0).sum())
                        for p in range(n_pre) for q in range(n_dec)}

    def advance(t):
        nonlocal t_last
        area[:] += (budget.resident + kv) * (t - t_last)
        t_last = t

    while True:
        cands = [(requests.ready_s[queues[p][heads[p]]] + shift[p], p) for p in range(n_pre)
                 if heads[p] < len(queues[p]) and np.isnan(blocked_since[p])]
        t_req = min(cands)[0] if cands else math.inf
        t_rel = releases[0][0] if releases else math.inf
        if t_req == math.inf and t_rel == math.inf:
            break
        if t_rel <= t_req:
            t, _, r, alloc_r = heapq.heappop(releases)
            advance(t)
            free += alloc_r
            kv -= alloc_r
            total_kv -= float(requests.kv_bytes[r])
            for p in range(n_pre):  # every paused prefill instance retries now
                if not np.isnan(blocked_since[p]):
                    blocked_since[p] = np.nan
                    head = queues[p][heads[p]]
                    delay = t - (requests.ready_s[head] + shift[p])
                    shift[p] += max(delay, 0.0)
            continue
        t, p = min(cands)
        r = queues[p][heads[p]]
        advance(t)
        # decode instance: fewest unfinished requests, then nearest, then index
        for heap in active_end:
            while heap and heap[0] <= t:
                heapq.heappop(heap)
        loads = [len(heap) for heap in active_end]
        q = min(range(n_dec), key=lambda q: (loads[q], hm[pre_c[p], dec_c[q]], q))
        need = float(requests.kv_bytes[r])
        if need > capacity_allowed[(p, q)] * (1 + 1e-12):
            unplaceable += 1
            heads[p] += 1
            continue
        alloc, ok = greedy_allocate(free, need, table[p, q], np)
        if not ok:
            if not releases:  # nothing will ever be freed: cannot happen when need <= allowed capacity
                unplaceable += 1
                heads[p] += 1
                continue
            blocked_since[p] = t
            if not was_paused[r]:
                was_paused[r] = True
                paused_n += 1
            continue
        free -= alloc
        free[free < 0] = 0.0  # float dust: alloc <= free by construction
        kv += alloc
        peak = np.maximum(peak, kv)
        min_free = min(min_free, float(free.min()))
        total_kv += need
        if total_kv > peak_total:
            peak_total, peak_t = total_kv, t
        heads[p] += 1
        placed += 1
        req_placed[r] = True
        req_alloc[r] = alloc
        req_decode[r] = q
        place_s[r] = t
        hop_bytes += float((alloc * dhops[q]).sum())
        remote += float(alloc[dhops[q] > 0].sum())
        slot = int(np.argmin(slots[q]))
        start = max(t, slots[q][slot])
        end = start + float(requests.decode_s[r])
        slots[q][slot] = end
        heapq.heappush(active_end[q], end)
        release_s[r] = end
        seq += 1
        heapq.heappush(releases, (end, seq, r, alloc))
    # a prefill instance's accumulated pause is the delay added to its later requests
    pause_total = float(shift.sum())
    pause_max = float(shift.max(initial=0.0))
    makespan = t_last
    util_peak = (budget.resident + peak) / cap
    util_mean = (area / makespan if makespan > 0 else budget.resident + kv) / cap
    return MemorySimResult(policy=policy, placed=placed, unplaceable=unplaceable, paused_requests=paused_n,
                           pause_total_s=pause_total, pause_max_s=pause_max, kv_hop_bytes=hop_bytes,
                           remote_bytes=remote, peak_util=util_peak, mean_util=util_mean, min_free=min_free,
                           makespan_s=makespan, final_free=free.copy(), request_alloc=req_alloc,
                           request_placed=req_placed, request_decode=req_decode, place_s=place_s,
                           release_s=release_s, peak_kv_s=peak_t)


__all__ = [
    "NOT_ALLOWED", "POLICIES", "DieBudget", "die_budget", "priority_table", "decode_hops", "remote_kv", "greedy_allocate",
    "greedy_schedule", "optimal_allocation", "SnapshotResult", "compare_snapshot", "KVRequests",
    "synthetic_requests", "MemorySimResult", "simulate_kv",
]
