"""Set-up of a serving design point: the central scheduler's offline decisions as numbers.

:func:`build_setup` (one point) and :func:`build_setups` (many hardware points of one model
and workload, partition candidates evaluated in one vmapped call) run the partition
(WSC-LLM search, Splitwise-style TP 8, or naive), the placement (decode-centred, packed,
random) and the memory policy, and turn them into the tables of a :class:`ServingSetup` that
both serving simulators read.  A model that fits nowhere gives an infeasible set-up (a
result, never a crash).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import jax.numpy as jnp
import numpy as np

from ..specs import LIMITS, ModelSpec, SpecError, checks, get_model
from . import memory as mem
from . import partition as part
from . import placement as plc
from .geometry import (crosses_nodes, hop_matrix, link_capacity, read_resource_table, ring_resource_uses,
                       transfer_resource_counts)
from .goodput import ServingTargets
from .hardware import WaferSpec, get_wafer
from .layout import Instance, Layout, check_alpha, pack_instances
from .plan import STRATEGIES, InstanceConfig, instance_rings
from .traces import Trace
from .workload import WORKLOAD_PRESETS, WorkloadSpec

SCHEDULERS = ("wsc", "splitwise", "naive")
PLACEMENTS = ("decode-centred", "packed", "random")
#: Link and DRAM sharing rules of the contention model; ``off`` keeps transfers and remote reads
#: free of contention (every stream sees the whole bandwidth).
CONTENTION = ("off", "max-min", "proportional")


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
      contention: how concurrent traffic shares links and DRAM (:data:`CONTENTION`).  Default
        ``max-min``: a wafer's routers arbitrate their input ports round-robin, which shares a
        link max-min fairly among the flows crossing it.
    """

    chunk_tokens: int = 2048
    tpot_slo_s: float = 0.1
    ttft_slo_s: float = 2.0
    max_batch: int = 256
    window: int = 16
    leap: int = 8
    alpha: float = 1.5
    strategies: tuple[str, ...] = STRATEGIES
    seed: int = 0
    contention: str = "max-min"

    def __post_init__(self):
        checks.integer("chunk_tokens", self.chunk_tokens, 1, LIMITS["seq_len"])
        checks.integer("max_batch", self.max_batch, 1, part.MAX_DECODE_BATCH)
        checks.integer("window", self.window, 1, 1024)
        checks.integer("leap", self.leap, 0, 1024)
        for name in ("tpot_slo_s", "ttft_slo_s"):
            checks.positive(name, getattr(self, name), hint=" Give the SLO in seconds.")
        check_alpha(self.alpha)
        checks.choice("contention rule", self.contention, CONTENTION)
        object.__setattr__(self, "strategies", part.validate_strategies(self.strategies))

    def targets(self, dtype=jnp.float32) -> ServingTargets:
        return ServingTargets.make(self.chunk_tokens, self.tpot_slo_s, self.ttft_slo_s, dtype)


@dataclass(frozen=True)
class TrafficTables:
    """Where an instance's traffic goes, over the ``L = 4 D`` link resources (:mod:`~mocap_jax.wsc.geometry`).

    Rows follow ``layout.prefill`` / ``layout.decode`` order.
    """

    link_capacity: np.ndarray       # [L] raw bytes/s of each link resource (0: no such link)
    prefill_ring: np.ndarray        # [P, L] all-die ring steps of each prefill instance crossing each link
    prefill_group: np.ndarray       # [P, L] attention-group ring steps (all groups) crossing each link
    decode_ring: np.ndarray         # [Q, L]
    decode_group: np.ndarray        # [Q, L]
    transfer_counts: np.ndarray     # [P, D, L] prefill dies whose route to die d crosses link l
    prefill_dies: np.ndarray        # [P] dies of each prefill instance (a transfer splits over them)
    read_routes: np.ndarray         # [Q, D, L] 1 where the route from die d to decode instance q crosses l


