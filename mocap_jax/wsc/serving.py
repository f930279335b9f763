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
design points that share a static shape, each device running its share of them), metrics
(:mod:`~mocap_jax.wsc.metrics`).
:func:`simulate` ties them together: every feasible point of a call shares one static shape
(one compiled program), in a batch of lanes that finished points leave to waiting ones.  Units: seconds, bytes, tokens.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..costs.computed_once import LOOP_EMITTERS
from ..specs import checks
from .metrics import ServingResult, aggregate_metrics, check_clock, infeasible_metrics, request_metrics
from .serving_inputs import ServingInputs, ServingShape, pack_inputs, request_bucket, shape_for, stack_inputs
from .serving_step import run_batch, state_shapes
from .setup import ServingSetup
from .traces import Trace


_COMPILED: dict = {}
#: LLVM optimisation level of the serving program (thousands of small gathers, scatters and
#: reductions) by run size.  On the 2-core CPU level 1 took 1.4-1.6x level 0's compile time (18 s
#: against 13 s without contention, 30 s against 18 s with it) and ran a scan step 4-8x faster
#: (8 lanes of 512 requests: 1.0 against 8.7 ms without contention, 4.0 against 17 ms with it), so
#: runs of at least OPTIMISE_FROM_REQUESTS simulated requests compile at level 1, shorter ones
#: (where compilation dominates) at level 0.
OPTIMISE_FROM_REQUESTS = 4096
#: Runs of fewer than LOOP_EMITTERS_BELOW_REQUESTS simulated requests also compile with XLA:CPU's loop
#: emitters (:data:`~mocap_jax.costs.computed_once.LOOP_EMITTERS`), whose cheaper compile outweighs
#: their slower steps in a run this short (about even at 1,280 requests; docs/wsc_llm.md, "Performance").
LOOP_EMITTERS_BELOW_REQUESTS = 1024
#: XLA:CPU's copy insertion by region analysis (off by default) leaves out copies of the state's
#: tables that the default analysis adds around the step's loops (a faster step, the same results;
#: docs/wsc_llm.md, "Performance").
COPY_INSERTION = {"xla_cpu_copy_insertion_use_region_analysis": True}


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


def _step_budget(inputs: ServingInputs, shape: ServingShape) -> np.ndarray:
    """A bound on the scan steps each point needs (every event of the contract): ``[G]`` for stacked
    inputs, a scalar for one point's."""
    req = inputs.requests
    out_tok = np.sum(np.asarray(req.output, np.float64), axis=-1)
    pre_it = np.sum(np.asarray(req.prompt, np.float64), axis=-1) / np.asarray(inputs.cost.chunk_tokens, np.float64)
    return (out_tok + pre_it + shape.requests * (6 + shape.prefill)).astype(np.int64) + 4096


def _sharding(g: int, shard: bool):
    """A 1-D ``points`` sharding over the local devices when ``g`` divides evenly, else None."""
    devices = jax.local_devices()
    if not shard or len(devices) < 2 or g % len(devices):
        return None
    from jax.sharding import AxisType, NamedSharding, PartitionSpec

    mesh = jax.make_mesh((len(devices),), ("points",), axis_types=(AxisType.Auto,), devices=devices)
    return NamedSharding(mesh, PartitionSpec("points"))


def compile_options(requests: int) -> dict:
    """XLA options of the serving program for a run of ``requests`` simulated requests in all: LLVM level 1
    from :data:`OPTIMISE_FROM_REQUESTS` on, else level 0, and :data:`LOOP_EMITTERS` below
    :data:`LOOP_EMITTERS_BELOW_REQUESTS`."""
    level = 1 if requests >= OPTIMISE_FROM_REQUESTS else 0
    emitters = LOOP_EMITTERS if requests < LOOP_EMITTERS_BELOW_REQUESTS else {}
    return {"xla_backend_optimization_level": level, **COPY_INSERTION, **emitters}


