"""Timed simulation of KV placement: requests arrive, decode completions free memory, policies compared.

:func:`simulate_kv` runs a memory policy over time on synthetic requests
(:func:`synthetic_requests`: FCFS prefill on the instance that frees first, decode lasting
``O x TPOT``) and reports pauses of prefill instances, remote bytes, KV hop-bytes and per-die
DRAM use.  It is the memory scheduler's own study; the serving simulation
(:mod:`mocap_jax.wsc.serving`) runs the same rule inside its event loop.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..specs import SpecError
from .geometry import hop_matrix
from .hardware import WaferSpec
from .layout import Layout
from .memory import NOT_ALLOWED, POLICIES, DieBudget, decode_hops, greedy_allocate, priority_table

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


__all__ = ["KVRequests", "synthetic_requests", "MemorySimResult", "simulate_kv"]
