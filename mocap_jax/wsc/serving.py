"""Batched serving simulation of disaggregated prefill/decode serving on a wafer (or a GPU cluster).

The semantics (the contract shared with the event-driven reference,
:mod:`mocap_jax.wsc.reference`) are written down in ``docs/wsc_llm.md``, "Serving semantics".
In short: requests go to the prefill instance with the shortest FCFS queue; prefill instances
run chunked prefill (token budget ``C``, at most ``W`` requests per iteration); a prefilled
request's KV is placed by the memory scheduler -- or its prefill instance blocks until memory
is freed -- and moves over the mesh to the decode instance with the fewest unfinished
requests; decode instances run continuous batching up to ``batch_cap`` requests, reading KV
held on other dies over the mesh.  With contention on, KV transfers, remote KV reads and
collectives share the links and DRAM they use (:mod:`mocap_jax.wsc.traffic`).

Layers: set-up (:mod:`~mocap_jax.wsc.setup`), inputs (:mod:`~mocap_jax.wsc.serving_inputs`),
the array program (:mod:`~mocap_jax.wsc.serving_step`: ``jit(vmap(lax.scan(step)))`` over
design points that share a static shape), metrics (:mod:`~mocap_jax.wsc.metrics`).
:func:`simulate` ties them together: every feasible point of a call shares one static shape
(one compiled program), run in slices of similar work.  Units: seconds, bytes, tokens.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..specs import SpecError, checks
from .metrics import ServingResult, aggregate_metrics, infeasible_metrics, request_metrics
from .serving_inputs import ServingInputs, ServingShape, pack_inputs, request_bucket, shape_for, stack_inputs
from .serving_step import init_batch, run_batch
from .setup import ServingSetup
from .traces import Trace


_COMPILED: dict = {}


@dataclass
class BatchOutput:
    """Raw per-request outcome of a batch of design points (host arrays, leading axis ``[G]``)."""

    ttft_t: np.ndarray         # [G, N] s, first token (inf: never)
    finish_t: np.ndarray       # [G, N] s, last token (inf: never)
    ready_t: np.ndarray        # [G, N] s, KV arrived at the decode instance
    pinst: np.ndarray          # [G, N] prefill instance
    dinst: np.ndarray          # [G, N] decode instance
    dropped: np.ndarray        # [G, N] bool
    kv_area: np.ndarray        # [G] byte-seconds of KV held
    kv_peak: np.ndarray        # [G] bytes
    end_s: np.ndarray          # [G] s, last event
    events: np.ndarray         # [G] events of the contract
    leaped: np.ndarray         # [G] fast-forwarded decode boundaries
    overflow: np.ndarray       # [G] bool, a table overflowed
    complete: np.ndarray       # [G] bool, finished within the step budget and no overflow
    steps: int                 # scan steps run
    wall_s: float              # of the whole batch, compilation included
    compile_s: float


def simulate_batch(inputs: ServingInputs, shape: ServingShape, chunk_steps: int = 512,
                   max_steps: int | None = None, shard: bool = True) -> BatchOutput:
    """Run the array program on a batch of design points (leading axis of every leaf).

    Scans ``chunk_steps`` steps at a time (one compiled program), checking on the host
    whether every point has finished; stops at ``max_steps`` (default: a bound on the number
    of events of the contract -- output tokens + prefill iterations + ``N (6 + P)``),
    leaving unfinished points ``complete=False``.

    Args:
      inputs: stacked :class:`ServingInputs` ``[G, ...]``.
      shape: their static :class:`ServingShape`.
      chunk_steps: scan steps per compiled call.
      max_steps: give up after this many steps.
      shard: split the points over the local devices (``jax.sharding``, 1-D mesh ``points``)
        when their number divides evenly; the same program runs on one device.
    """
    chunk_steps = checks.integer("chunk_steps", chunk_steps, 1)
    req = inputs.requests
    if max_steps is None:  # every event of the contract, bounded: decode iterations <= output tokens, ...
        out_tok = np.max(np.sum(np.asarray(req.output, np.float64), axis=-1))
        pre_it = np.max(np.sum(np.asarray(req.prompt, np.float64), axis=-1)
                        / np.asarray(inputs.cost.chunk_tokens, np.float64))
        max_steps = int(out_tok + pre_it + shape.requests * (6 + shape.prefill)) + 4096
    max_steps = int(max_steps)
    t0 = time.perf_counter()
    inputs = jax.tree_util.tree_map(jnp.asarray, inputs)
    g = int(np.shape(req.count)[0])
    devices = jax.local_devices()
    if shard and len(devices) > 1 and g % len(devices) == 0:
        from jax.sharding import AxisType, NamedSharding, PartitionSpec

        mesh = jax.make_mesh((len(devices),), ("points",), axis_types=(AxisType.Auto,), devices=devices)
        sharding = NamedSharding(mesh, PartitionSpec("points"))
        inputs = jax.device_put(inputs, sharding)
        st = jax.device_put(init_batch(inputs, shape), sharding)
    else:
        st = init_batch(inputs, shape)
    key = (shape, chunk_steps, jax.tree_util.tree_structure(inputs),
           tuple((x.shape, str(x.dtype)) for x in jax.tree_util.tree_leaves(inputs)))
    if key not in _COMPILED:
        _COMPILED[key] = run_batch.lower(inputs, st, shape, chunk_steps).compile()
    compiled = _COMPILED[key]
    compile_s = time.perf_counter() - t0
    steps = 0
    while True:
        st, done = compiled(inputs, st)
        steps += chunk_steps
        if bool(np.all(np.asarray(done))) or steps >= max_steps:
            break
    done = np.asarray(done)
    rs, tot = st.requests, st.totals
    overflow = np.asarray(tot.overflow)
    return BatchOutput(ttft_t=np.asarray(rs.first_token_t), finish_t=np.asarray(rs.finish_t),
                       ready_t=np.asarray(rs.ready_t), pinst=np.asarray(rs.prefill_instance),
                       dinst=np.asarray(rs.decode_instance), dropped=np.asarray(rs.dropped),
                       kv_area=np.asarray(tot.kv_area), kv_peak=np.asarray(tot.kv_peak), end_s=np.asarray(tot.last_t),
                       events=np.asarray(tot.events), leaped=np.asarray(tot.leaped), overflow=overflow,
                       complete=done & ~overflow, steps=steps, wall_s=time.perf_counter() - t0, compile_s=compile_s)


@dataclass
class SimulationReport:
    """:func:`simulate` output: one :class:`~mocap_jax.wsc.metrics.ServingResult` per point plus timing."""

    results: list[ServingResult]
    groups: int                # compiled programs
    wall_s: float
    compile_s: float
    steps: list[int]           # scan steps of each slice
    simulated_requests: int

    @property
    def requests_per_wall_s(self) -> float:
        return self.simulated_requests / self.wall_s if self.wall_s > 0 else math.inf


RAW_FIELDS = ("ttft_t", "finish_t", "ready_t", "pinst", "dinst", "dropped")


def simulate(points: Sequence[tuple[ServingSetup, Trace]], dtype=jnp.float32, batch_size: int | None = None,
             chunk_steps: int = 512, keep_raw: bool = False) -> SimulationReport:
    """Simulate many (setup, trace) design points with the array program.

    Every feasible point shares one static shape (requests padded to the largest trace's
    bucket :func:`~mocap_jax.wsc.serving_inputs.request_bucket`, smaller die grids with empty
    dies), so the call compiles once; the points run with ``jit(vmap)`` in slices of
    ``batch_size`` (similar amounts of work together: a slice runs until its slowest point is
    done; the last slice is padded by repeating a point).  Infeasible set-ups become rows with
    infinite latency and zero throughput.

    Args:
      points: ``[(setup, trace), ...]``.
      dtype: float dtype of the program (float64 needs ``jax_enable_x64``).
      batch_size: points per ``vmap`` call (default: all points up to 48, else 32).
      chunk_steps: scan length between host checks for completion.
      keep_raw: keep the raw per-request times in each result.
    """
    if dtype == jnp.float64 and not jax.config.jax_enable_x64:
        raise SpecError("float64 needs jax_enable_x64: call jax.config.update('jax_enable_x64', True) first")
    t0 = time.perf_counter()
    results: list[ServingResult | None] = [None] * len(points)
    idx = []
    for k, (setup, trace) in enumerate(points):
        if setup.feasible:
            idx.append(k)
        else:
            results[k] = ServingResult(setup, trace, infeasible_metrics(trace))
    compile_s, steps_all, simulated = 0.0, [], 0
    if idx:
        n_req = max(request_bucket(len(points[k][1])) for k in idx)
        shape = shape_for([points[k][0] for k in idx], n_req, points[idx[0]][0].config)
        ndev = len(jax.local_devices())
        idx = sorted(idx, key=lambda k: (len(points[k][1]), float(points[k][1].output_tokens.sum())
                                         / max(points[k][0].n_decode, 1), k))
        bs = (len(idx) if len(idx) <= 48 else 32) if batch_size is None else checks.integer("batch_size", batch_size)
        bs = -(-bs // ndev) * ndev if bs >= ndev else bs  # whole multiple of the devices
        for s in range(0, len(idx), bs):
            sl = idx[s:s + bs]
            padded = sl + [sl[-1]] * (bs - len(sl))
            inp = stack_inputs([pack_inputs(points[k][0], points[k][1], shape, dtype) for k in padded])
            out = simulate_batch(inp, shape, chunk_steps=chunk_steps)
            compile_s += out.compile_s
            steps_all.append(out.steps)
            for g, k in enumerate(sl):
                setup, trace = points[k]
                n = len(trace)
                rm = request_metrics(trace, out.ttft_t[g, :n], out.finish_t[g, :n], out.dropped[g, :n])
                met = aggregate_metrics(trace, rm, setup, float(out.kv_area[g]), float(out.kv_peak[g]),
                                        float(out.end_s[g]))
                met.update(events=int(out.events[g]), leaped=int(out.leaped[g]), complete=bool(out.complete[g]))
                raw = {f: getattr(out, f)[g, :n] for f in RAW_FIELDS} if keep_raw else None
                results[k] = ServingResult(setup, trace, met, rm, raw)
                simulated += n
    return SimulationReport(results=results, groups=1 if idx else 0, wall_s=time.perf_counter() - t0,
                            compile_s=compile_s, steps=steps_all, simulated_requests=simulated)


__all__ = ["BatchOutput", "simulate_batch", "SimulationReport", "simulate"]