def _compiled(inputs, state, restart, shape: ServingShape, chunk_steps: int, requests: int, sharding=None):
    """The compiled scan for a run of ``requests`` simulated requests in all (:func:`compile_options`), its
    lanes split over ``sharding``'s devices (:func:`_sharding`) or on one device."""
    options = compile_options(requests)
    mesh = None if sharding is None else sharding.mesh
    key = (shape, chunk_steps, tuple(sorted(options.items())), mesh, jax.tree_util.tree_structure(inputs),
           tuple((x.shape, str(x.dtype)) for x in jax.tree_util.tree_leaves(inputs)))
    if key not in _COMPILED:
        _COMPILED[key] = run_batch(shape, chunk_steps, mesh).lower(inputs, state, restart).compile(
            compiler_options=options)
    return _COMPILED[key]


def _state_buffers(inputs: ServingInputs, shape: ServingShape, sharding):
    """Zero buffers for a batch's states, made on the host (no program to compile): the first scan
    call restarts every lane from its initial state."""
    zeros = jax.tree_util.tree_map(lambda s: np.zeros(s.shape, s.dtype), state_shapes(inputs, shape))
    return jax.device_put(zeros, sharding)   # sharding None: the default device


def simulate_batch(inputs: ServingInputs, shape: ServingShape, chunk_steps: int = 512,
                   max_steps: int | None = None, shard: bool = True) -> BatchOutput:
    """Run the array program on a fixed batch of design points (leading axis of every leaf).

    Scans ``chunk_steps`` steps at a time (one compiled program), checking on the host
    whether every point has finished; stops at ``max_steps`` (default: a bound on the number
    of events of the contract), leaving unfinished points ``complete=False``.

    Args:
      inputs: stacked :class:`ServingInputs` ``[G, ...]``.
      shape: their static :class:`ServingShape`.
      chunk_steps: scan steps per compiled call.
      max_steps: give up after this many steps.
      shard: split the points over the local devices (``jax.sharding``, 1-D mesh ``points``)
        when their number divides evenly; the same program runs on one device.
    """
    chunk_steps = checks.integer("chunk_steps", chunk_steps, 1)
    max_steps = int(np.max(_step_budget(inputs, shape))) if max_steps is None else int(max_steps)
    t0 = time.perf_counter()
    g = int(np.shape(inputs.requests.count)[0])
    sharding = _sharding(g, shard)
    inputs = jax.device_put(jax.tree_util.tree_map(np.asarray, inputs), sharding)
    st = _state_buffers(inputs, shape, sharding)
    restart, running = jax.device_put(np.ones(g, bool), sharding), jax.device_put(np.zeros(g, bool), sharding)
    compiled = _compiled(inputs, st, restart, shape, chunk_steps, int(np.sum(np.asarray(inputs.requests.count))),
                         sharding)
    compile_s = time.perf_counter() - t0
    steps = 0
    while True:
        st, done = compiled(inputs, st, restart)
        restart = running
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


