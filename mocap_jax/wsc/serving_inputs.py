"""Inputs of the batched serving program: its static shape and the traced numbers of a design point.

Every number of a (setup, trace) point -- hardware, model, plans, layout tables, traffic tables,
requests -- is a leaf of :class:`ServingInputs`, so ``jit(vmap(...))`` runs many design points
that share a :class:`ServingShape` as one program.  Padding: instance tables to ``P`` / ``Q``
(padding instances are masked out), dies to ``D`` (padding dies hold nothing, accept no KV and
have no links), requests to ``N`` (padding requests never arrive).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..costs import ModelParams, pytree
from ..specs import SpecError
from . import memory as mem
from .hardware import WaferParams
from .plan import TPPlan, model_params, tp_plan
from .setup import CONTENTION, ServingConfig, ServingSetup
from .traces import Trace

Array = Any


@dataclass(frozen=True)
class ServingShape:
    """Static sizes of a batched serving program (hashable; one compiled program each).

    Attributes:
      requests: N.  dies: D.  prefill, decode: P, Q instances (padded).
      slots: B, decode slots per instance (>= every point's batch cap).
      window: W, requests per prefill iteration.  leap: K, fast-forwarded quiet decode boundaries.
      remote: model remote KV reads (False when every point keeps KV on its decode instance).
      contention: model traffic on links and DRAM (the rule is a traced input per point).
      admit: finishes / admissions per decode boundary per scan step (more continue in the next
        step at the same time; no effect on results).
      decode_parallel: decode boundaries processed per scan step (they commute until the next
        prefill event; no effect on results without contention).
      arrivals: arrivals processed per scan step (no effect on results).
      transfers: in-flight KV transfers whose link demand is tracked (contention; the oldest is
        forgotten when more are in flight).
      route_entries: K, most (die, link) pairs of the remote-read routes of one decode instance, in
        all (contention; a multiple of 8).
    """

    requests: int
    dies: int
    prefill: int
    decode: int
    slots: int
    window: int
    leap: int
    remote: bool
    contention: bool = False
    admit: int = 8
    decode_parallel: int = 4
    arrivals: int = 4
    transfers: int = 8
    route_entries: int = 8

    @property
    def boundaries(self) -> int:
        """R: decode boundaries a scan step of one lane can process (``decode_parallel``, at most ``Q``)."""
        return min(self.decode_parallel, self.decode)


@pytree
class CostInputs:
    """The instance cost model's numbers."""

    model: ModelParams          # traced model numbers
    hw: WaferParams             # traced hardware numbers
    prefill_plan: TPPlan        # per-die shares of a prefill instance
    decode_plan: TPPlan         # per-die shares of a decode instance
    chunk_tokens: Array         # [] prefill token budget per iteration
    kv_bytes_per_token: Array   # [] bytes of one token's KV over all layers
    transfer_lanes: Array       # [] parallel lanes of a KV transfer without contention
    batch_cap: Array            # [] int32, requests per decode batch


@pytree
class LayoutInputs:
    """The set-up's layout tables (:class:`~mocap_jax.wsc.setup.ServingSetup`), padded."""

    prefill_valid: Array        # [P] bool, a real prefill instance
    decode_valid: Array         # [Q] bool, a real decode instance
    priority: Array             # [P, Q, D] int8 location priority (3: not allowed)
    allowed_capacity: Array     # [P, Q] bytes free (no KV placed) on the dies allowed for the pair
    free0: Array                # [D] bytes free for KV at the start
    pair_hops: Array            # [P, Q] int32 hops between centre dies
    prefill_die_hops: Array     # [P, D] hops from each prefill centre die
    prefill_die_internode: Array  # [P, D] 1 when the route leaves a node
    prefill_own: Array          # [P, D] bool, the die belongs to the prefill instance
    decode_die_hops: Array      # [Q, D] hops from each die to the nearest die of the decode instance
    decode_die_internode: Array  # [Q, D]
    decode_ingress: Array       # [Q] links remote reads enter each decode instance by


@pytree
class TrafficInputs:
    """Link and DRAM resources of the contention model (``L = 4 D``; size-1 placeholders without it)."""

    rule: Array                 # [] 0 = max-min, 1 = proportional
    link_capacity: Array        # [L] bytes/s with link efficiency (0: no such link)
    dram_capacity: Array        # [D] bytes/s with DRAM efficiency
    prefill_ring: Array         # [P, L] all-die ring steps crossing each link
    prefill_group: Array        # [P, L] attention-group ring steps crossing each link
    decode_ring: Array          # [Q, L]
    decode_group: Array         # [Q, L]
    prefill_own: Array          # [P, D] 1.0 on the prefill instance's dies
    decode_own: Array           # [Q, D] 1.0 on the decode instance's dies
    transfer_counts: Array      # [P, D, L] uint8 (int32 past 255 dies) prefill dies whose route to die d crosses
                                #   link l; each carries 1 / transfer_sources of the bytes
    transfer_sources: Array     # [P] dies of each prefill instance (1 for padding)
    read_dies: Array            # [Q, K] int32 die of each (die, link) pair of the instance's remote-read routes
    read_links: Array           # [Q, K] int32 link of each pair (L: none), die by die, each route in link order


@pytree
class Requests:
    """The trace, sorted by arrival (the first ``count`` are real)."""

    count: Array                # [] int32 requests of the trace
    arrival: Array              # [N] s
    prompt: Array               # [N] tokens
    output: Array               # [N] tokens (>= 1)


@pytree
class ServingInputs:
    """Every number of one design point (leaves ``[...]``; ``[G, ...]`` when batched for ``vmap``)."""

    cost: CostInputs
    layout: LayoutInputs
    traffic: TrafficInputs
    requests: Requests


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
    return ServingShape(requests=int(requests), dies=max(s.dies for s in ok),
                        prefill=_bucket(max(s.n_prefill for s in ok), 1), decode=_bucket(max(s.n_decode for s in ok), 1),
                        slots=_bucket(max(s.batch_cap for s in ok)), window=config.window, leap=config.leap,
                        remote=any(s.remote for s in ok), contention=any(s.config.contention != "off" for s in ok),
                        route_entries=-(-max([int(s.traffic.read_routes.sum(axis=(-2, -1)).max()) for s in ok
                                              if s.traffic is not None] + [1]) // 8) * 8)


def _pad(x, shape, fill, dtype):
    out = np.full(shape, fill, dtype=dtype)
    out[tuple(slice(0, n) for n in np.shape(x))] = x
    return out


def _pad_links(x, dies: int, dtype):
    """``[..., 4 d]`` link table of a ``d``-die set-up -> ``[..., 4 D]`` (each link kind padded separately)."""
    x = np.asarray(x)
    d = x.shape[-1] // 4
    parts = x.reshape(x.shape[:-1] + (4, d))
    return _pad(parts, x.shape[:-1] + (4, dies), 0, dtype).reshape(x.shape[:-1] + (4 * dies,))


def _traffic_inputs(setup: ServingSetup, shape: ServingShape, dtype) -> TrafficInputs:
    f = lambda x: np.asarray(x, dtype=dtype)
    if not shape.contention:
        one = np.zeros((1,), dtype)
        return TrafficInputs(rule=f(0), link_capacity=one, dram_capacity=one, prefill_ring=one, prefill_group=one,
                             decode_ring=one, decode_group=one, prefill_own=one, decode_own=one,
                             transfer_counts=np.zeros((1,), _count_dtype(shape)), transfer_sources=one,
                             read_dies=np.zeros((1,), np.int32), read_links=np.zeros((1,), np.int32))
    if setup.traffic is None:
        raise SpecError(f"{setup.label}: set up without contention tables; use one contention setting per program")
    P, Q, D = shape.prefill, shape.decode, shape.dies
    t, w = setup.traffic, setup.wafer
    own_q = np.zeros((setup.n_decode, setup.dies))
    for q, inst in enumerate(setup.layout.decode):
        own_q[q, [r * w.cols + c for r, c in inst.cells()]] = 1.0
    return TrafficInputs(
        rule=f(CONTENTION.index(setup.config.contention) - 1),
        link_capacity=_pad_links(t.link_capacity * w.eff_link, D, dtype),
        dram_capacity=_pad(np.full(setup.dies, w.dram_bandwidth * w.eff_dram), (D,), 0, dtype),
        prefill_ring=_pad(_pad_links(t.prefill_ring, D, dtype), (P, 4 * D), 0, dtype),
        prefill_group=_pad(_pad_links(t.prefill_group, D, dtype), (P, 4 * D), 0, dtype),
        decode_ring=_pad(_pad_links(t.decode_ring, D, dtype), (Q, 4 * D), 0, dtype),
        decode_group=_pad(_pad_links(t.decode_group, D, dtype), (Q, 4 * D), 0, dtype),
        prefill_own=_pad(setup.p_die_own.astype(float), (P, D), 0, dtype), decode_own=_pad(own_q, (Q, D), 0, dtype),
        transfer_counts=_pad(_pad_links(t.transfer_counts, D, np.int64), (P, D, 4 * D), 0, _count_dtype(shape)),
        transfer_sources=_pad(t.prefill_dies, (P,), 1, dtype),
        **_route_entries(_pad_links(t.read_routes, D, np.int64), Q, shape.route_entries))


def _count_dtype(shape: ServingShape):
    """Route counts are at most the dies of an instance: one byte each on wafers of up to 255 dies.

    A lane taking a point copies its inputs to its device and the placement loop reads an
    instance's ``[D, L]`` counts, so a quarter of the float32 bytes matters to both.
    """
    return np.uint8 if shape.dies <= np.iinfo(np.uint8).max else np.int32


def _route_entries(routes: np.ndarray, instances: int, entries: int) -> dict[str, np.ndarray]:
    """``[q, d, L]`` 0/1 route rows (from each die to instance ``i``) -> every instance's (die, link)
    pairs, die by die and each route's links in index order, padded to ``entries`` with die 0 and
    link ``L`` (no link): ``read_dies`` and ``read_links``, ``[instances, entries]`` each.

    A remote read adds each die's bytes to the links of its route in that order, as the ``[d, L]``
    rows would; an instance's routes cross far fewer links than ``d`` routes of the longest length
    (261 against 594 on the default exploration's largest), and the step's scatter is that long.
    """
    q, d, L = routes.shape
    dies = np.zeros((instances, entries), np.int32)
    links = np.full((instances, entries), L, np.int32)
    inst, flat = np.nonzero(routes.reshape(q, d * L))            # row-major: by instance, die, link
    count = np.bincount(inst, minlength=q)
    if count.size and count.max() > entries:
        raise SpecError(f"the remote-read routes of a decode instance cross {count.max()} links in all, but the "
                        f"program holds {entries}")
    rank = np.arange(inst.size) - np.repeat(np.cumsum(count) - count, count)
    dies[inst, rank], links[inst, rank] = np.divmod(flat, L)
    return {"read_dies": dies, "read_links": links}


def pack_inputs(setup: ServingSetup, trace: Trace, shape: ServingShape, dtype=jnp.float32) -> ServingInputs:
    """Numbers of one (setup, trace) point, padded to ``shape`` (host numpy arrays)."""
    if not setup.feasible:
        raise SpecError(f"{setup.label}: infeasible design point ({setup.reason})")
    n = len(trace)
    if n > shape.requests:
        raise SpecError(f"trace has {n} requests but the shape holds {shape.requests}")
    P, Q, D, N = shape.prefill, shape.decode, shape.dies, shape.requests
    if setup.n_prefill > P or setup.n_decode > Q or setup.dies > D or setup.batch_cap > shape.slots:
        raise SpecError(f"{setup.label} does not fit the shape {shape}")
    if (setup.config.contention != "off") != shape.contention:
        raise SpecError(f"{setup.label}: contention {setup.config.contention!r} does not match the program "
                        f"(contention {'on' if shape.contention else 'off'}); simulate the two settings apart")
    f = lambda x: np.asarray(x, dtype=dtype)
    cost = CostInputs(model=model_params(setup.model, dtype), hw=WaferParams.from_spec(setup.wafer, dtype),
                      prefill_plan=tp_plan(setup.model, setup.wafer, setup.prefill, dtype),
                      decode_plan=tp_plan(setup.model, setup.wafer, setup.decode, dtype),
                      chunk_tokens=f(setup.config.chunk_tokens), kv_bytes_per_token=f(setup.kv_bytes_per_token),
                      transfer_lanes=f(setup.lanes), batch_cap=np.asarray(setup.batch_cap, np.int32))
    layout = LayoutInputs(
        prefill_valid=np.arange(P) < setup.n_prefill, decode_valid=np.arange(Q) < setup.n_decode,
        priority=_pad(setup.prio, (P, Q, D), mem.NOT_ALLOWED, np.int8),
        allowed_capacity=_pad(setup.cap_allowed, (P, Q), 0, dtype), free0=_pad(setup.free0, (D,), 0, dtype),
        pair_hops=_pad(setup.pq_hops, (P, Q), 0, np.int32), prefill_die_hops=_pad(setup.p_die_hops, (P, D), 0, dtype),
        prefill_die_internode=_pad(setup.p_die_internode, (P, D), 0, dtype),
        prefill_own=_pad(setup.p_die_own, (P, D), False, bool), decode_die_hops=_pad(setup.q_die_hops, (Q, D), 0, dtype),
        decode_die_internode=_pad(setup.q_die_internode, (Q, D), 0, dtype),
        decode_ingress=_pad(setup.q_ingress, (Q,), 1, dtype))
    requests = Requests(count=np.asarray(n, np.int32),
                        arrival=f(np.pad(trace.arrival_s, (0, N - n), mode="edge")),
                        prompt=f(np.pad(trace.prompt_tokens, (0, N - n), constant_values=1)),
                        output=f(np.pad(trace.output_tokens, (0, N - n), constant_values=1)))
    return ServingInputs(cost=cost, layout=layout, traffic=_traffic_inputs(setup, shape, dtype), requests=requests)


def stack_inputs(items: Sequence[ServingInputs]) -> ServingInputs:
    """Stack per-point inputs along a new leading axis (for ``vmap``)."""
    return jax.tree_util.tree_map(lambda *xs: np.stack(xs), *items)


__all__ = ["ServingShape", "CostInputs", "LayoutInputs", "TrafficInputs", "Requests", "ServingInputs",
           "request_bucket", "shape_for", "pack_inputs", "stack_inputs"]