@dataclass
class ServingSetup:
    """One design point's offline decisions and the numbers the simulators read.

    Geometry arrays are over the ``P`` prefill and ``Q`` decode instances of :attr:`layout`
    (in ``layout.prefill`` / ``layout.decode`` order) and the ``D`` dies.  ``feasible=False``
    (with ``reason``) when the model cannot be served; the arrays are then absent.
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
    prefill: InstanceConfig | None = None
    decode: InstanceConfig | None = None
    layout: Layout | None = None
    batch_cap: int = 0                      # decode batch cap, requests
    prefill_rps: float = 0.0                # goodput per prefill instance (partition model), req/s
    decode_rps: float = 0.0                 # goodput per decode instance, req/s
    served_rps: float = 0.0                 # min(n_p prefill_rps, n_d decode_rps), req/s
    kv_bytes_per_token: float = 0.0         # KV bytes of one token over all layers
    prio: np.ndarray | None = field(default=None, repr=False)             # [P, Q, D] location priority (3: no)
    cap_allowed: np.ndarray | None = field(default=None, repr=False)      # [P, Q] free bytes of allowed dies
    free0: np.ndarray | None = field(default=None, repr=False)            # [D] bytes free for KV at start
    resident: np.ndarray | None = field(default=None, repr=False)         # [D] weights, workspace, reserve
    capacity: np.ndarray | None = field(default=None, repr=False)         # [D] physical DRAM bytes
    pq_hops: np.ndarray | None = field(default=None, repr=False)          # [P, Q] hops between centre dies
    p_die_hops: np.ndarray | None = field(default=None, repr=False)       # [P, D] hops from the prefill centre
    p_die_internode: np.ndarray | None = field(default=None, repr=False)  # [P, D] 1 when it leaves a node
    p_die_own: np.ndarray | None = field(default=None, repr=False)        # [P, D] die of the prefill instance
    q_die_hops: np.ndarray | None = field(default=None, repr=False)       # [Q, D] hops to the nearest decode die
    q_die_internode: np.ndarray | None = field(default=None, repr=False)  # [Q, D]
    q_ingress: np.ndarray | None = field(default=None, repr=False)        # [Q] links remote reads enter by
    lanes: float = 1.0                      # parallel lanes of a KV transfer without contention
    remote: bool = False                    # some KV may live outside its decode instance
    traffic: TrafficTables | None = field(default=None, repr=False)

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
             "placement": self.placement, "memory": self.memory_policy, "contention": self.config.contention,
             "feasible": self.feasible, "reason": self.reason}
        if self.feasible:
            d.update(prefill=f"{self.prefill.rows}x{self.prefill.cols}/{self.prefill.strategy}",
                     decode=f"{self.decode.rows}x{self.decode.cols}/{self.decode.strategy}",
                     n_prefill=self.n_prefill, n_decode=self.n_decode, batch_cap=self.batch_cap,
                     served_rps=self.served_rps,
                     dies_used=self.n_prefill * self.prefill.dies + self.n_decode * self.decode.dies)
        return d


def workload_for(trace: Trace) -> WorkloadSpec:
    """The length summary the partition uses for a trace: the preset of a synthetic trace, else its own."""
    if trace.name in WORKLOAD_PRESETS:
        return WORKLOAD_PRESETS[trace.name].with_rate(trace.rate if math.isfinite(trace.rate) else 1.0)
    return trace.to_workload()


def _check_choices(wafer: WaferSpec, scheduler: str, memory_policy: str | None, placement: str | None):
    checks.choice("scheduler", scheduler, SCHEDULERS)
    policy = memory_policy or ("greedy" if scheduler == "wsc" else "local")
    checks.choice("memory policy", policy, mem.POLICIES)
    placement = placement or ("decode-centred" if scheduler == "wsc" and wafer.is_mesh else "packed")
    checks.choice("placement", placement, PLACEMENTS)
    if placement != "packed" and not wafer.is_mesh:
        raise SpecError(f"placement {placement!r} needs a mesh wafer; {wafer.name} is a GPU cluster (use packed)")
    return policy, placement


def build_setup(model: "str | ModelSpec", wafer: "str | WaferSpec", workload: WorkloadSpec,
                scheduler: str = "wsc", memory_policy: str | None = None, placement: str | None = None,
                config: ServingConfig | None = None, label: str | None = None) -> ServingSetup:
    """Offline decisions of one design point: partition, placement, memory policy, tables.

    Args:
      model, wafer: specs or preset names.
      workload: length summary used by the partition's goodput model (its rate is not used).
      scheduler: ``wsc`` (partition search over shapes and TP strategies, counts that balance
        the phases), ``splitwise`` (TP 8 instances for both phases: a whole 8-GPU node on a
        cluster, a 2x4 rectangle on a wafer; megatron; balanced counts) or ``naive`` (the
        smallest instance that holds the model, megatron, half of the instances prefill).
      memory_policy: ``greedy`` (WSC-LLM memory scheduler) or ``local`` (KV only on the
        decode instance); default greedy for ``wsc``, local otherwise.
      placement: ``decode-centred``, ``packed`` (first-free-cell packing) or ``random``;
        default decode-centred for ``wsc`` on a mesh, packed otherwise.
      config: :class:`ServingConfig`.
      label: system name (default ``<hardware>/<scheduler>``).

    Raises:
      SpecError: bad names or options (before anything is computed).
    """
    return build_setups(model, [wafer], workload, scheduler, memory_policy, placement, config,
                        None if label is None else [label])[0]


def build_setups(model: "str | ModelSpec", wafers: Sequence["str | WaferSpec"], workload: WorkloadSpec,
                 scheduler: str = "wsc", memory_policy: str | None = None, placement: str | None = None,
                 config: ServingConfig | None = None, labels: Sequence[str] | None = None) -> list[ServingSetup]:
    """:func:`build_setup` for many hardware points of one model and workload.

    Candidates of the hardware points that share a grid and topology are evaluated in one
    vmapped call of the partition's goodput model.
    """
    config = config or ServingConfig()
    model = get_model(model)
    wafers = [get_wafer(w) for w in wafers]
    labels = list(labels) if labels is not None else [f"{w.name}/{scheduler}" for w in wafers]
    choices = [_check_choices(w, scheduler, memory_policy, placement) for w in wafers]
    cands: dict[int, list[part.Candidate]] = {}
    if scheduler == "wsc":
        groups: dict[tuple, list[int]] = {}
        for k, w in enumerate(wafers):
            groups.setdefault((w.rows, w.cols, w.topology), []).append(k)
        for idx in groups.values():
            evaluated = part.evaluate_candidates_many(model, [wafers[k] for k in idx], workload, config.targets(),
                                                      config.strategies, config.max_batch)
            cands.update(zip(idx, evaluated))
    out = []
    for k, (w, label, (policy, place)) in enumerate(zip(wafers, labels, choices)):
        decided = _partition(model, w, workload, scheduler, config, cands.get(k))
        if isinstance(decided, str):
            out.append(ServingSetup(label=label, model=model, wafer=w, scheduler=scheduler, placement=place,
                                    memory_policy=policy, config=config, feasible=False, reason=decided))
            continue
        out.append(_tables(label, model, w, workload, scheduler, place, policy, config, *decided))
    return out


def _candidate(model, wafer, workload, config, shape, strategy) -> part.Candidate:
    return part.evaluate_candidates(model, wafer, workload, config.targets(), [strategy], config.max_batch,
                                    shapes=[shape])[0]


def _partition(model, wafer, workload, scheduler, config, cands):
    """(prefill candidate, decode candidate, packing) of a scheduler, or the reason it cannot serve."""
    if scheduler == "wsc":
        try:
            res = part.choose_partition(model, wafer, workload, config.strategies, cands)
        except SpecError as e:
            return str(e)
        return res.prefill, res.decode, res.packing
    if scheduler == "splitwise":
        shape = (2, 4) if wafer.is_mesh else (1, min(8, wafer.cols))
        if wafer.is_mesh and not ((2 <= wafer.rows and 4 <= wafer.cols) or (4 <= wafer.rows and 2 <= wafer.cols)):
            return f"a 2x4 TP8 instance does not fit the {wafer.rows}x{wafer.cols} grid"
        c = _candidate(model, wafer, workload, config, shape, "megatron")
        if not (c.prefill_fits and c.decode_fits):
            return f"{model.name} does not fit a TP8 instance of {wafer.name}"
        try:
            _, _, packing = part.size_counts(wafer, shape, max(c.prefill_rps, 1e-9), shape, max(c.decode_rps, 1e-9))
        except SpecError as e:
            return str(e)
        return c, c, packing
    for shape in part.instance_shapes(wafer):  # naive: the smallest instance that holds the model
        c = _candidate(model, wafer, workload, config, shape, "megatron")
        if c.prefill_fits and c.decode_fits:
            break
    else:
        return f"{model.name} does not fit two instances of {wafer.name}"
    n = wafer.num_dies // c.config.dies
    while n >= 2:
        n_p, n_d = (n + 1) // 2, n // 2
        placed = pack_instances(wafer.rows, wafer.cols, [(shape, n_p), (shape, n_d)], allow_rotation=wafer.is_mesh)
        if placed is not None:
            kinds = ("prefill", "decode")
            return c, c, [(kinds[i], r, cc, h, w) for i, r, cc, h, w in placed]
        n -= 1
    return f"{model.name} does not fit two instances of {wafer.name}"


@functools.lru_cache(maxsize=1024)
def _decode_centred(rows, cols, pshape, n_p, dshape, n_d, alpha) -> Layout:
    """Decode-centred placement, deterministic in the geometry: shared by every hardware point."""
    from .hardware import wsc_wafer

    return plc.decode_centred_placement(wsc_wafer(rows, cols), pshape, n_p, dshape, n_d, alpha)


def _cluster_priority(wafer: WaferSpec, layout: Layout, policy: str) -> np.ndarray:
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


def _tables(label, model, wafer, workload, scheduler, placement, policy, config, pc, dc, packing) -> ServingSetup:
    n_p = sum(1 for k, *_ in packing if k == "prefill")
    n_d = sum(1 for k, *_ in packing if k == "decode")
    pshape, dshape = (pc.config.rows, pc.config.cols), (dc.config.rows, dc.config.cols)
    if placement == "decode-centred":
        layout = _decode_centred(wafer.rows, wafer.cols, pshape, n_p, dshape, n_d, float(config.alpha))
    elif placement == "random":
        layout = plc.random_placement(wafer, pshape, n_p, dshape, n_d, config.seed)
    else:
        layout = Layout(wafer.rows, wafer.cols, tuple(Instance(k, r, c, h, w) for k, r, c, h, w in packing))
    try:
        budget = mem.die_budget(model, wafer, layout, pc.config, dc.config, config.chunk_tokens, config.max_batch,
                                float(workload.max_prompt))
    except SpecError as e:
        return ServingSetup(label=label, model=model, wafer=wafer, scheduler=scheduler, placement=placement,
                            memory_policy=policy, config=config, feasible=False, reason=str(e))
    prio = mem.priority_table(wafer, layout, policy) if wafer.is_mesh else _cluster_priority(wafer, layout, policy)
    allowed = prio < mem.NOT_ALLOWED
    hm, xn, own, q_hops, q_inter, ingress = _geometry_tables(wafer, layout)
    pre_c, dec_c = layout.centre_dies("prefill"), layout.centre_dies("decode")
    remote = bool(np.any(allowed & (q_hops[None, :, :] > 0)))
    traffic = None
    if config.contention != "off":
        traffic = _traffic_tables(model, wafer.rows, wafer.cols, wafer.is_mesh, layout, pc.config.strategy,
                                  dc.config.strategy)
        traffic = TrafficTables(link_capacity(wafer), *traffic)
    return ServingSetup(
        label=label, model=model, wafer=wafer, scheduler=scheduler, placement=placement, memory_policy=policy,
        config=config, prefill=pc.config, decode=dc.config, layout=layout,
        batch_cap=int(max(1, min(int(dc.decode_batch_slo), config.max_batch))),
        prefill_rps=pc.prefill_rps, decode_rps=dc.decode_rps,
        served_rps=min(n_p * pc.prefill_rps, n_d * dc.decode_rps),
        kv_bytes_per_token=float(model.kv_bytes_per_token_layer(wafer.kv_bytes) * model.layers),
        prio=prio.astype(np.int32), cap_allowed=np.einsum("pqd,d->pq", allowed.astype(float), budget.free),
        free0=budget.free.astype(float), resident=budget.resident.astype(float),
        capacity=budget.capacity.astype(float), pq_hops=hm[np.ix_(pre_c, dec_c)].astype(np.int32),
        p_die_hops=hm[pre_c], p_die_internode=xn[pre_c], p_die_own=own, q_die_hops=q_hops, q_die_internode=q_inter,
        q_ingress=ingress, lanes=float(min(pc.config.dies, dc.config.dies)), remote=remote, traffic=traffic)


def _die_ids(wafer_cols: int, inst: Instance) -> list[int]:
    return [r * wafer_cols + c for r, c in inst.cells()]


def _geometry_tables(wafer: WaferSpec, layout: Layout):
    """Hops, node crossings, own dies and ingress links of the layout's instances."""
    d = wafer.num_dies
    hm = hop_matrix(wafer).astype(float)
    xn = crosses_nodes(wafer).astype(float)
    own = np.zeros((len(layout.prefill), d), bool)
    for p, inst in enumerate(layout.prefill):
        own[p, _die_ids(wafer.cols, inst)] = True
    q_hops = np.zeros((len(layout.decode), d))
    q_inter = np.zeros((len(layout.decode), d))
    ingress = np.zeros(len(layout.decode))
    for q, inst in enumerate(layout.decode):
        ids = _die_ids(wafer.cols, inst)
        q_hops[q] = hm[:, ids].min(axis=1)
        q_inter[q] = xn[:, ids].min(axis=1)
        if wafer.is_mesh:
            ingress[q] = float(mem.remote_kv(wafer, layout, q, np.zeros(d)).ingress_links)
        else:
            ingress[q] = len(ids)  # one NVLink port per GPU
    return hm, xn, own, q_hops, q_inter, ingress