class _LanePool:
    """A fixed-width batch of lanes running design points; a finished lane takes the next waiting point.

    Points wait longest-first, so the batch stays full of comparable work and the last lanes to
    finish are short ones; the program is compiled once for the batch width.  A lane taking a new
    point restarts inside the scan's program (:func:`~mocap_jax.wsc.serving_step.restart_lanes`),
    and the inputs of the lanes of each device that has one are put there again from the host: no
    program of its own to compile, and nothing copied to the other devices.
    """

    def __init__(self, packed: list[ServingInputs], shape: ServingShape, width: int, chunk_steps: int, shard: bool):
        self.shape, self.chunk, self.width = shape, chunk_steps, width
        self.waiting = list(range(len(packed)))
        self.packed = packed
        first = [self.waiting.pop(0) for _ in range(min(width, len(packed)))]
        self.lane_point = first + [first[-1]] * (width - len(first))   # spare lanes repeat a point, results unused
        self.point = first + [None] * (width - len(first))
        self.budget = np.asarray([int(_step_budget(packed[k], shape)) for k in self.lane_point])
        self.steps = np.zeros(width, np.int64)
        self.sharding = _sharding(width, shard)
        if self.sharding is None:
            self.shares = [(None, slice(0, width))]
        else:
            index = self.sharding.devices_indices_map((width,))
            self.shares = [(d, index[d][0]) for d in self.sharding.mesh.devices.flat]
        self.host_inputs = [stack_inputs([packed[p] for p in self.lane_point[lanes]]) for _, lanes in self.shares]
        self.device_inputs = [self._put_share(k) for k in range(len(self.shares))]
        self.inputs = self._assemble()
        self.state = _state_buffers(self.inputs, shape, self.sharding)
        self.restart = np.ones(width, bool)
        t0 = time.perf_counter()
        requests = sum(int(np.asarray(x.requests.count)) for x in packed)
        self.compiled = _compiled(self.inputs, self.state, self._flags(), shape, chunk_steps, requests, self.sharding)
        self.compile_s = time.perf_counter() - t0
        self.total_steps = 0

    def _put_share(self, k: int):
        """A copy of the inputs of the lanes of device ``k`` on that device (the host's are rewritten by refills)."""
        device = self.shares[k][0]
        return jax.device_put(self.host_inputs[k], device, may_alias=False)

    def _assemble(self):
        if self.sharding is None:
            return self.device_inputs[0]
        shape = lambda x: (self.width,) + x.shape[1:]
        return jax.tree_util.tree_map(
            lambda *xs: jax.make_array_from_single_device_arrays(shape(xs[0]), self.sharding, list(xs)),
            *self.device_inputs)

    def _flags(self):
        # a copy: the host array may be aliased on a CPU device and is cleared while the scan runs
        return jax.device_put(self.restart.copy(), self.sharding)

    def active(self) -> bool:
        return any(p is not None for p in self.point)

    def run(self) -> list[tuple[int, int, dict]]:
        """Scan one chunk; return ``(lane, point, outputs)`` of the points that finished (or ran out of steps)."""
        self.state, done = self.compiled(self.inputs, self.state, self._flags())
        self.restart[:] = False
        self.total_steps += self.chunk
        self.steps += self.chunk
        done = np.asarray(done)
        ready = [g for g, k in enumerate(self.point) if k is not None and (done[g] or self.steps[g] >= self.budget[g])]
        if not ready:
            return []
        rs, tot = self.state.requests, self.state.totals
        fetch = {"ttft_t": rs.first_token_t, "finish_t": rs.finish_t, "ready_t": rs.ready_t,
                 "pinst": rs.prefill_instance, "dinst": rs.decode_instance, "dropped": rs.dropped,
                 "kv_area": tot.kv_area, "kv_peak": tot.kv_peak, "end_s": tot.last_t, "events": tot.events,
                 "leaped": tot.leaped, "overflow": tot.overflow}
        host = {name: np.asarray(x) for name, x in fetch.items()}
        out = []
        for g in ready:
            row = {name: x[g] for name, x in host.items()}
            row["complete"] = bool(done[g]) and not bool(row["overflow"])
            out.append((g, self.point[g], row))
            self.point[g] = None
        self._refill(ready)
        return out

    def _refill(self, lanes: list[int]) -> None:
        """The next waiting points take the finished ``lanes``, restarting at the next call."""
        for g in lanes[:len(self.waiting)]:
            p = self.waiting.pop(0)
            self.lane_point[g], self.point[g] = p, p
            k = next(k for k, (_, share) in enumerate(self.shares) if share.start <= g < share.stop)
            row = g - self.shares[k][1].start
            jax.tree_util.tree_map(lambda host, new: host.__setitem__(row, new), self.host_inputs[k], self.packed[p])
            self.restart[g] = True
            self.steps[g] = 0
            self.budget[g] = int(_step_budget(self.packed[p], self.shape))
        changed = [k for k, (_, lanes) in enumerate(self.shares) if self.restart[lanes].any()]
        for k in changed:
            self.device_inputs[k] = self._put_share(k)
        if changed:
            self.inputs = self._assemble()


@dataclass
class SimulationReport:
    """:func:`simulate` output: one :class:`~mocap_jax.wsc.metrics.ServingResult` per point plus timing."""

    results: list[ServingResult]
    groups: int                # compiled programs
    wall_s: float
    compile_s: float
    steps: list[int]           # scan steps run
    simulated_requests: int

    @property
    def requests_per_wall_s(self) -> float:
        return self.simulated_requests / self.wall_s if self.wall_s > 0 else math.inf


