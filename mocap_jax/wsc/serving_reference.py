"""Event-driven reference of the WSC-LLM serving simulation (DESIGN §9, §10).

Written independently of the array program (:mod:`mocap_jax.wsc.serving`): plain Python
objects (deques, lists) and a ``heapq`` event queue, one event per decode iteration, no
fixed-capacity tables and no fast-forwarding.  It implements the contract in
``docs/wsc_llm.md`` ("Serving semantics") and shares with the array program only the
instance cost functions (:func:`mocap_jax.wsc.perf.prefill_iteration_time`,
:func:`~mocap_jax.wsc.perf.decode_time`), the memory scheduler's placement rule
(:func:`mocap_jax.wsc.memory.greedy_allocate`, numpy path) and the per-design-point
:class:`~mocap_jax.wsc.serving.ServingSetup`.

Event keys are ``(time, kind, index, version)`` with kind 0 = decode boundary,
1 = arrival, 2 = prefill event; an instance's event is superseded by bumping its version
(stale heap entries are skipped).  Runs in float64 when ``jax_enable_x64`` is on.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..specs import SpecError
from . import memory as mem
from . import perf
from .hardware import WaferParams
from .serving import ServingResult, ServingSetup, aggregate_metrics, request_metrics
from .workload import Trace

DECODE, ARRIVAL, PREFILL = 0, 1, 2


def _cost_functions(setup: ServingSetup):
    """Jitted per-iteration costs of this set-up (float64 when x64 is enabled)."""
    dt = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
    model = perf.model_params(setup.model, dt)
    hw = WaferParams.from_spec(setup.wafer, dt)
    pplan = perf.tp_plan(setup.model, setup.wafer, setup.prefill, dt)
    dplan = perf.tp_plan(setup.model, setup.wafer, setup.decode, dt)

    @jax.jit
    def prefill_dt(chunk, prefix, last, mask):
        return perf.prefill_iteration_time(model, hw, pplan, chunk, prefix, last, mask)

    @jax.jit
    def decode_dt(n, ctx, rt, hops, inter, ingress):
        remote = perf.RemoteKV(tokens=rt, hops=hops, internode=inter, ingress_links=ingress)
        return perf.decode_time(model, hw, dplan, n, ctx, remote)

    @jax.jit
    def decode_dt_local(n, ctx):
        return perf.decode_time(model, hw, dplan, n, ctx, None)

    return prefill_dt, decode_dt, decode_dt_local, np.dtype(dt)


@dataclass
class _PrefillInstance:
    queue: deque = field(default_factory=deque)   # unplaced requests in FCFS order (prefilled ones first)
    pend: int = 0                                  # prefilled, not yet placed (at the queue front)
    prog: float = 0.0                              # tokens prefilled of the first unprefilled request
    busy: bool = False
    it_complete: int = 0                           # requests the running iteration completes
    it_prog: float = 0.0                           # progress of the first unprefilled after it
    version: int = 0


@dataclass
class _DecodeInstance:
    queue: deque = field(default_factory=deque)   # placed requests waiting for a slot (placement order)
    batch: list = field(default_factory=list)     # [request, tokens generated so far]
    load: int = 0                                  # assigned, unfinished
    version: int = 0


@dataclass
class ReferenceOutput:
    """Per-request times (absolute seconds, inf = never) and aggregates of one reference run."""

    ttft_t: np.ndarray
    finish_t: np.ndarray
    ready_t: np.ndarray
    pinst: np.ndarray
    dinst: np.ndarray
    dropped: np.ndarray
    kv_area: float
    kv_peak: float
    end_s: float
    events: int
    wall_s: float


def simulate_reference(setup: ServingSetup, trace: Trace) -> ReferenceOutput:
    """Run the event-driven reference on one design point.

    Args:
      setup: a feasible :class:`~mocap_jax.wsc.serving.ServingSetup`.
      trace: the requests (sorted by arrival).

    Returns:
      :class:`ReferenceOutput`.
    """
    if not setup.feasible:
        raise SpecError(f"{setup.label}: infeasible design point ({setup.reason})")
    t_start = time.perf_counter()
    cfg = setup.config
    prefill_dt, decode_dt, decode_dt_local, fdt = _cost_functions(setup)
    n_req = len(trace)
    arrival = trace.arrival_s.astype(float)
    prompt = trace.prompt_tokens.astype(float)
    output = trace.output_tokens.astype(float)
    P, Q, D, W = setup.n_prefill, setup.n_decode, setup.dies, cfg.window
    chunk_budget = float(cfg.chunk_tokens)
    hw = setup.wafer
    pre = [_PrefillInstance() for _ in range(P)]
    dec = [_DecodeInstance() for _ in range(Q)]
    free = setup.free0.astype(float).copy()
    free0_total = float(np.sum(setup.free0))
    alloc: dict[int, np.ndarray] = {}
    ttft_t = np.full(n_req, np.inf)
    finish_t = np.full(n_req, np.inf)
    ready_t = np.full(n_req, np.inf)
    pinst = np.full(n_req, -1)
    dinst = np.full(n_req, -1)
    dropped = np.zeros(n_req, bool)
    heap: list = [(arrival[i], ARRIVAL, i, 0) for i in range(n_req)]
    heapq.heapify(heap)
    state = {"t_last": arrival[0], "area": 0.0, "peak": 0.0, "events": 0}

    def schedule(kind, idx, t):
        inst = pre[idx] if kind == PREFILL else dec[idx]
        inst.version += 1
        if t is not None and math.isfinite(t):
            heapq.heappush(heap, (t, kind, idx, inst.version))

    def kv_used():
        return free0_total - float(np.sum(free))

    def decode_boundary(q, t):
        d = dec[q]
        if d.batch:
            keep = []
            released = False
            for entry in d.batch:
                entry[1] += 1
                r = entry[0]
                if entry[1] >= output[r]:
                    finish_t[r] = t
                    nonlocal_free_add(alloc.pop(r))
                    d.load -= 1
                    released = True
                else:
                    keep.append(entry)
            d.batch = keep
            if released:
                for p, inst in enumerate(pre):
                    if not inst.busy and inst.pend > 0:
                        schedule(PREFILL, p, t)
        while d.queue and len(d.batch) < setup.batch_cap and ready_t[d.queue[0]] <= t:
            d.batch.append([d.queue.popleft(), 1])
        if d.batch:
            n = float(len(d.batch))
            ctx = 0.0
            for r, g in d.batch:
                ctx += prompt[r] + g
            if setup.remote:
                outside = setup.q_die_hops[q] > 0
                rt = np.zeros(D)
                for r, g in d.batch:
                    need = (prompt[r] + output[r]) * setup.kv_bytes_per_token
                    rt += (prompt[r] + g) * (alloc[r] / need)
                rt = np.where(outside, rt, 0.0)
                dt = float(decode_dt(n, ctx, rt.astype(fdt), setup.q_die_hops[q].astype(fdt),
                                     setup.q_die_internode[q].astype(fdt), fdt.type(setup.q_ingress[q])))
            else:
                dt = float(decode_dt_local(fdt.type(n), fdt.type(ctx)))
            schedule(DECODE, q, t + dt)
        elif d.queue:
            schedule(DECODE, q, ready_t[d.queue[0]])
        else:
            schedule(DECODE, q, None)

    def nonlocal_free_add(row):
        free[:] = free + row

    def arrive(i, t):
        lens = [len(inst.queue) for inst in pre]
        p = min(range(P), key=lambda k: (lens[k], k))
        pre[p].queue.append(i)
        pinst[i] = p
        if not pre[p].busy and pre[p].pend == 0:
            schedule(PREFILL, p, t)

    def choose_decode(p):
        return min(range(Q), key=lambda q: (dec[q].load, int(setup.pq_hops[p, q]), q))

    def prefill_event(p, t):
        inst = pre[p]
        if inst.busy:
            for k in range(inst.it_complete):
                ttft_t[inst.queue[inst.pend + k]] = t
            inst.pend += inst.it_complete
            inst.prog = inst.it_prog
            inst.busy = False
        own = setup.p_die_own[p]
        while inst.pend > 0:
            r = inst.queue[0]
            if output[r] <= 1:
                finish_t[r] = t
            else:
                q = choose_decode(p)
                need = (prompt[r] + output[r]) * setup.kv_bytes_per_token
                if need > setup.cap_allowed[p, q]:
                    dropped[r] = True
                else:
                    row, ok = mem.greedy_allocate(free, need, setup.prio[p, q], np)
                    if not ok:
                        break  # blocked until a decode instance frees memory
                    free[:] = np.maximum(free - row, 0.0)
                    alloc[r] = row
                    tgt = (row > 0) & ~own
                    moved = float(np.sum(row[tgt]))
                    if moved > 0:
                        hops = float(np.max(setup.p_die_hops[p][tgt]))
                        inter = float(np.max(setup.p_die_internode[p][tgt]))
                        bw = (hw.node_bandwidth if inter > 0 else hw.link_bandwidth) * hw.eff_link
                        lat = max(hops * hw.link_latency_s, inter * hw.node_latency_s)
                        ready = t + (lat + moved / (setup.lanes * bw))
                    else:
                        ready = t
                    d = dec[q]
                    wake = not d.queue and not d.batch
                    d.queue.append(r)
                    d.load += 1
                    ready_t[r] = ready
                    dinst[r] = q
                    if wake:
                        schedule(DECODE, q, ready)
            inst.queue.popleft()
            inst.pend -= 1
        if inst.pend == 0 and inst.queue:
            chunk = np.zeros(W)
            prefix = np.zeros(W)
            last = np.zeros(W, bool)
            mask = np.zeros(W, bool)
            budget = chunk_budget
            for k in range(min(W, len(inst.queue))):
                r = inst.queue[k]
                done = inst.prog if k == 0 else 0.0
                rem = prompt[r] - done
                take = min(rem, max(budget, 0.0))
                chunk[k], prefix[k], mask[k] = take, done, True
                last[k] = take >= rem
                budget -= take
            complete = 0
            while complete < W and last[complete]:
                complete += 1
            if complete < W and mask[complete]:
                nprog = (inst.prog if complete == 0 else 0.0) + chunk[complete]
            else:
                nprog = 0.0
            dt = float(prefill_dt(chunk.astype(fdt), prefix.astype(fdt), last, mask))
            inst.busy, inst.it_complete, inst.it_prog = True, complete, nprog
            schedule(PREFILL, p, t + dt)
        else:
            schedule(PREFILL, p, None)

    while heap:
        t, kind, idx, version = heapq.heappop(heap)
        if kind == PREFILL and version != pre[idx].version:
            continue
        if kind == DECODE and version != dec[idx].version:
            continue
        state["area"] += kv_used() * (t - state["t_last"])
        state["t_last"] = t
        state["events"] += 1
        if kind == DECODE:
            decode_boundary(idx, t)
        elif kind == ARRIVAL:
            arrive(idx, t)
        else:
            prefill_event(idx, t)
        state["peak"] = max(state["peak"], kv_used())
    return ReferenceOutput(ttft_t=ttft_t, finish_t=finish_t, ready_t=ready_t, pinst=pinst, dinst=dinst,
                           dropped=dropped, kv_area=state["area"], kv_peak=state["peak"], end_s=state["t_last"],
                           events=state["events"], wall_s=time.perf_counter() - t_start)


def reference_result(setup: ServingSetup, trace: Trace) -> tuple[ServingResult, ReferenceOutput]:
    """Reference run wrapped as a :class:`~mocap_jax.wsc.serving.ServingResult` (same metrics as the array)."""
    out = simulate_reference(setup, trace)
    rm = request_metrics(trace, out.ttft_t, out.finish_t, out.dropped)
    met = aggregate_metrics(trace, rm, setup, out.kv_area, out.kv_peak, out.end_s)
    met.update(events=out.events, complete=bool(np.all(np.isfinite(out.finish_t) | out.dropped)))
    return ServingResult(setup, trace, met, rm), out


def agreement(array_result: ServingResult, ref: ServingResult) -> dict[str, Any]:
    """Relative error of the array program against the reference (per-request TTFT / TPOT / E2E).

    Returns:
      ``{ttft,tpot,e2e}_{mean,max}_rel_err`` over requests finished by both,
      ``same_finished`` (identical sets of finished / dropped requests), and the
      largest relative difference of the aggregate metrics (``aggregate_max_rel_err``).
    """
    a, b = array_result.requests, ref.requests
    out: dict[str, Any] = {"same_finished": bool(np.array_equal(a.finished, b.finished)
                                                 and np.array_equal(a.dropped, b.dropped))}
    both = a.finished & b.finished
    for k in ("ttft", "tpot", "e2e"):
        x, y = getattr(a, k)[both], getattr(b, k)[both]
        ok = np.isfinite(x) & np.isfinite(y)
        rel = np.abs(x[ok] - y[ok]) / np.maximum(np.abs(y[ok]), 1e-12)
        out[f"{k}_mean_rel_err"] = float(rel.mean()) if rel.size else 0.0
        out[f"{k}_max_rel_err"] = float(rel.max()) if rel.size else 0.0
    worst = 0.0
    for k in ("ttft_mean", "tpot_mean", "e2e_mean", "e2e_p99", "tokens_per_s", "dram_util_mean"):
        x, y = array_result.metrics[k], ref.metrics[k]
        if math.isfinite(x) and math.isfinite(y):
            worst = max(worst, abs(x - y) / max(abs(y), 1e-12))
    out["aggregate_max_rel_err"] = worst
    return out


__all__ = ["simulate_reference", "reference_result", "ReferenceOutput", "agreement"]