@functools.lru_cache(maxsize=256)
def _traffic_tables(model: ModelSpec, rows: int, cols: int, is_mesh: bool, layout: Layout, prefill_strategy: str,
                    decode_strategy: str):
    """Ring uses, transfer routes and read routes of a layout (shared by hardware points of one geometry)."""
    from .hardware import a100_cluster, wsc_wafer

    grid = wsc_wafer(rows, cols) if is_mesh else a100_cluster(rows, cols)

    def rings(inst: Instance, strategy: str):
        order, groups = instance_rings(model, InstanceConfig(inst.rows, inst.cols, strategy))
        glob = lambda cells: [(inst.row + r) * cols + inst.col + c for r, c in cells]
        return ring_resource_uses(grid, [glob(order)]), ring_resource_uses(grid, [glob(g) for g in groups])

    pre = [rings(i, prefill_strategy) for i in layout.prefill]
    dec = [rings(i, decode_strategy) for i in layout.decode]
    transfer = np.stack([transfer_resource_counts(grid, _die_ids(cols, i)) for i in layout.prefill])
    reads = np.stack([read_resource_table(grid, _die_ids(cols, i)) for i in layout.decode])
    return (np.stack([r for r, _ in pre]), np.stack([g for _, g in pre]), np.stack([r for r, _ in dec]),
            np.stack([g for _, g in dec]), transfer, np.asarray([i.rows * i.cols for i in layout.prefill]), reads)


__all__ = ["SCHEDULERS", "PLACEMENTS", "CONTENTION", "ServingConfig", "TrafficTables", "ServingSetup", "build_setup",
           "build_setups", "workload_for"]
