"""Batched serving simulation of disaggregated prefill/decode serving (DESIGN §10, WSC-LLM part 2).

The semantics (the contract shared with the event-driven reference,
:mod:`mocap_jax.wsc.serving_reference`) are written down in ``docs/wsc_llm.md``,
"Serving semantics".  In short: requests go to the prefill instance with the shortest
FCFS queue; prefill instances run chunked prefill (token budget ``C``, at most ``W``
requests per iteration); a prefilled request's KV is placed by the memory scheduler
(:func:`mocap_jax.wsc.memory.greedy_allocate`) -- or its prefill instance blocks until
memory is freed -- and moves over the mesh to the decode instance with the fewest
unfinished requests; decode instances run continuous batching up to ``batch_cap``
requests, reading KV held on other dies over the mesh (:class:`~mocap_jax.wsc.perf.RemoteKV`).

This module has three layers:

1. **Set-up** (host, per design point): :func:`build_setup` runs the central scheduler's
   offline decisions -- partition (WSC-LLM search, Splitwise-style TP8, or naive), placement
   (decode-centred, packed, random) -- and the memory policy, and turns them into the
   numbers of a :class:`ServingSetup` (layout tables, DRAM budget, TP plans).
2. **Array program**: :func:`simulate_batch` runs ``jit(vmap(lax.scan(step)))`` over design
   points that share a :class:`ServingShape` (static sizes); every number -- hardware,
   model, plans, layout tables, requests -- is a traced leaf of :class:`ServingInputs`.
   One scan step processes one event of the contract (plus fast-forwarded quiet decode
   iterations); fixed-capacity queues and slot tables hold the state.
3. **Metrics** (host): :func:`request_metrics` and :func:`aggregate_metrics` (TTFT, TPOT,
   E2E mean / p50 / p99, tokens/s, goodput, DRAM utilisation).

:func:`simulate` ties them together (grouping design points by static shape, one compiled
program per group).  Units: seconds, bytes, tokens.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..costs import ModelParams
from ..specs import ModelSpec, SpecError, get_model
from . import memory as mem
from . import partition as part
from . import perf
from . import placement as plc
from .hardware import WaferParams, WaferSpec, crosses_nodes, get_wafer, hop_matrix
from .workload import WORKLOAD_PRESETS, Trace, WorkloadSpec

Array = Any
SCHEDULERS = ("wsc", "splitwise", "naive")
PLACEMENTS = ("decode-centred", "packed", "random")
_BIG = 2 ** 30


def _pytree(cls):
    cls = dataclass(frozen=True)(cls)
    return jax.tree_util.register_dataclass(cls, data_fields=[f.name for f in dataclasses.fields(cls)], meta_fields=[])


# =========================================================================== configuration


@dataclass(frozen=True)
class ServingConfig:
    """Serving knobs shared by the set-up and both simulators.

    Attributes:
      chunk_tokens: prefill token budget per iteration ``C``, tokens.
      tpot_slo_s: time-per-output-token SLO, seconds (decode batch cap and goodput).
      ttft_slo_s: time-to-first-token SLO, seconds (partition check and goodput).
      max_batch: largest decode batch (``batch_cap`` is the SLO batch, at most this).
      window: most requests in one prefill iteration ``W`` (static).
      leap: quiet decode boundaries fast-forwarded per scan step ``K`` (static; array only).
      alpha: shared-link factor of the decode-centred placement.
      strategies: TP strategies the WSC-LLM partition may use.
      seed: seed of random placement.
    """

    chunk_tokens: int = 2048
    tpot_slo_s: float = 0.1
    ttft_slo_s: float = 2.0
    max_batch: int = 256
    window: int = 16
    leap: int = 8
    alpha: float = 1.5
    strategies: tuple[str, ...] = perf.STRATEGIES
    seed: int = 0

    def __post_init__(self):
        for name in ("chunk_tokens", "max_batch", "window"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                raise SpecError(f"{name} must be a positive integer, got {v!r}")
        if not isinstance(self.leap, (int, np.integer)) or isinstance(self.leap, bool) or self.leap < 0:
            raise SpecError(f"leap must be an integer >= 0, got {self.leap!r}")
        for name in ("tpot_slo_s", "ttft_slo_s"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0 or not math.isfinite(v):
                raise SpecError(f"{name} must be a positive number of seconds, got {v!r}")
        if not isinstance(self.alpha, (int, float)) or not math.isfinite(self.alpha) or self.alpha < 1:
            raise SpecError(f"alpha must be a number >= 1, got {self.alpha!r}")
        object.__setattr__(self, "strategies", part.validate_strategies(self.strategies))

    def targets(self, dtype=jnp.float32) -> part.ServingTargets:
        return part.ServingTargets.make(self.chunk_tokens, self.tpot_slo_s, self.ttft_slo_s, dtype)


# =========================================================================== set-up (host)


@dataclass
class ServingSetup:
    """One design point's offline decisions and the numbers the simulators read.

    Geometry arrays are over the ``P`` prefill and ``Q`` decode instances of
    :attr:`layout` (in ``layout.prefill`` / ``layout.decode`` order) and the ``D`` dies.

    Attributes:
      label: human-readable system name.
      model, wafer: the specs.
      scheduler, placement, memory_policy: how the decisions were made.
      feasible: False when the model cannot be served (then ``reason`` says why and the
        arrays are absent).
      prefill, decode: instance configs (shape, TP strategy).
      layout: the placed instances.
      batch_cap: decode batch cap (requests).
      prefill_rps, decode_rps: goodput per instance from the partition model, req/s.
      served_rps: ``min(n_p x prefill_rps, n_d x decode_rps)``, the partition's capacity.
      kv_bytes_per_token: KV bytes of one token over all layers (model-level).
      prio: ``[P, Q, D]`` location priority (3 = not allowed).
      cap_allowed: ``[P, Q]`` free bytes (no KV placed) of the dies allowed for the pair.
      free0, resident, capacity: ``[D]`` bytes: free for KV at start, resident (weights,
        workspace, prefill reserve), physical DRAM.
      pq_hops: ``[P, Q]`` hops between centre dies.
      p_die_hops, p_die_internode, p_die_own: ``[P, D]`` from each prefill centre die.
      q_die_hops, q_die_internode: ``[Q, D]`` from each die to the nearest die of a decode instance.
      q_ingress: ``[Q]`` links remote KV reads enter each decode instance by.
      lanes: parallel lanes of a KV transfer (``min`` of the instances' die counts).
      remote: True when some KV may live outside its decode instance.
    """

    label: str
    model: ModelSpec
    wafer: WaferSpec
    scheduler: str
    placement: str
    memory_policy: str
    config: ServingConfig
    feasible: bool = True
    reason: str = ""
    prefill: perf.InstanceConfig | None = None
    decode: perf.InstanceConfig | None = None
    layout: plc.Layout | None = None
    batch_cap: int = 0
    prefill_rps: float = 0.0
    decode_rps: float = 0.0
    served_rps: float = 0.0
    kv_bytes_per_token: float = 0.0
    prio: np.ndarray | None = field(default=None, repr=False)
    cap_allowed: np.ndarray | None = field(default=None, repr=False)
    free0: np.ndarray | None = field(default=None, repr=False)
    resident: np.ndarray | None = field(default=None, repr=False)
    capacity: np.ndarray | None = field(default=None, repr=False)
    pq_hops: np.ndarray | None = field(default=None, repr=False)
    p_die_hops: np.ndarray | None = field(default=None, repr=False)
    p_die_internode: np.ndarray | None = field(default=None, repr=False)
    p_die_own: np.ndarray | None = field(default=None, repr=False)
    q_die_hops: np.ndarray | None = field(default=None, repr=False)
    q_die_internode: np.ndarray | None = field(default=None, repr=False)
    q_ingress: np.ndarray | None = field(default=None, repr=False)
    lanes: float = 1.0
    remote: bool = False

    @property
    def n_prefill(self) -> int:
        return len(self.layout.prefill) if self.layout is not None else 0

    @property
    def n_decode(self) -> int:
        return len(self.layout.decode) if self.layout is not None else 0

    @property
    def dies(self) -> int:
        return self.wafer.num_dies

    def describe(self) -> dict[str, Any]:
        d = {"label": self.label, "model": self.model.name, "hardware": self.wafer.name, "scheduler": self.scheduler,
             "placement": self.placement, "memory": self.memory_policy, "feasible": self.feasible,
             "reason": self.reason}
        if self.feasible:
            d.update(prefill=f"{self.prefill.rows}x{self.prefill.cols}/{self.prefill.strategy}",
                     decode=f"{self.decode.rows}x{self.decode.cols}/{self.decode.strategy}",
                     n_prefill=self.n_prefill, n_decode=self.n_decode, batch_cap=self.batch_cap,
                     served_rps=self.served_rps,
                     dies_used=self.n_prefill * self.prefill.dies + self.n_decode * self.decode.dies)
        return d


def _infeasible(label, model, wafer, scheduler, placement, policy, config, reason) -> ServingSetup:
    return ServingSetup(label=label, model=model, wafer=wafer, scheduler=scheduler, placement=placement,
                        memory_policy=policy, config=config, feasible=False, reason=reason)


def _candidate(model, wafer, workload, config, shape, strategy) -> part.Candidate:
    return part.evaluate_candidates(model, wafer, workload, config.targets(), [strategy], config.max_batch,
                                    shapes=[shape])[0]


def _counts(wafer, pc: part.Candidate, dc: part.Candidate):
    """Balanced counts (part 1 :func:`~mocap_jax.wsc.partition.size_counts`) for fixed shapes."""
    rp = pc.prefill_rps if pc.prefill_rps > 0 else 1e-9
    rd = dc.decode_rps if dc.decode_rps > 0 else 1e-9
    return part.size_counts(wafer, (pc.config.rows, pc.config.cols), rp, (dc.config.rows, dc.config.cols), rd)


def _naive_partition(model, wafer, workload, config):
    """Smallest instance (megatron) that holds the model for both phases; half the instances prefill."""
    for shape in part.instance_shapes(wafer):
        c = _candidate(model, wafer, workload, config, shape, "megatron")
        if c.prefill_fits and c.decode_fits:
            break
    else:
        return None
    n = wafer.num_dies // c.config.dies
    while n >= 2:
        n_p, n_d = (n + 1) // 2, n // 2
        placed = plc.pack_instances(wafer.rows, wafer.cols, [(shape, n_p), (shape, n_d)],
                                    allow_rotation=wafer.is_mesh)
        if placed is not None:
            kinds = ("prefill", "decode")
            return c, c, n_p, n_d, [(kinds[i], r, cc, h, w) for i, r, cc, h, w in placed]
        n -= 1
    return None


def _cluster_priority(wafer: WaferSpec, layout: plc.Layout, policy: str) -> np.ndarray:
    """Location priority on a GPU cluster: 0 the decode GPUs; greedy adds 1 = the rest of its node(s)."""
    d = wafer.num_dies
    node = np.arange(d) // wafer.cols
    table = np.full((len(layout.prefill), len(layout.decode), d), mem.NOT_ALLOWED, dtype=np.int32)
    for q, dq in enumerate(layout.decode):
        ids = np.asarray([r * wafer.cols + c for r, c in dq.cells()])
        row = np.full(d, mem.NOT_ALLOWED, dtype=np.int32)
        if policy == "greedy":
            row[np.isin(node, node[ids])] = 1
        row[ids] = 0
        table[:, q] = row
    return table


_PLACEMENT_CACHE: dict = {}


def build_setup(model: "str | ModelSpec", wafer: "str | WaferSpec", workload: WorkloadSpec,
                scheduler: str = "wsc", memory_policy: str | None = None, placement: str | None = None,
                config: ServingConfig | None = None, label: str | None = None) -> ServingSetup:
    """Offline decisions of one design point: partition, placement, memory policy, tables.

    Args:
      model, wafer: specs or preset names.
      workload: length summary used by the partition's goodput model (its rate is not used).
      scheduler: ``wsc`` (part-1 partition search over shapes and TP strategies, counts
        that balance the phases), ``splitwise`` (TP 8 instances for both phases:
        a whole 8-GPU node on a cluster, a 2x4 rectangle on a wafer; megatron; balanced
        counts) or ``naive`` (the smallest instance that holds the model, megatron,
        half of the instances prefill).
      memory_policy: ``greedy`` (WSC-LLM memory scheduler) or ``local`` (KV only on the
        decode instance); default greedy for ``wsc``, local otherwise.
      placement: ``decode-centred``, ``packed`` (first-free-cell packing) or ``random``;
        default decode-centred for ``wsc`` on a mesh, packed otherwise.
      config: :class:`ServingConfig`.
      label: system name (default ``<hardware>/<scheduler>``).

    Returns:
      A :class:`ServingSetup`; ``feasible=False`` (with a reason) when the model does not fit.

    Raises:
      SpecError: bad names or options (before anything is computed).
    """
    config = config or ServingConfig()
    model = get_model(model)
    wafer = get_wafer(wafer)
    if scheduler not in SCHEDULERS:
        raise SpecError(f"unknown scheduler {scheduler!r}; choose from {', '.join(SCHEDULERS)}")
    policy = memory_policy or ("greedy" if scheduler == "wsc" else "local")
    if policy not in mem.POLICIES:
        raise SpecError(f"unknown memory policy {policy!r}; choose from {', '.join(mem.POLICIES)}")
    placement = placement or ("decode-centred" if scheduler == "wsc" and wafer.is_mesh else "packed")
    if placement not in PLACEMENTS:
        raise SpecError(f"unknown placement {placement!r}; choose from {', '.join(PLACEMENTS)}")
    if placement != "packed" and not wafer.is_mesh:
        raise SpecError(f"placement {placement!r} needs a mesh wafer; {wafer.name} is a GPU cluster (use packed)")
    label = label or f"{wafer.name}/{scheduler}"
    bad = lambda why: _infeasible(label, model, wafer, scheduler, placement, policy, config, why)

    # ---- partition
    if scheduler == "wsc":
        try:
            res = part.partition(model, wafer, workload, strategies=config.strategies,
                                 chunk_tokens=config.chunk_tokens, tpot_slo_s=config.tpot_slo_s,
                                 ttft_slo_s=config.ttft_slo_s, max_batch=config.max_batch)
        except SpecError as e:
            return bad(str(e))
        pc, dc, packing = res.prefill, res.decode, res.packing
    elif scheduler == "splitwise":
        shape = (2, 4) if wafer.is_mesh else (1, min(8, wafer.cols))
        if wafer.is_mesh and not ((2 <= wafer.rows and 4 <= wafer.cols) or (4 <= wafer.rows and 2 <= wafer.cols)):
            return bad(f"a 2x4 TP8 instance does not fit the {wafer.rows}x{wafer.cols} grid")
        pc = _candidate(model, wafer, workload, config, shape, "megatron")
        dc = pc
        if not (pc.prefill_fits and pc.decode_fits):
            return bad(f"{model.name} does not fit a TP8 instance of {wafer.name}")
        try:
            _, _, packing = _counts(wafer, pc, dc)
        except SpecError as e:
            return bad(str(e))
    else:
        naive = _naive_partition(model, wafer, workload, config)
        if naive is None:
            return bad(f"{model.name} does not fit two instances of {wafer.name}")
        pc, dc, _, _, packing = naive

    # ---- placement
    n_p = sum(1 for k, *_ in packing if k == "prefill")
    n_d = sum(1 for k, *_ in packing if k == "decode")
    pshape, dshape = (pc.config.rows, pc.config.cols), (dc.config.rows, dc.config.cols)
    if placement == "decode-centred":
        key = (wafer.rows, wafer.cols, pshape, n_p, dshape, n_d, float(config.alpha))
        if key not in _PLACEMENT_CACHE:  # deterministic in the geometry: reuse across design points
            _PLACEMENT_CACHE[key] = plc.decode_centred_placement(wafer, pshape, n_p, dshape, n_d, config.alpha)
        layout = _PLACEMENT_CACHE[key]
    elif placement == "random":
        layout = plc.random_placement(wafer, pshape, n_p, dshape, n_d, config.seed)
    else:
        layout = plc.Layout(wafer.rows, wafer.cols, tuple(plc.Instance(k, r, c, h, w) for k, r, c, h, w in packing))
    # order: prefill instances first, then decode (indices within each kind follow layout order)
    try:
        budget = mem.die_budget(model, wafer, layout, pc.config, dc.config, config.chunk_tokens, config.max_batch,
                                float(workload.max_prompt))
    except SpecError as e:
        return bad(str(e))

    # ---- tables
    d = wafer.num_dies
    prio = mem.priority_table(wafer, layout, policy) if wafer.is_mesh else _cluster_priority(wafer, layout, policy)
    allowed = prio < mem.NOT_ALLOWED
    cap_allowed = np.einsum("pqd,d->pq", allowed.astype(float), budget.free)
    hm = hop_matrix(wafer).astype(float)
    xn = crosses_nodes(wafer).astype(float)
    pre_c = layout.centre_dies("prefill")
    dec_c = layout.centre_dies("decode")
    own = np.zeros((len(pre_c), d), bool)
    for p, inst in enumerate(layout.prefill):
        for r, c in inst.cells():
            own[p, r * wafer.cols + c] = True
    q_hops = np.zeros((len(dec_c), d))
    q_inter = np.zeros((len(dec_c), d))
    ingress = np.zeros(len(dec_c))
    for q, inst in enumerate(layout.decode):
        ids = [r * wafer.cols + c for r, c in inst.cells()]
        q_hops[q] = hm[:, ids].min(axis=1)
        q_inter[q] = xn[:, ids].min(axis=1)
        if wafer.is_mesh:
            ingress[q] = float(mem.remote_kv(wafer, layout, q, np.zeros(d)).ingress_links)
        else:
            ingress[q] = len(ids)  # one NVLink port per GPU
    kv_tok = float(model.kv_bytes_per_token_layer(wafer.kv_bytes) * model.layers)
    batch_cap = int(max(1, min(int(dc.decode_batch_slo), config.max_batch)))
    remote = bool(np.any(allowed & (q_hops[None, :, :] > 0)))
    return ServingSetup(
        label=label, model=model, wafer=wafer, scheduler=scheduler, placement=placement, memory_policy=policy,
        config=config, prefill=pc.config, decode=dc.config, layout=layout, batch_cap=batch_cap,
        prefill_rps=pc.prefill_rps, decode_rps=dc.decode_rps,
        served_rps=min(n_p * pc.prefill_rps, n_d * dc.decode_rps), kv_bytes_per_token=kv_tok,
        prio=prio.astype(np.int32), cap_allowed=cap_allowed, free0=budget.free.astype(float),
        resident=budget.resident.astype(float), capacity=budget.capacity.astype(float),
        pq_hops=hm[np.ix_(pre_c, dec_c)].astype(np.int32), p_die_hops=hm[pre_c], p_die_internode=xn[pre_c],
        p_die_own=own, q_die_hops=q_hops, q_die_internode=q_inter, q_ingress=ingress,
        lanes=float(min(pc.config.dies, dc.config.dies)), remote=remote)


def workload_for(trace: Trace) -> WorkloadSpec:
    """The length summary the partition uses for a trace: the preset of a synthetic trace, else its own."""
    if trace.name in WORKLOAD_PRESETS:
        return WORKLOAD_PRESETS[trace.name].with_rate(trace.rate if math.isfinite(trace.rate) else 1.0)
    return trace.to_workload()


# =========================================================================== traced inputs


@dataclass(frozen=True)
class ServingShape:
    """Static sizes of a batched serving program (hashable; one compiled program each).

    Attributes:
      requests: N.  dies: D.  prefill, decode: P_max, Q_max instances (padded).
      slots: B, decode slots per instance (>= every point's batch cap).
      window: W, requests per prefill iteration.  leap: K, fast-forwarded quiet decode boundaries.
      remote: model remote KV reads (False when every point keeps KV on its decode instance).
      admit: finishes / admissions processed per scan step (more continue in the next step at
        the same time; no effect on results).
    """

    requests: int
    dies: int
    prefill: int
    decode: int
    slots: int
    window: int
    leap: int
    remote: bool
    admit: int = 8


@_pytree
class ServingInputs:
    """Every number of one design point (leaves ``[...]``; batched with a leading axis for ``vmap``).

    Fields: ``model`` (:class:`~mocap_jax.costs.ModelParams`), ``hw``
    (:class:`~mocap_jax.wsc.hardware.WaferParams`), ``pplan`` / ``dplan`` (prefill / decode
    :class:`~mocap_jax.wsc.perf.TPPlan`), scalars ``chunk`` (tokens), ``batch_cap``
    (requests, int32), ``kv_bytes_per_token`` (bytes), ``lanes``; instance masks
    ``pre_valid [P]``, ``dec_valid [Q]``; the :class:`ServingSetup` tables (padded:
    ``prio [P, Q, D]``, ``cap_allowed [P, Q]``, ``free0 [D]``, ``resident [D]``,
    ``pq_hops [P, Q]``, ``p_die_hops / p_die_internode / p_die_own [P, D]``,
    ``q_die_hops / q_die_internode [Q, D]``, ``q_ingress [Q]``); requests ``arrival``
    (s), ``prompt``, ``output`` (tokens) ``[N]`` sorted by arrival, of which the first
    ``n_valid`` (int32) are real (the rest is padding that never arrives).
    """

    model: Any
    hw: Any
    pplan: Any
    dplan: Any
    chunk: Array
    batch_cap: Array
    kv_bytes_per_token: Array
    lanes: Array
    pre_valid: Array
    dec_valid: Array
    prio: Array
    cap_allowed: Array
    free0: Array
    resident: Array
    pq_hops: Array
    p_die_hops: Array
    p_die_internode: Array
    p_die_own: Array
    q_die_hops: Array
    q_die_internode: Array
    q_ingress: Array
    n_valid: Array
    arrival: Array
    prompt: Array
    output: Array


def request_bucket(n: int) -> int:
    """Static request capacity for a trace of ``n`` requests: the next of 64, 96, 128, 192, 256, 384, ..."""
    b = 64
    while b < n:
        b = b * 3 // 2 if (b & (b - 1)) == 0 else b * 4 // 3
    return b


def _bucket(n: int, minimum: int = 8) -> int:
    """Round up to 8, 16, 32, 48, 64, 96, 128, ... (few distinct compiled shapes)."""
    n = max(int(n), minimum)
    b = 8
    while b < n:
        b = b * 3 // 2 if (b & (b - 1)) == 0 and b >= 32 else (b * 4 // 3 if b >= 48 else b * 2)
    return b


def shape_for(setups: Sequence[ServingSetup], requests: int, config: ServingConfig) -> ServingShape:
    """The smallest static shape that holds every (feasible) setup of a group.

    Set-ups with fewer dies than the largest are padded with dies that hold nothing and
    accept no KV, so wafers of different grids and GPU clusters can share one program.
    """
    ok = [s for s in setups if s.feasible]
    if not ok:
        raise SpecError("no feasible design point to simulate")
    return ServingShape(requests=int(requests), dies=max(s.dies for s in ok), prefill=_bucket(max(s.n_prefill for s in ok), 1),
                        decode=_bucket(max(s.n_decode for s in ok), 1),
                        slots=_bucket(max(s.batch_cap for s in ok)), window=config.window, leap=config.leap,
                        remote=any(s.remote for s in ok))


def pack_inputs(setup: ServingSetup, trace: Trace, shape: ServingShape, dtype=jnp.float32) -> ServingInputs:
    """Numbers of one (setup, trace) point, padded to ``shape`` (host numpy arrays)."""
    if not setup.feasible:
        raise SpecError(f"{setup.label}: infeasible design point ({setup.reason})")
    n = len(trace)
    if n > shape.requests:
        raise SpecError(f"trace has {n} requests but the shape holds {shape.requests}")
    P, Q, D = shape.prefill, shape.decode, shape.dies
    n_p, n_d = setup.n_prefill, setup.n_decode
    if n_p > P or n_d > Q or setup.dies > D or setup.batch_cap > shape.slots:
        raise SpecError(f"{setup.label} does not fit the shape {shape}")
    f = lambda x: np.asarray(x, dtype=dtype)

    def pad(x, shp, fill, dt):
        out = np.full(shp, fill, dtype=dt)
        out[tuple(slice(0, n) for n in np.shape(x))] = x
        return out

    return ServingInputs(
        model=perf.model_params(setup.model, dtype), hw=WaferParams.from_spec(setup.wafer, dtype),
        pplan=perf.tp_plan(setup.model, setup.wafer, setup.prefill, dtype),
        dplan=perf.tp_plan(setup.model, setup.wafer, setup.decode, dtype),
        chunk=f(setup.config.chunk_tokens), batch_cap=np.asarray(setup.batch_cap, np.int32),
        kv_bytes_per_token=f(setup.kv_bytes_per_token), lanes=f(setup.lanes),
        pre_valid=np.arange(P) < n_p, dec_valid=np.arange(Q) < n_d,
        prio=pad(setup.prio, (P, Q, D), mem.NOT_ALLOWED, np.int32), cap_allowed=pad(setup.cap_allowed, (P, Q), 0, dtype),
        free0=pad(setup.free0, (D,), 0, dtype), resident=pad(setup.resident, (D,), 0, dtype), pq_hops=pad(setup.pq_hops, (P, Q), 0, np.int32),
        p_die_hops=pad(setup.p_die_hops, (P, D), 0, dtype), p_die_internode=pad(setup.p_die_internode, (P, D), 0, dtype),
        p_die_own=pad(setup.p_die_own, (P, D), False, bool), q_die_hops=pad(setup.q_die_hops, (Q, D), 0, dtype),
        q_die_internode=pad(setup.q_die_internode, (Q, D), 0, dtype), q_ingress=pad(setup.q_ingress, (Q,), 1, dtype),
        n_valid=np.asarray(n, np.int32),
        arrival=f(np.pad(trace.arrival_s, (0, shape.requests - n), mode="edge")),
        prompt=f(np.pad(trace.prompt_tokens, (0, shape.requests - n), constant_values=1)),
        output=f(np.pad(trace.output_tokens, (0, shape.requests - n), constant_values=1)))


def stack_inputs(items: Sequence[ServingInputs]) -> ServingInputs:
    """Stack per-point inputs along a new leading axis (for ``vmap``)."""
    return jax.tree_util.tree_map(lambda *xs: np.stack(xs), *items)


# =========================================================================== the array program


def _init_state(inp: ServingInputs, sh: ServingShape):
    N, D, P, Q, B = sh.requests, sh.dies, sh.prefill, sh.decode, sh.slots
    ft = inp.arrival.dtype
    inf = jnp.asarray(jnp.inf, ft)
    zi = lambda *s: jnp.zeros(s, jnp.int32)
    return {
        "t_last": inp.arrival[0], "kv_area": jnp.zeros((), ft), "kv_peak": jnp.zeros((), ft),
        "arr_ptr": jnp.zeros((), jnp.int32), "free": inp.free0, "alloc": jnp.zeros((N, D), ft),
        "pq": zi(P, N), "p_head": zi(P), "p_tail": zi(P), "p_pend": zi(P), "p_prog": jnp.zeros(P, ft),
        "p_busy": jnp.zeros(P, bool), "p_next": jnp.full(P, inf), "p_ncomp": zi(P), "p_nprog": jnp.zeros(P, ft),
        "dq": zi(Q, N), "d_head": zi(Q), "d_tail": zi(Q), "d_load": zi(Q), "d_next": jnp.full(Q, inf),
        "d_mid": jnp.zeros(Q, bool), "d_rt": jnp.zeros((Q, D), ft), "d_fr": jnp.zeros((Q, D), ft),
        "slot_req": jnp.full((Q, B), -1, jnp.int32), "slot_gen": jnp.zeros((Q, B), ft),
        "slot_prompt": jnp.zeros((Q, B), ft), "slot_out": jnp.zeros((Q, B), ft),
        "ttft_t": jnp.full(N, inf), "finish_t": jnp.full(N, inf), "ready_t": jnp.full(N, inf),
        "pinst": jnp.full(N, -1, jnp.int32), "dinst": jnp.full(N, -1, jnp.int32), "dropped": jnp.zeros(N, bool),
        "events": jnp.zeros((), jnp.int32), "leaped": jnp.zeros((), jnp.int32), "overflow": jnp.zeros((), bool),
    }


def greedy_allocate_pairwise(free, need, priority):
    """:func:`mocap_jax.wsc.memory.greedy_allocate` without sorting (same rule, same result up to rounding).

    Dies are taken in the order (priority, most free first, lowest index); the bytes
    before die ``d`` in that order are summed from an ``[D, D]`` comparison instead of a
    cumulative sum over a sorted copy, which compiles much faster inside the scan.

    Args:
      free: ``[D]`` free bytes.  need: bytes to place.  priority: ``[D]`` (3 = not allowed).

    Returns:
      (alloc ``[D]`` bytes, placed bool); all or nothing.
    """
    allowed = priority < mem.NOT_ALLOWED
    f = jnp.where(allowed, free, 0.0)
    idx = jnp.arange(f.shape[0])
    pj, pd = priority[:, None], priority[None, :]
    fj, fd = f[:, None], f[None, :]
    before = (pj < pd) | ((pj == pd) & ((fj > fd) | ((fj == fd) & (idx[:, None] < idx[None, :]))))
    taken_before = jnp.sum(jnp.where(before, fj, 0.0), axis=0)
    placed = jnp.sum(f) >= need
    take = jnp.clip(need - taken_before, 0.0, f)
    return jnp.where(placed, take, 0.0), placed


def _set(x, i, v, do):
    """``x[i] = v`` where ``do`` (row update, cheap under vmap)."""
    return x.at[i].set(jnp.where(do, v, x[i]))


def _decode_event(inp: ServingInputs, st, q, t, do, t_arr, sh: ServingShape):
    """Boundary of decode instance ``q`` at ``t`` (contract: finishes, admission, next iteration).

    Returns the state after finishes and admission and the data of the next iteration
    (its duration is evaluated with the prefill's in one call, :func:`_step`).

    At most ``sh.admit`` finishes and ``sh.admit`` admissions are processed per scan step;
    when a boundary has more, the instance keeps its event at ``t`` (``d_mid``) and the next
    step continues the same boundary (same time, same place in the event order), so the
    contract is unchanged while the per-step work stays ``O(admit x D)``.  The batch's KV
    context per die (``d_rt``) and allocation shares (``d_fr``) are kept incrementally.
    """
    N, B, K, A = sh.requests, sh.slots, sh.leap, sh.admit
    ft = inp.arrival.dtype
    inf = jnp.asarray(jnp.inf, ft)
    i32 = jnp.int32
    sr = st["slot_req"][q]
    act = sr >= 0
    out = st["slot_out"][q]               # per-slot prompt / output lengths (no gathers from [N])
    mid = st["d_mid"][q]
    ended = ~mid & jnp.any(act)            # an iteration ends now: every request gains a token
    gen = st["slot_gen"][q] + jnp.where(act & ended, 1.0, 0.0).astype(ft)
    rt, fr = st["d_rt"][q], st["d_fr"][q]
    if sh.remote:
        rt = rt + jnp.where(ended, 1.0, 0.0).astype(ft) * fr
    # finishes (at most A this step)
    fin_all = act & (gen >= out)
    rank_f = jnp.cumsum(fin_all.astype(i32)) - 1
    fin = fin_all & (rank_f < A) & do
    more_fin = jnp.sum(fin_all, dtype=i32) > A
    fslot = jnp.nonzero(fin, size=A, fill_value=B)[0]
    fvalid = fslot < B
    freq = jnp.where(fvalid, sr[jnp.clip(fslot, 0, B - 1)], N)
    frows = st["alloc"][jnp.clip(freq, 0, N - 1)] * fvalid[:, None].astype(ft)      # [A, D]
    free = st["free"] + jnp.sum(frows, axis=0)
    finish_t = st["finish_t"].at[freq].set(t, mode="drop")
    nfin = jnp.sum(fin, dtype=i32)
    d_load = st["d_load"].at[q].add(-nfin)
    if sh.remote:
        fs, fo = inp.prompt[jnp.clip(freq, 0, N - 1)], inp.output[jnp.clip(freq, 0, N - 1)]
        outside = (inp.q_die_hops[q] > 0).astype(ft)
        ffrac = frows / ((fs + fo) * inp.kv_bytes_per_token)[:, None]
        rt = rt - jnp.sum((fs + fo)[:, None] * ffrac, axis=0) * outside
        fr = fr - jnp.sum(ffrac, axis=0) * outside
    act2 = act & ~fin
    # admission from the FCFS queue head while KV has arrived and the batch has room (at most A)
    room = jnp.maximum(inp.batch_cap - jnp.sum(act2, dtype=i32), 0)
    head, tail = st["d_head"][q], st["d_tail"][q]
    pos = head + jnp.arange(A + 1, dtype=i32)
    valid = pos < tail
    cand = st["dq"][q, jnp.clip(pos, 0, N - 1)]
    cready = jnp.where(valid, st["ready_t"][jnp.where(valid, cand, 0)], inf)
    n_ready = jnp.sum(jnp.cumprod((cready <= t).astype(i32)), dtype=i32)
    admit_now = do & ~more_fin
    n_adm = jnp.where(admit_now, jnp.minimum(jnp.minimum(n_ready, room), A), 0)
    more_adm = admit_now & (n_ready > A) & (room > A)
    empty = ~act2
    rank = jnp.cumsum(empty.astype(i32)) - 1
    take = empty & (rank < n_adm)
    jn = jnp.arange(A + 1) < n_adm
    jreq = jnp.where(jn, cand, 0)
    js, jo = inp.prompt[jreq], inp.output[jreq]
    crank = jnp.clip(rank, 0, A)
    new_req = jnp.where(take, cand[crank], jnp.where(act2, sr, -1))
    new_gen = jnp.where(take, 1.0, jnp.where(act2, gen, 0.0)).astype(ft)
    new_pr = jnp.where(take, js[crank], jnp.where(act2, st["slot_prompt"][q], 0.0))
    new_out = jnp.where(take, jo[crank], jnp.where(act2, out, 0.0))
    head2 = head + n_adm
    if sh.remote:
        jfrac = st["alloc"][jreq] / ((js + jo) * inp.kv_bytes_per_token)[:, None] * jn[:, None].astype(ft)
        rt = rt + jnp.sum((js + 1.0)[:, None] * jfrac, axis=0) * outside
        fr = fr + jnp.sum(jfrac, axis=0) * outside
        rt = jnp.maximum(rt, 0.0)
        fr = jnp.maximum(fr, 0.0)
    cont = more_fin | more_adm                # the boundary continues next step at the same time
    # the batch that runs next
    act3 = new_req >= 0
    n = jnp.sum(act3, dtype=i32).astype(ft)
    c1 = jnp.sum(jnp.where(act3, new_pr + new_gen, 0.0))
    r_min = jnp.min(jnp.where(act3, new_out - new_gen, inf))
    h_valid = head2 < tail
    h_ready = jnp.where(h_valid, st["ready_t"][st["dq"][q, jnp.clip(head2, 0, N - 1)]], inf)
    join_possible = h_valid & (n < inp.batch_cap.astype(ft))
    # retries of blocked prefill instances when memory was freed
    blocked = inp.pre_valid & ~st["p_busy"] & (st["p_pend"] > 0)
    p_next = jnp.where(do & (nfin > 0) & blocked, t, st["p_next"])
    others = jnp.where(jnp.arange(sh.decode) == q, inf, st["d_next"])
    bound = jnp.minimum(jnp.minimum(t_arr, jnp.min(p_next)), jnp.where(jnp.any(blocked), jnp.min(others), inf))
    st = dict(st)
    st.update(
        finish_t=finish_t, free=jnp.where(do, free, st["free"]), d_load=d_load, p_next=p_next,
        slot_req=_set(st["slot_req"], q, new_req, do), slot_gen=_set(st["slot_gen"], q, new_gen, do),
        slot_prompt=_set(st["slot_prompt"], q, new_pr, do), slot_out=_set(st["slot_out"], q, new_out, do),
        d_head=_set(st["d_head"], q, head2, do), d_mid=_set(st["d_mid"], q, cont, do),
        d_rt=_set(st["d_rt"], q, rt, do), d_fr=_set(st["d_fr"], q, fr, do))
    post = {"q": q, "do": do, "t": t, "n": n, "c1": c1, "rt": rt, "fr": fr, "r_min": r_min, "cont": cont,
            "join_possible": join_possible, "h_ready": h_ready, "bound": bound, "act": act3}
    return st, post


def _decode_iterations(inp: ServingInputs, post, sh: ServingShape):
    """Aggregates of the decode iteration just started and the K after it (``[K + 1]`` each)."""
    ft = inp.arrival.dtype
    q, n = post["q"], post["n"]
    j = jnp.arange(sh.leap + 1, dtype=ft)
    ctx = post["c1"] + j * n
    if sh.remote:
        rt = post["rt"][None, :] + j[:, None] * post["fr"][None, :]
        hops, inter, ingress = inp.q_die_hops[q], inp.q_die_internode[q], inp.q_ingress[q]
        remote = jax.vmap(lambda r: perf.remote_kv_time(
            inp.model, inp.hw, inp.dplan, perf.RemoteKV(tokens=r, hops=hops, internode=inter, ingress_links=ingress)))(rt)
        local = jnp.maximum(ctx - jnp.sum(rt, axis=1), 0.0)
    else:
        remote = jnp.zeros_like(ctx)
        local = jnp.maximum(ctx, 0.0)
    tokens = jnp.full_like(ctx, n)
    return tokens, ctx, local, tokens, remote  # (tokens, attention pairs, local KV tokens, LM-head tokens, remote)


def _decode_finish(inp: ServingInputs, st, post, dts, sh: ServingShape):
    """Fast-forward quiet boundaries and set the instance's next event (contract: no event reordered)."""
    K = sh.leap
    ft = inp.arrival.dtype
    q, do, t, n = post["q"], post["do"], post["t"], post["n"]
    dts = jnp.where(n > 0, dts, 0.0)
    ends = t + jnp.cumsum(dts)
    jj = jnp.arange(1, K + 1, dtype=ft)
    quiet = (jj < post["r_min"]) & ~(post["join_possible"] & (post["h_ready"] <= ends[:K])) & (ends[:K] < post["bound"])
    k = jnp.where(post["cont"], 0, jnp.sum(jnp.cumprod(quiet.astype(jnp.int32)), dtype=jnp.int32))
    nxt = jnp.where(post["cont"], t, jnp.where(n > 0, ends[k], post["h_ready"]))
    kf = k.astype(ft)
    st = dict(st)
    gen = st["slot_gen"][q] + jnp.where(post["act"], kf, 0.0)
    st.update(slot_gen=_set(st["slot_gen"], q, gen, do), d_next=_set(st["d_next"], q, nxt, do),
              leaped=st["leaped"] + jnp.where(do, k, 0))
    if sh.remote:
        st["d_rt"] = _set(st["d_rt"], q, post["rt"] + kf * post["fr"], do)
    return st


def _arrival_event(inp: ServingInputs, st, t, do, sh: ServingShape):
    """Arrival of the next request: shortest prefill queue (ties: lowest index)."""
    N, P = sh.requests, sh.prefill
    i = jnp.clip(st["arr_ptr"], 0, N - 1)
    qlen = jnp.where(inp.pre_valid, st["p_tail"] - st["p_head"], _BIG)
    p = jnp.argmin(qlen).astype(jnp.int32)
    tail = st["p_tail"][p]
    idle = ~st["p_busy"][p] & (st["p_pend"][p] == 0)
    st = dict(st)
    st.update(
        pq=st["pq"].at[jnp.where(do, p, P), tail].set(i, mode="drop"),
        overflow=st["overflow"] | (do & (tail >= N)),
        p_tail=st["p_tail"].at[p].add(do.astype(jnp.int32)),
        pinst=st["pinst"].at[jnp.where(do, i, N)].set(p, mode="drop"),
        p_next=_set(st["p_next"], p, t, do & idle),
        arr_ptr=st["arr_ptr"] + do.astype(jnp.int32))
    return st


def _prefill_event(inp: ServingInputs, st, p, t, do, sh: ServingShape):
    """Event of prefill instance ``p`` at ``t``: iteration end, KV placement, next iteration."""
    N, Q, W = sh.requests, sh.decode, sh.window
    ft = inp.arrival.dtype
    inf = jnp.asarray(jnp.inf, ft)
    hw = inp.hw
    busy = st["p_busy"][p]
    head0 = st["p_head"][p]
    tail = st["p_tail"][p]
    kk = jnp.arange(W, dtype=jnp.int32)
    # 1. the iteration that ends now: its completed requests emit their first token
    ncomp = jnp.where(busy, st["p_ncomp"][p], 0)
    ids_done = st["pq"][p, jnp.clip(head0 + st["p_pend"][p] + kk, 0, N - 1)]
    ttft_t = st["ttft_t"].at[jnp.where(do & (kk < ncomp), ids_done, N)].set(t, mode="drop")
    pend0 = st["p_pend"][p] + ncomp
    prog = jnp.where(busy, st["p_nprog"][p], st["p_prog"][p])
    # 2. placement of prefilled requests, FCFS, until one does not fit.  The loop carries only
    #    small arrays (decisions of at most W placements); the big tables are scattered after it.
    own = inp.p_die_own[p]
    qidx = jnp.arange(Q, dtype=jnp.int32)
    slot_empty = jnp.all(st["slot_req"] < 0, axis=1)  # [Q] decode instances with an empty batch
    D = sh.dies

    def cond(c):
        k, _, _, _, head, pend, blocked, _ = c
        return (k < W) & do & ~blocked & (pend > 0)

    def place(c):
        k, free, d_load, d_tail, head, pend, blocked, rec = c
        i = st["pq"][p, jnp.clip(head, 0, N - 1)]
        s_i, o_i = inp.prompt[i], inp.output[i]
        one = o_i <= 1.0
        load = jnp.where(inp.dec_valid, d_load, _BIG)
        key = jnp.where(load == jnp.min(load), inp.pq_hops[p] * Q + qidx, _BIG)  # fewest unfinished, hops, index
        q = jnp.argmin(key).astype(jnp.int32)
        need = (s_i + o_i) * inp.kv_bytes_per_token
        drop = ~one & (need > inp.cap_allowed[p, q])
        row, ok = greedy_allocate_pairwise(free, need, inp.prio[p, q])
        placed = ~one & ~drop & ok
        row = jnp.where(placed, row, 0.0)
        free = jnp.maximum(free - row, 0.0)
        tgt = (row > 0) & ~own
        moved = jnp.sum(jnp.where(tgt, row, 0.0))
        hops = jnp.max(jnp.where(tgt, inp.p_die_hops[p], 0.0))
        inter = jnp.max(jnp.where(tgt, inp.p_die_internode[p], 0.0))
        bw = jnp.where(inter > 0, hw.node_bandwidth, hw.link_bandwidth) * hw.eff_link
        lat = jnp.maximum(hops * hw.link_latency_s, inter * hw.node_latency_s)
        ready = t + jnp.where(moved > 0, lat + moved / (inp.lanes * bw), 0.0)
        qt = d_tail[q]
        kind = jnp.where(placed, 1, jnp.where(one, 2, jnp.where(drop, 3, 0)))
        rec = {"row": rec["row"].at[k].set(row), "i": rec["i"].at[k].set(i), "q": rec["q"].at[k].set(q),
               "pos": rec["pos"].at[k].set(qt), "ready": rec["ready"].at[k].set(ready),
               "kind": rec["kind"].at[k].set(kind)}
        d_tail = d_tail.at[q].add(placed.astype(jnp.int32))
        d_load = d_load.at[q].add(placed.astype(jnp.int32))
        pop = (kind > 0).astype(jnp.int32)
        return k + 1, free, d_load, d_tail, head + pop, pend - pop, blocked | (kind == 0), rec

    rec0 = {"row": jnp.zeros((W, D), ft), "i": jnp.full(W, N, jnp.int32), "q": jnp.full(W, Q, jnp.int32),
            "pos": jnp.zeros(W, jnp.int32), "ready": jnp.zeros(W, ft), "kind": jnp.zeros(W, jnp.int32)}
    carry = (jnp.zeros((), jnp.int32), st["free"], st["d_load"], st["d_tail"], head0, pend0, jnp.zeros((), bool), rec0)
    _, free, d_load, d_tail, head, pend, _, rec = jax.lax.while_loop(cond, place, carry)
    placed = rec["kind"] == 1
    ip = jnp.where(placed, rec["i"], N)
    alloc = st["alloc"].at[ip].set(rec["row"], mode="drop")
    dq = st["dq"].at[jnp.where(placed, rec["q"], Q), rec["pos"]].set(rec["i"], mode="drop")
    ovf = st["overflow"] | jnp.any(placed & (rec["pos"] >= N))
    ready_t = st["ready_t"].at[ip].set(rec["ready"], mode="drop")
    dinst = st["dinst"].at[ip].set(rec["q"], mode="drop")
    finish_t = st["finish_t"].at[jnp.where(rec["kind"] == 2, rec["i"], N)].set(t, mode="drop")
    dropped = st["dropped"].at[jnp.where(rec["kind"] == 3, rec["i"], N)].set(True, mode="drop")
    # an idle decode instance with an empty queue wakes when the first placed request's KV arrives
    qc = jnp.clip(rec["q"], 0, Q - 1)
    first = placed & (rec["pos"] == st["d_head"][qc]) & slot_empty[qc]
    d_next = st["d_next"].at[jnp.where(first, rec["q"], Q)].set(rec["ready"], mode="drop")
    # 3. next iteration: FCFS over at most W queued requests, chunk budget C
    pos = head + kk
    valid = pos < tail
    ids = st["pq"][p, jnp.clip(pos, 0, N - 1)]
    done = jnp.where(kk == 0, prog, 0.0)
    rem = jnp.where(valid, inp.prompt[ids] - done, 0.0)
    chunk = jnp.clip(inp.chunk - (jnp.cumsum(rem) - rem), 0.0, rem)
    last = valid & (rem > 0) & (chunk >= rem)
    n_new = jnp.sum(jnp.cumprod(last.astype(jnp.int32)), dtype=jnp.int32)
    nxt_chunk = chunk[jnp.clip(n_new, 0, W - 1)]
    nprog = jnp.where(n_new < W, jnp.where(n_new == 0, prog, 0.0) + nxt_chunk, 0.0)
    start = (pend == 0) & jnp.any(valid)
    st = dict(st)
    st.update(
        ttft_t=ttft_t, free=free, alloc=alloc, d_load=d_load, dq=dq, d_tail=d_tail, d_next=d_next, ready_t=ready_t,
        dinst=dinst, finish_t=finish_t, dropped=dropped, overflow=ovf,
        p_head=_set(st["p_head"], p, head, do), p_pend=_set(st["p_pend"], p, pend, do),
        p_prog=_set(st["p_prog"], p, prog, do), p_busy=_set(st["p_busy"], p, start, do),
        p_ncomp=_set(st["p_ncomp"], p, n_new, do & start), p_nprog=_set(st["p_nprog"], p, nprog, do & start))
    # aggregates of the iteration that starts (perf.prefill_iteration_time), evaluated in _step
    c = jnp.where(valid, chunk, 0.0)
    pre = jnp.where(valid, done, 0.0)
    agg = (jnp.sum(c), jnp.sum(c * (pre + (c + 1.0) / 2.0)), jnp.sum(jnp.where(c > 0, pre + c, 0.0)),
           jnp.sum(valid & last, dtype=jnp.int32).astype(ft))
    post = {"p": p, "do": do, "t": t, "start": start, "agg": agg}
    return st, post


def _prefill_finish(inp: ServingInputs, st, post, dt):
    ft = inp.arrival.dtype
    p, do, t = post["p"], post["do"], post["t"]
    dt = jnp.where(post["agg"][0] > 0, dt, 0.0)
    st = dict(st)
    st["p_next"] = _set(st["p_next"], p, jnp.where(post["start"], t + dt, jnp.asarray(jnp.inf, ft)), do)
    return st


def _step(inp: ServingInputs, st, sh: ServingShape):
    """Process the earliest event (ties: decode < arrival < prefill, then index)."""
    N = sh.requests
    ft = inp.arrival.dtype
    inf = jnp.asarray(jnp.inf, ft)
    qd = jnp.argmin(st["d_next"]).astype(jnp.int32)
    pp = jnp.argmin(st["p_next"]).astype(jnp.int32)
    t_d, t_p = st["d_next"][qd], st["p_next"][pp]
    t_a = jnp.where(st["arr_ptr"] < inp.n_valid, inp.arrival[jnp.clip(st["arr_ptr"], 0, N - 1)], inf)
    t = jnp.minimum(jnp.minimum(t_d, t_a), t_p)
    live = jnp.isfinite(t)
    do_d = live & (t_d <= t)
    do_a = live & ~do_d & (t_a <= t)
    do_p = live & ~do_d & ~do_a
    kv = jnp.sum(inp.free0 - st["free"])
    st = dict(st)
    st["kv_area"] = st["kv_area"] + jnp.where(live, kv * (t - st["t_last"]), 0.0)
    st["t_last"] = jnp.where(live, t, st["t_last"])
    st, dpost = _decode_event(inp, st, qd, t, do_d, t_a, sh)
    st = _arrival_event(inp, st, t, do_a, sh)
    st, ppost = _prefill_event(inp, st, pp, t, do_p, sh)
    # one vmapped evaluation of the instance cost model (perf._iteration_time) for the K + 1 decode
    # iterations and the prefill iteration: the same numbers as perf.decode_time /
    # perf.prefill_iteration_time, compiled once
    dargs = _decode_iterations(inp, dpost, sh)
    pargs = ppost["agg"] + (jnp.zeros((), ft),)
    args = [jnp.concatenate([d, jnp.reshape(x, (1,)).astype(ft)]) for d, x in zip(dargs, pargs)]
    plans = jax.tree_util.tree_map(
        lambda d, p: jnp.concatenate([jnp.broadcast_to(d, (sh.leap + 1,) + jnp.shape(d)), jnp.reshape(p, (1,) + jnp.shape(p))]),
        inp.dplan, inp.pplan)
    times = jax.vmap(perf._iteration_time, in_axes=(None, None, 0, 0, 0, 0, 0, 0))(inp.model, inp.hw, plans, *args)
    st = _decode_finish(inp, st, dpost, times[:sh.leap + 1], sh)
    st = _prefill_finish(inp, st, ppost, times[sh.leap + 1])
    st["kv_peak"] = jnp.maximum(st["kv_peak"], jnp.sum(inp.free0 - st["free"]))
    st["events"] = st["events"] + live.astype(jnp.int32)
    return st


def _done(inp, st, sh: ServingShape):
    return (st["arr_ptr"] >= inp.n_valid) & ~jnp.any(jnp.isfinite(st["p_next"])) & \
        ~jnp.any(jnp.isfinite(st["d_next"]))


@partial(jax.jit, static_argnames=("sh",))
def _init_batch(inp, sh):
    return jax.vmap(lambda x: _init_state(x, sh))(inp)


@partial(jax.jit, static_argnames=("sh", "steps"), donate_argnums=(1,))
def _run_batch(inp, st, sh, steps):
    def one(x, s):
        s, _ = jax.lax.scan(lambda c, _: (_step(x, c, sh), None), s, None, length=steps)
        return s, _done(x, s, sh)
    return jax.vmap(one)(inp, st)


@dataclass
class BatchOutput:
    """Raw per-request outcome of a batch of design points (host arrays, leading axis ``[G]``).

    ``ttft_t``, ``finish_t``, ``ready_t`` (absolute times, s; inf = never), ``pinst``,
    ``dinst`` (instance indices), ``dropped`` ``[G, N]``; ``kv_area`` (byte-seconds),
    ``kv_peak`` (bytes), ``end_s``, ``events``, ``leaped``, ``steps`` and flags
    ``overflow``, ``complete`` ``[G]``; ``wall_s`` of the whole batch (incl. compile),
    ``compile_s``.
    """

    ttft_t: np.ndarray
    finish_t: np.ndarray
    ready_t: np.ndarray
    pinst: np.ndarray
    dinst: np.ndarray
    dropped: np.ndarray
    kv_area: np.ndarray
    kv_peak: np.ndarray
    end_s: np.ndarray
    events: np.ndarray
    leaped: np.ndarray
    overflow: np.ndarray
    complete: np.ndarray
    steps: int
    wall_s: float
    compile_s: float


def simulate_batch(inputs: ServingInputs, shape: ServingShape, chunk_steps: int = 512,
                   max_steps: int | None = None, shard: bool = True) -> BatchOutput:
    """Run the array program on a batch of design points (leading axis of every leaf).

    Scans ``chunk_steps`` events at a time (one compiled program), checking on the host
    whether every point has finished; stops at ``max_steps`` (default: a bound on the
    number of events of the contract -- output tokens + prefill iterations + ``N (6 + P)``),
    leaving unfinished points ``complete=False``.

    Args:
      inputs: stacked :class:`ServingInputs` ``[G, ...]``.
      shape: their static :class:`ServingShape`.
      chunk_steps: events per compiled scan call.
      max_steps: give up after this many events.
      shard: split the points over the local devices (``jax.sharding``, 1-D mesh
        ``points``) when their number divides evenly; the same program runs on one device.
    """
    if not isinstance(chunk_steps, int) or chunk_steps < 1:
        raise SpecError(f"chunk_steps must be a positive integer, got {chunk_steps!r}")
    if max_steps is None:  # every event of the contract, bounded: decode iterations <= output tokens, ...
        out_tok = np.max(np.sum(np.asarray(inputs.output, np.float64), axis=-1))
        pre_it = np.max(np.sum(np.asarray(inputs.prompt, np.float64), axis=-1) / np.asarray(inputs.chunk, np.float64))
        max_steps = int(out_tok + pre_it + shape.requests * (6 + shape.prefill)) + 4096
    max_steps = int(max_steps)
    t0 = time.perf_counter()
    inputs = jax.tree_util.tree_map(jnp.asarray, inputs)
    g = int(np.shape(inputs.n_valid)[0])
    devices = jax.local_devices()
    if shard and len(devices) > 1 and g % len(devices) == 0:
        from jax.sharding import AxisType, NamedSharding, PartitionSpec

        mesh = jax.make_mesh((len(devices),), ("points",), axis_types=(AxisType.Auto,), devices=devices)
        sharding = NamedSharding(mesh, PartitionSpec("points"))
        inputs = jax.device_put(inputs, sharding)
        st = jax.device_put(_init_batch(inputs, shape), sharding)
    else:
        st = _init_batch(inputs, shape)
    lowered = _run_batch.lower(inputs, st, shape, chunk_steps)
    compiled = lowered.compile()
    compile_s = time.perf_counter() - t0
    steps = 0
    while True:
        st, done = compiled(inputs, st)
        steps += chunk_steps
        if bool(np.all(np.asarray(done))) or steps >= max_steps:
            break
    done = np.asarray(done)
    host = {k: np.asarray(v) for k, v in st.items() if k in ("ttft_t", "finish_t", "ready_t", "pinst", "dinst",
                                                              "dropped", "kv_area", "kv_peak", "t_last", "events",
                                                              "leaped", "overflow")}
    return BatchOutput(ttft_t=host["ttft_t"], finish_t=host["finish_t"], ready_t=host["ready_t"], pinst=host["pinst"],
                       dinst=host["dinst"], dropped=host["dropped"], kv_area=host["kv_area"], kv_peak=host["kv_peak"],
                       end_s=host["t_last"], events=host["events"], leaped=host["leaped"], overflow=host["overflow"],
                       complete=done & ~host["overflow"], steps=steps, wall_s=time.perf_counter() - t0,
                       compile_s=compile_s)


# =========================================================================== metrics (host)


@dataclass
class RequestMetrics:
    """Per-request latencies (``[N]``, seconds; nan when the request never finished).

    ``ttft`` = first token - arrival; ``e2e`` = last token - arrival; ``tpot`` =
    (e2e - ttft) / (output - 1), nan for one-token outputs.
    """

    ttft: np.ndarray
    tpot: np.ndarray
    e2e: np.ndarray
    finished: np.ndarray
    dropped: np.ndarray


def request_metrics(trace: Trace, ttft_t, finish_t, dropped) -> RequestMetrics:
    a = trace.arrival_s
    o = trace.output_tokens.astype(float)
    ttft_t = np.asarray(ttft_t, float)
    finish_t = np.asarray(finish_t, float)
    finished = np.isfinite(finish_t)
    ttft = np.where(np.isfinite(ttft_t), ttft_t - a, np.nan)
    e2e = np.where(finished, finish_t - a, np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(finished & (o > 1), (finish_t - ttft_t) / np.maximum(o - 1, 1), np.nan)
    return RequestMetrics(ttft=ttft, tpot=tpot, e2e=e2e, finished=finished, dropped=np.asarray(dropped, bool))


def _stats(x: np.ndarray, prefix: str) -> dict[str, float]:
    x = x[np.isfinite(x)]
    if x.size == 0:
        return {f"{prefix}_mean": math.inf, f"{prefix}_p50": math.inf, f"{prefix}_p99": math.inf}
    return {f"{prefix}_mean": float(x.mean()), f"{prefix}_p50": float(np.percentile(x, 50)),
            f"{prefix}_p99": float(np.percentile(x, 99))}


def aggregate_metrics(trace: Trace, rm: RequestMetrics, setup: ServingSetup, kv_area: float, kv_peak: float,
                      end_s: float) -> dict[str, Any]:
    """Aggregate serving metrics of one design point.

    Returns a dict with ``ttft_*``, ``tpot_*``, ``e2e_*`` (mean / p50 / p99, s),
    ``finished``, ``dropped``, ``makespan_s`` (last finish - first arrival),
    ``throughput_rps``, ``tokens_per_s`` (output tokens of finished requests),
    ``slo_attainment`` (share of the N requests meeting both the TTFT and the TPOT SLO),
    ``goodput_rps`` (offered rate x SLO attainment: requests/s served within the SLOs), ``dram_util_mean`` / ``dram_util_peak`` (resident + KV over
    physical DRAM, whole wafer) and ``offered_rps``.
    """
    cfg = setup.config
    n = len(trace)
    fin = rm.finished
    out = {"requests": n, "finished": int(fin.sum()), "dropped": int(rm.dropped.sum()),
           "offered_rps": trace.rate}
    out.update(_stats(rm.ttft, "ttft"))
    out.update(_stats(rm.tpot, "tpot"))
    out.update(_stats(rm.e2e, "e2e"))
    last = float(np.max(np.where(fin, trace.arrival_s + np.nan_to_num(rm.e2e, nan=0.0), -np.inf))) if fin.any() \
        else math.nan
    makespan = last - float(trace.arrival_s[0]) if fin.any() else math.nan
    ok_tpot = np.where(np.isnan(rm.tpot), True, rm.tpot <= cfg.tpot_slo_s)
    good = fin & (rm.ttft <= cfg.ttft_slo_s) & ok_tpot
    out["makespan_s"] = makespan
    pos = makespan is not None and makespan > 0
    out["throughput_rps"] = float(fin.sum() / makespan) if pos else 0.0
    out["tokens_per_s"] = float(trace.output_tokens[fin].sum() / makespan) if pos else 0.0
    out["slo_attainment"] = float(good.sum() / n)
    out["goodput_rps"] = out["slo_attainment"] * trace.rate if math.isfinite(trace.rate) else 0.0
    cap = float(np.sum(setup.capacity))
    res = float(np.sum(setup.resident))
    span = float(end_s - trace.arrival_s[0])
    out["dram_util_mean"] = (res + (kv_area / span if span > 0 else 0.0)) / cap
    out["dram_util_peak"] = (res + kv_peak) / cap
    return out


@dataclass
class ServingResult:
    """Outcome of one design point: set-up, trace, per-request and aggregate metrics."""

    setup: ServingSetup
    trace: Trace
    metrics: dict[str, Any]
    requests: RequestMetrics | None = None
    raw: dict[str, np.ndarray] | None = None

    def row(self) -> dict[str, Any]:
        d = self.setup.describe()
        d.update(workload=self.trace.name, offered_rps=self.trace.rate)
        d.update(self.metrics)
        return d


def infeasible_metrics(trace: Trace) -> dict[str, Any]:
    """Metrics row of a design point that cannot serve the model (infinite latency, zero throughput)."""
    out = {"requests": len(trace), "finished": 0, "dropped": 0, "offered_rps": trace.rate}
    for k in ("ttft", "tpot", "e2e"):
        out.update({f"{k}_mean": math.inf, f"{k}_p50": math.inf, f"{k}_p99": math.inf})
    out.update(makespan_s=math.nan, throughput_rps=0.0, tokens_per_s=0.0, goodput_rps=0.0, slo_attainment=0.0,
               dram_util_mean=math.nan, dram_util_peak=math.nan)
    return out


@dataclass
class SimulationReport:
    """:func:`simulate` output: one :class:`ServingResult` per point plus timing."""

    results: list[ServingResult]
    groups: int
    wall_s: float
    compile_s: float
    steps: list[int]
    simulated_requests: int

    @property
    def requests_per_wall_s(self) -> float:
        return self.simulated_requests / self.wall_s if self.wall_s > 0 else math.inf


def simulate(points: Sequence[tuple[ServingSetup, Trace]], dtype=jnp.float32, batch_size: int | None = None,
             chunk_steps: int = 512, keep_raw: bool = False) -> SimulationReport:
    """Simulate many (setup, trace) design points with the array program.

    Points are grouped by static structure (request-count bucket :func:`request_bucket`;
    shorter traces and smaller die grids are padded); each group is one
    compiled program run over all its points with ``jit(vmap)`` (in slices of
    ``batch_size`` points, padded by repeating the last, so memory stays bounded).
    Infeasible set-ups become rows with infinite latency and zero throughput.

    Args:
      points: ``[(setup, trace), ...]``.
      dtype: float dtype of the program (float64 needs ``jax_enable_x64``).
      batch_size: points per ``vmap`` call (default: the whole group up to 48 points, else
        slices of 32 ordered by expected work -- output tokens per decode instance).
      chunk_steps: scan length between host checks for completion.
      keep_raw: keep the raw per-request times in each result.
    """
    if dtype == jnp.float64 and not jax.config.jax_enable_x64:
        raise SpecError("float64 needs jax_enable_x64: call jax.config.update('jax_enable_x64', True) first")
    t0 = time.perf_counter()
    results: list[ServingResult | None] = [None] * len(points)
    groups: dict[int, list[int]] = {}
    for k, (setup, trace) in enumerate(points):
        if not setup.feasible:
            results[k] = ServingResult(setup, trace, infeasible_metrics(trace))
            continue
        groups.setdefault(request_bucket(len(trace)), []).append(k)
    compile_s, steps_all, simulated = 0.0, [], 0
    for n_req, idx in sorted(groups.items()):
        cfg = points[idx[0]][0].config
        shape = shape_for([points[k][0] for k in idx], n_req, cfg)
        ndev = len(jax.local_devices())
        # similar amounts of work share a slice (a slice runs until its slowest point is done); every
        # slice has the same width, so the group compiles once
        idx = sorted(idx, key=lambda k: (float(points[k][1].output_tokens.sum()) / max(points[k][0].n_decode, 1), k))
        bs = (len(idx) if len(idx) <= 48 else 32) if batch_size is None else max(1, int(batch_size))
        bs = -(-bs // ndev) * ndev if bs >= ndev else bs  # whole multiple of the devices
        for s in range(0, len(idx), bs):
            sl = idx[s:s + bs]
            width = bs
            padded = sl + [sl[-1]] * (width - len(sl))
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
                raw = None
                if keep_raw:
                    raw = {k2: getattr(out, k2)[g, :n] for k2 in ("ttft_t", "finish_t", "ready_t", "pinst", "dinst",
                                                                 "dropped")}
                results[k] = ServingResult(setup, trace, met, rm, raw)
                simulated += n
    return SimulationReport(results=results, groups=len(groups), wall_s=time.perf_counter() - t0,
                            compile_s=compile_s, steps=steps_all, simulated_requests=simulated)


__all__ = [
    "SCHEDULERS", "PLACEMENTS", "ServingConfig", "ServingSetup", "build_setup", "workload_for", "ServingShape",
    "ServingInputs", "shape_for", "pack_inputs", "greedy_allocate_pairwise", "request_bucket", "stack_inputs", "simulate_batch", "BatchOutput", "RequestMetrics",
    "request_metrics", "aggregate_metrics", "ServingResult", "infeasible_metrics", "SimulationReport", "simulate",
]
