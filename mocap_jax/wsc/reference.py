"""Event-driven reference of the WSC-LLM serving simulation, with flow-level contention.

Written independently of the array program (:mod:`mocap_jax.wsc.serving`): plain Python objects
(deques, lists) and a ``heapq`` event queue, one event per decode iteration, no fixed-capacity
tables, no fast-forwarding.  It implements the contract in ``docs/wsc_llm.md`` ("Serving
semantics") and shares with the array program only the instance cost functions of
:mod:`mocap_jax.wsc.perf`, the memory scheduler's placement rule
(:func:`mocap_jax.wsc.memory.greedy_allocate`, NumPy path) and the per-design-point
:class:`~mocap_jax.wsc.setup.ServingSetup`.

With contention on, every iteration and KV transfer is a stream of a
:class:`~mocap_jax.wsc.reference_flows.FlowNetwork`; at every stream start and end the bandwidth
of every link and DRAM is re-shared exactly and every stream in flight is re-timed: a stream
that has done a fraction ``f`` of its work at shares ``s`` needs ``(1 - f) x duration(s')`` more
at the new shares ``s'``.  A KV transfer's completion is an event (the request's KV is ready).

Event keys are ``(time, kind, index, version)`` with kind -1 = transfer done, 0 = decode
boundary, 1 = arrival, 2 = prefill event; an event is superseded by bumping the version.  Runs
in float64 when ``jax_enable_x64`` is on.
"""

from __future__ import annotations

import heapq
import math
import time

import numpy as np

from ..specs import SpecError
from . import memory as mem
from .metrics import ServingResult, aggregate_metrics, request_metrics
from .reference_costs import IterationCosts
from .reference_flows import FlowNetwork
from .reference_state import DecodeInstance, PrefillInstance, ReferenceOutput, Stream
from .setup import ServingSetup
from .traces import Trace

TRANSFER, DECODE, ARRIVAL, PREFILL = -1, 0, 1, 2