def expected_steps(setup: ServingSetup, trace: Trace) -> float:
    """What a point's scan steps grow with, to start the longest points first: its requests plus its
    prefill iterations at the token budget.

    A scan step processes at most one prefill event, a few arrivals, and the decode boundaries of
    several instances in parallel, so the prefill side sets a point's length; its output tokens per
    decode instance do not.  On the default exploration (192 simulated points, 32 lanes) this order
    needs 8,960 steps, against 8,760 for perfect packing (the sum of the points' steps / 32).
    """
    return len(trace) + float(np.sum(trace.prompt_tokens)) / setup.config.chunk_tokens


RAW_FIELDS = ("ttft_t", "finish_t", "ready_t", "pinst", "dinst", "dropped")


def simulate(points: Sequence[tuple[ServingSetup, Trace]], dtype=jnp.float32, batch_size: int | None = None,
             chunk_steps: int = 128, keep_raw: bool = False, shard: bool = True, progress=None) -> SimulationReport:
    """Simulate many (setup, trace) design points with the array program.

    Every feasible point shares one static shape (requests padded to the largest trace's
    bucket :func:`~mocap_jax.wsc.serving_inputs.request_bucket`, smaller die grids with empty
    dies), so the call compiles once.  The points run in a batch of ``batch_size`` lanes
    (``jit(vmap)``, sharded over the local devices); every ``chunk_steps`` scan steps the
    finished lanes take the next waiting points, longest first.  Infeasible set-ups become rows
    with infinite latency and zero throughput.

    Args:
      points: ``[(setup, trace), ...]``.
      dtype: float dtype of the program (float64 needs ``jax_enable_x64``).
      batch_size: lanes (default: all points up to 32, rounded up to the device count).
      chunk_steps: scan length between host checks for finished lanes.
      keep_raw: keep the raw per-request times in each result.
      shard: split the lanes over the local devices when their number divides evenly.
      progress: optional callable given ``(points done, points)`` before the program compiles (so a bar
        shows while it does) and as points finish (infeasible set-ups count as done from the start).
    """
    dtype = checks.float_dtype(dtype)
    chunk_steps = checks.integer("chunk_steps", chunk_steps, 1)
    t0 = time.perf_counter()
    results: list[ServingResult | None] = [None] * len(points)
    idx = []
    for k, (setup, trace) in enumerate(points):
        if setup.feasible:
            idx.append(k)
        else:
            results[k] = ServingResult(setup, trace, infeasible_metrics(trace))
    compile_s, steps, simulated = 0.0, [], 0
    if idx:
        n_req = max(request_bucket(len(points[k][1])) for k in idx)
        shape = shape_for([points[k][0] for k in idx], n_req, points[idx[0]][0].config)
        idx = sorted(idx, key=lambda k: (-expected_steps(*points[k]), k))
        ndev = len(jax.local_devices()) if shard else 1
        width = min(len(idx), 32) if batch_size is None else checks.integer("batch_size", batch_size)
        width = -(-width // ndev) * ndev if width >= ndev else width
        done = len(points) - len(idx)
        if progress is not None:
            progress(done, len(points))
        pool = _LanePool([pack_inputs(points[k][0], points[k][1], shape, dtype) for k in idx], shape, width,
                         chunk_steps, shard)
        compile_s = pool.compile_s
        while pool.active():
            finished = pool.run()
            for _, j, row in finished:
                k = idx[j]
                setup, trace = points[k]
                n = len(trace)
                rm = request_metrics(trace, row["ttft_t"][:n], row["finish_t"][:n], row["dropped"][:n])
                met = aggregate_metrics(trace, rm, setup, float(row["kv_area"]), float(row["kv_peak"]),
                                        float(row["end_s"]))
                check_clock(trace, met, dtype, f"design point {k} ({setup.label})")
                met.update(events=int(row["events"]), leaped=int(row["leaped"]), complete=row["complete"])
                raw = {f: row[f][:n] for f in RAW_FIELDS} if keep_raw else None
                results[k] = ServingResult(setup, trace, met, rm, raw)
                simulated += n
            done += len(finished)
            if finished and progress is not None:
                progress(done, len(points))
        steps = [pool.total_steps]
    return SimulationReport(results=results, groups=1 if idx else 0, wall_s=time.perf_counter() - t0,
                            compile_s=compile_s, steps=steps, simulated_requests=simulated)


__all__ = ["BatchOutput", "simulate_batch", "compile_options", "SimulationReport", "simulate", "expected_steps"]