def simulate_reference(setup: ServingSetup, trace: Trace) -> ReferenceOutput:
    """Run the event-driven reference on one design point (contention as ``setup.config.contention``).

    Args:
      setup: a feasible :class:`~mocap_jax.wsc.setup.ServingSetup`.
      trace: the requests (sorted by arrival).
    """
    if not setup.feasible:
        raise SpecError(f"{setup.label}: infeasible design point ({setup.reason})")
    t_start = time.perf_counter()
    cfg = setup.config
    costs = IterationCosts(setup)
    fdt = costs.dtype
    n_req = len(trace)
    arrival = trace.arrival_s.astype(float)
    prompt = trace.prompt_tokens.astype(float)
    output = trace.output_tokens.astype(float)
    P, Q, D, W = setup.n_prefill, setup.n_decode, setup.dies, cfg.window
    chunk_budget = float(cfg.chunk_tokens)
    hw = setup.wafer
    contended = cfg.contention != "off"
    tt = setup.traffic
    if contended:
        link_cap = tt.link_capacity * hw.eff_link
        dram_cap = np.full(D, hw.dram_bandwidth * hw.eff_dram)
        network = FlowNetwork(link_cap, dram_cap, cfg.contention)
        decode_own = np.zeros((Q, D))
        for q, inst in enumerate(setup.layout.decode):
            decode_own[q, [r * hw.cols + c for r, c in inst.cells()]] = 1.0
    pre = [PrefillInstance() for _ in range(P)]
    dec = [DecodeInstance() for _ in range(Q)]
    streams: dict = {}               # ("prefill", p) / ("decode", q) / ("transfer", r) -> Stream
    free = setup.free0.astype(float).copy()
    free0_total = float(np.sum(setup.free0))
    alloc: dict[int, np.ndarray] = {}
    pending_transfer: dict[int, int] = {}     # request -> its decode instance, while its KV moves
    transfer_version = np.zeros(n_req, int)
    ttft_t = np.full(n_req, np.inf)
    finish_t = np.full(n_req, np.inf)
    ready_t = np.full(n_req, np.inf)
    pinst = np.full(n_req, -1)
    dinst = np.full(n_req, -1)
    dropped = np.zeros(n_req, bool)
    heap: list = [(arrival[i], ARRIVAL, i, 0) for i in range(n_req)]
    heapq.heapify(heap)
    state = {"t_last": arrival[0], "area": 0.0, "peak": 0.0, "events": 0, "changed": False}

    def schedule(kind, idx, t):
        inst = pre[idx] if kind == PREFILL else dec[idx]
        inst.version += 1
        if t is not None and math.isfinite(t):
            heapq.heappush(heap, (t, kind, idx, inst.version))

    def push_stream_end(key, t):
        kind, idx = key
        if kind == "transfer":
            transfer_version[idx] += 1
            heapq.heappush(heap, (t, TRANSFER, idx, int(transfer_version[idx])))
        else:
            schedule(PREFILL if kind == "prefill" else DECODE, idx, t)

    def start_stream(key, t, link_demand, dram_demand, duration, alone):
        streams[key] = Stream(link_demand, dram_demand, duration, alone, t)
        if contended:
            network.add(key, link_demand, dram_demand)
            state["changed"] = True
        else:
            push_stream_end(key, t + alone)

    def end_stream(key):
        streams.pop(key, None)
        if contended:
            network.remove(key)
            state["changed"] = True

    def reshare(t):
        """Re-share bandwidth among the streams in flight and re-time the ones whose shares changed."""
        for key, (ls, ds) in network.shares().items():
            s = streams[key]
            if s.shares is not None and np.array_equal(s.shares[0], ls) and np.array_equal(s.shares[1], ds):
                continue
            s.done += (t - s.since) / s.seconds if s.seconds > 0 else 0.0
            s.since, s.shares = t, (ls, ds)
            s.seconds = s.duration(ls, ds)
            push_stream_end(key, t + max(1.0 - s.done, 0.0) * s.seconds)

    def kv_used():
        return free0_total - float(np.sum(free))

    # ---------------------------------------------------------------- prefill iterations
    def prefill_stream(p, chunk, prefix, last, mask, t):
        args = [x.astype(fdt) for x in (chunk, prefix)] + [last, mask]
        alone = float(costs.prefill(*args, fdt.type(1.0), fdt.type(1.0)))
        if not contended:
            return start_stream(("prefill", p), t, None, None, None, alone)
        c = np.where(mask, chunk, 0.0)
        tokens = c.sum()
        kv_read = np.where(c > 0, np.where(mask, prefix, 0.0) + c, 0.0).sum()
        dram, ring, group = (float(x) for x in costs.prefill_traffic(fdt.type(tokens), fdt.type(kv_read),
                                                                      fdt.type(np.sum(last & mask))))
        own = setup.p_die_own[p].astype(float)
        link_demand = (ring * tt.prefill_ring[p] + group * tt.prefill_group[p]) / alone
        uses = (tt.prefill_ring[p] + tt.prefill_group[p]) > 0

        def duration(ls, ds):
            own_share = float(np.min(np.where(own > 0, ds, 1.0)))
            coll = float(np.min(np.where(uses, ls, 1.0)))
            return float(costs.prefill(*args, fdt.type(own_share), fdt.type(coll)))

        start_stream(("prefill", p), t, link_demand, dram * own / alone, duration, alone)

    # ---------------------------------------------------------------- decode iterations
    def decode_stream(q, t):
        d = dec[q]
        n = float(len(d.batch))
        ctx = sum(prompt[r] + g for r, g in d.batch)
        if not setup.remote:
            alone = float(costs.decode_local(fdt.type(n), fdt.type(ctx)))
            if not contended:
                return start_stream(("decode", q), t, None, None, None, alone)
            rt = np.zeros(D)
        else:
            outside = setup.q_die_hops[q] > 0
            rt = np.zeros(D)
            for r, g in d.batch:
                need = (prompt[r] + output[r]) * setup.kv_bytes_per_token
                rt += (prompt[r] + g) * (alloc[r] / need)
            rt = np.where(outside, rt, 0.0)
            if not contended:
                alone = float(costs.decode_table_remote(n, ctx, rt.astype(fdt), setup.q_die_hops[q].astype(fdt),
                                                        setup.q_die_internode[q].astype(fdt),
                                                        fdt.type(setup.q_ingress[q])))
                return start_stream(("decode", q), t, None, None, None, alone)
        local = max(ctx - rt.sum(), 0.0)
        dram_bytes = rt * costs.kv_per_token_block
        link_bytes = (rt @ tt.read_routes[q]) * costs.kv_per_token_block
        held = rt > 0
        latency = float(np.max(np.where(held, np.maximum(setup.q_die_hops[q] * hw.link_latency_s,
                                                         setup.q_die_internode[q] * hw.node_latency_s), 0.0),
                               initial=0.0))
        own = decode_own[q]
        uses = (tt.decode_ring[q] + tt.decode_group[q]) > 0

        def duration(ls, ds):
            own_share = float(np.min(np.where(own > 0, ds, 1.0)))
            coll = float(np.min(np.where(uses, ls, 1.0)))
            return float(costs.decode_links(fdt.type(n), fdt.type(ctx), fdt.type(local), link_bytes.astype(fdt),
                                            (link_cap * ls).astype(fdt), dram_bytes.astype(fdt),
                                            (dram_cap * ds).astype(fdt), fdt.type(latency), fdt.type(own_share),
                                            fdt.type(coll)))

        alone = duration(np.ones_like(link_cap), np.ones(D))
        dram, ring, group = (float(x) for x in costs.decode_traffic(fdt.type(n), fdt.type(local)))
        link_demand = (ring * tt.decode_ring[q] + group * tt.decode_group[q] + costs.layers * link_bytes) / alone
        dram_demand = (dram * own + costs.layers * dram_bytes * (1.0 - own)) / alone
        start_stream(("decode", q), t, link_demand, dram_demand, duration, alone)

    # ---------------------------------------------------------------- events
    def decode_boundary(q, t):
        d = dec[q]
        if d.batch:
            end_stream(("decode", q))
            keep = []
            released = False
            for entry in d.batch:
                entry[1] += 1
                r = entry[0]
                if entry[1] >= output[r]:
                    finish_t[r] = t
                    free[:] = free + alloc.pop(r)
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
            decode_stream(q, t)
        elif d.queue and math.isfinite(ready_t[d.queue[0]]):
            schedule(DECODE, q, ready_t[d.queue[0]])
        else:
            schedule(DECODE, q, None)   # idle: a placement or a transfer's end wakes it

    def transfer_done(r, t):
        end_stream(("transfer", r))
        ready_t[r] = t
        q = pending_transfer.pop(r)
        d = dec[q]
        if not d.batch and d.queue and d.queue[0] == r:
            schedule(DECODE, q, t)

    def arrive(i, t):
        lens = [len(inst.queue) for inst in pre]
        p = min(range(P), key=lambda k: (lens[k], k))
        pre[p].queue.append(i)
        pinst[i] = p
        if not pre[p].busy and pre[p].pend == 0:
            schedule(PREFILL, p, t)

    def choose_decode(p):
        return min(range(Q), key=lambda q: (dec[q].load, int(setup.pq_hops[p, q]), q))

    def transfer(p, r, q, row, t):
        """Start moving request ``r``'s KV (the bytes placed outside prefill instance ``p``) to decode ``q``."""
        own = setup.p_die_own[p]
        tgt = (row > 0) & ~own
        moved = float(np.sum(row[tgt]))
        if moved <= 0:
            ready_t[r] = t
            return
        hops = float(np.max(setup.p_die_hops[p][tgt]))
        inter = float(np.max(setup.p_die_internode[p][tgt]))
        lat = max(hops * hw.link_latency_s, inter * hw.node_latency_s)
        pending_transfer[r] = q
        if not contended:
            bw = (hw.node_bandwidth if inter > 0 else hw.link_bandwidth) * hw.eff_link
            return start_stream(("transfer", r), t, None, None, None, lat + moved / (setup.lanes * bw))
        link_bytes = np.where(tgt, row, 0.0) @ tt.transfer_counts[p] / tt.prefill_dies[p]
        busy = link_bytes > 0
        alone_bw = float(np.max(np.where(busy, link_bytes / np.maximum(link_cap, 1e-300), 0.0)))
        demand = np.where(busy, link_bytes / alone_bw, 0.0)

        def duration(ls, ds):
            return lat + float(np.max(np.where(busy, link_bytes / np.maximum(link_cap * ls, 1e-300), 0.0)))

        start_stream(("transfer", r), t, demand, np.zeros(D), duration, lat + alone_bw)

    def prefill_event(p, t):
        inst = pre[p]
        if inst.busy:
            end_stream(("prefill", p))
            for k in range(inst.it_complete):
                ttft_t[inst.queue[inst.pend + k]] = t
            inst.pend += inst.it_complete
            inst.prog = inst.it_prog
            inst.busy = False
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
                    d = dec[q]
                    idle = not d.queue and not d.batch
                    d.queue.append(r)
                    d.load += 1
                    dinst[r] = q
                    transfer(p, r, q, row, t)
                    if idle and math.isfinite(ready_t[r]):
                        schedule(DECODE, q, ready_t[r])
            inst.queue.popleft()
            inst.pend -= 1
        if inst.pend == 0 and inst.queue:
            chunk, prefix = np.zeros(W), np.zeros(W)
            last, mask = np.zeros(W, bool), np.zeros(W, bool)
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
            inst.busy, inst.it_complete, inst.it_prog = True, complete, nprog
            prefill_stream(p, chunk, prefix, last, mask, t)
        else:
            schedule(PREFILL, p, None)

    while heap:
        t, kind, idx, version = heapq.heappop(heap)
        if kind == PREFILL and version != pre[idx].version:
            continue
        if kind == DECODE and version != dec[idx].version:
            continue
        if kind == TRANSFER and version != transfer_version[idx]:
            continue
        state["area"] += kv_used() * (t - state["t_last"])
        state["t_last"] = t
        state["events"] += 1
        if kind == DECODE:
            decode_boundary(idx, t)
        elif kind == ARRIVAL:
            arrive(idx, t)
        elif kind == TRANSFER:
            transfer_done(idx, t)
        else:
            prefill_event(idx, t)
        if state["changed"]:
            state["changed"] = False
            reshare(t)
        state["peak"] = max(state["peak"], kv_used())
    return ReferenceOutput(ttft_t=ttft_t, finish_t=finish_t, ready_t=ready_t, pinst=pinst, dinst=dinst,
                           dropped=dropped, kv_area=state["area"], kv_peak=state["peak"], end_s=state["t_last"],
                           events=state["events"], wall_s=time.perf_counter() - t_start)


def reference_result(setup: ServingSetup, trace: Trace) -> tuple[ServingResult, ReferenceOutput]:
    """Reference run wrapped as a :class:`~mocap_jax.wsc.metrics.ServingResult` (same metrics as the array)."""
    out = simulate_reference(setup, trace)
    rm = request_metrics(trace, out.ttft_t, out.finish_t, out.dropped)
    met = aggregate_metrics(trace, rm, setup, out.kv_area, out.kv_peak, out.end_s)
    met.update(events=out.events, complete=bool(np.all(np.isfinite(out.finish_t) | out.dropped)))
    return ServingResult(setup, trace, met, rm), out


__all__ = ["simulate_reference", "reference_result", "ReferenceOutput"]
