"""Instance performance models for WSC-LLM serving (DESIGN §10).

An *instance* is a rectangle of ``rows x cols`` dies running tensor parallelism (TP)
over all of its ``t = rows * cols`` dies.  Its structure -- how a TP strategy splits
heads, FFN columns, KV and which collectives it needs -- is computed once on the host
from the integer model shape (:func:`tp_plan`) and stored as a :class:`TPPlan` pytree of
numbers, so that plans of different shapes and strategies stack into one batch.  The
timing functions are pure ``jax.numpy`` functions of

* ``model``: :class:`mocap_jax.costs.ModelParams` (traced model numbers),
* ``hw``: :class:`~mocap_jax.wsc.hardware.WaferParams` (traced hardware numbers),
* ``plan``: :class:`TPPlan` (traced per-die shares of one instance),

plus the iteration's contents, and can be ``jit``-ed and ``vmap``-ed over any of them
(design points, instance shapes, batches).  Every op class costs
:func:`mocap_jax.costs.roofline` (max of compute and DRAM time) on one die; ring
collectives cost ``steps x (hop latency + sync + chunk bytes x link load / link bw)``.
Compute and communication of one layer are sequential (Megatron-style TP puts the
all-reduces on the critical path).

TP strategies (:data:`STRATEGIES`):

``megatron``
    Attention split by heads (``ceil(q_heads / t)`` q heads per die; KV heads split
    ``ceil(kv_heads / t)`` per die, or *replicated* once ``t > kv_heads``: a die keeps
    the KV heads its q heads use), MLP split by FFN columns/rows, embedding and LM head
    split by vocabulary.  Two all-reduces of ``tokens x hidden`` per layer over a ring of
    all ``t`` dies.
``gqa-hybrid``
    Head x sequence split for grouped-KV attention: the ``t`` dies form
    ``g = gcd(t, kv_heads)`` groups (one per set of KV heads) of ``s = t / g`` dies; a
    group holds its KV heads *sharded along the sequence* (no KV replication), every
    die of the group computes all of the group's q heads against its slice of the keys,
    and partial results are combined (flash-decoding style).  Projections are split by
    columns inside the group.  Per layer: the two Megatron all-reduces over all dies,
    plus an all-gather of the group's new q/k/v and an all-reduce of the partial
    attention outputs (with softmax max and sum) over the ``s`` dies of each group.
    Equal to ``megatron`` when ``t`` divides ``kv_heads``.

Units: seconds, bytes, FLOPs, tokens.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..specs import mesh as _mesh
from ..costs import ModelParams, roofline
from ..specs import HardwareSpec, ModelSpec, SpecError
from .hardware import WaferParams, WaferSpec

Array = Any

STRATEGIES = ("megatron", "gqa-hybrid")


def _pytree(cls):
    cls = dataclass(frozen=True)(cls)
    return jax.tree_util.register_dataclass(cls, data_fields=[f.name for f in dataclasses.fields(cls)], meta_fields=[])


# --------------------------------------------------------------------------- instance structure


@_pytree
class TPPlan:
    """Per-die shares of one tensor-parallel instance (scalars; ``[N]`` when stacked).

    Parameter counts are per die and per transformer block unless noted; element
    counts are per token.

    Fields:
      dies: t, dies in the instance.
      attn_params: attention projection parameters held (and read) by one die.
      mlp_params: dense-MLP parameters per die (dense blocks).
      expert_params: parameters of one routed expert per die (MoE blocks).
      moe_static_params: MoE-block parameters every token touches per die
        (attention, router, norms, shared experts).
      moe_held_params: all parameters of one MoE block per die.
      replicated_params: norm (and router) parameters every die keeps whole.
      vocab_params: embedding + LM head parameters per die (whole model, not per block).
      lm_head_params: LM head parameters per die.
      attn_pair_flops: attention FLOPs per (query, key) pair per block on one die.
      kv_elems: KV elements per token per block stored on (and read by) one die.
      kv_read_amplification: KV elements the instance reads per token per block,
        over the model's KV elements (1, or > 1 when KV heads are replicated).
      allreduce_elems: elements per token per block all-reduced over all dies.
      ring_hops, ring_load, ring_internode: the all-die ring: longest route of one
        ring step in hops, most ring steps sharing one directed link, and 1 when a
        step crosses nodes (cluster) else 0.
      group_size: s, dies per attention group (1 for megatron).
      group_allgather_elems, group_allreduce_elems: elements per token per block
        all-gathered / all-reduced inside each group.
      group_hops, group_load, group_internode: the same ring profile for the groups
        (all groups run at once, so ``group_load`` counts their shared links).
      perimeter_links: directed links entering the rectangle from outside,
        ``2 * (rows + cols)`` (those on the wafer edge included), used as the
        nominal ingress for KV held on other dies.
    """

    dies: Array
    attn_params: Array
    mlp_params: Array
    expert_params: Array
    moe_static_params: Array
    moe_held_params: Array
    replicated_params: Array
    vocab_params: Array
    lm_head_params: Array
    attn_pair_flops: Array
    kv_elems: Array
    kv_read_amplification: Array
    allreduce_elems: Array
    ring_hops: Array
    ring_load: Array
    ring_internode: Array
    group_size: Array
    group_allgather_elems: Array
    group_allreduce_elems: Array
    group_hops: Array
    group_load: Array
    group_internode: Array
    perimeter_links: Array


@dataclass(frozen=True)
class InstanceConfig:
    """Static description of an instance: shape and TP strategy (hashable)."""

    rows: int
    cols: int
    strategy: str = "megatron"

    @property
    def dies(self) -> int:
        return self.rows * self.cols

    @property
    def label(self) -> str:
        return f"{self.rows}x{self.cols}/{self.strategy}"


def ring_order(rows: int, cols: int) -> list[tuple[int, int]]:
    """Cells of a ``rows x cols`` rectangle in ring order.

    A Hamiltonian cycle of neighbours when one side is even and both are >= 2
    (every ring step is one hop); otherwise a boustrophedon path whose closing step
    (last to first) is several hops long.
    """
    if rows == 1 or cols == 1:
        return [(r, c) for r in range(rows) for c in range(cols)]
    if rows % 2 and not cols % 2:
        return [(r, c) for c, r in ring_order(cols, rows)]
    if rows % 2 == 0:
        cells = [(0, c) for c in range(cols)]
        for r in range(1, rows):
            span = range(cols - 1, 0, -1) if r % 2 else range(1, cols)
            cells += [(r, c) for c in span]
        cells += [(r, 0) for r in range(rows - 1, 0, -1)]
        return cells
    cells = []
    for r in range(rows):
        span = range(cols) if r % 2 == 0 else range(cols - 1, -1, -1)
        cells += [(r, c) for c in span]
    return cells


def _ring_profile(wafer: WaferSpec, rows: int, cols: int, rings: list[list[tuple[int, int]]]):
    """(max hops, max link load, crosses nodes) of concurrent rings inside a rows x cols instance."""
    rings = [r for r in rings if len(r) > 1]
    if not rings:
        return 0, 0, 0
    if not wafer.is_mesh:
        internode = any(len({cell[0] for cell in ring}) > 1 for ring in rings)
        return 1, 1, int(internode)
    spec = HardwareSpec(name="instance", rows=rows, cols=cols)
    transfers = []
    for ring in rings:
        ids = [r * cols + c for r, c in ring]
        transfers += [(ids[i], ids[(i + 1) % len(ids)]) for i in range(len(ids))]
    hops = max(len(_mesh.xy_route(spec, a, b)) for a, b in transfers)
    loads = _mesh.link_loads(spec, transfers)
    return hops, int(max(loads.values())), 0


def tp_plan(model: ModelSpec, wafer: WaferSpec, config: InstanceConfig, dtype=jnp.float32) -> TPPlan:
    """Per-die shares and collective profile of ``config`` for ``model`` on ``wafer``.

    Raises:
      SpecError: unknown strategy, or an instance that does not fit the wafer grid.
    """
    rows, cols, strategy = config.rows, config.cols, config.strategy
    if strategy not in STRATEGIES:
        raise SpecError(f"unknown TP strategy {strategy!r}; choose from {', '.join(STRATEGIES)}")
    if not (isinstance(rows, int) and isinstance(cols, int) and rows >= 1 and cols >= 1):
        raise SpecError(f"instance shape must be positive integers, got {rows!r} x {cols!r}")
    fits = (rows <= wafer.rows and cols <= wafer.cols) or (wafer.is_mesh and cols <= wafer.rows and rows <= wafer.cols)
    if not fits:
        raise SpecError(f"instance {rows}x{cols} is larger than the {wafer.rows}x{wafer.cols} "
                        f"{'wafer' if wafer.is_mesh else 'cluster (nodes x GPUs)'} {wafer.name}; choose rows <= "
                        f"{wafer.rows} and cols <= {wafer.cols}")
    t = rows * cols
    m = model
    d, hd = m.hidden, m.head_dim
    mla = m.attention == "mla"
    kv_heads = 1 if mla else m.kv_heads
    ceil = lambda a, b: -(-a // b)

    ffn_dense = m.dense_ffn or m.ffn
    mlp = 3 * d * ceil(ffn_dense, t)
    expert = 3 * d * ceil(m.ffn, t) if m.is_moe else 0
    vocab_rows = ceil(m.vocab, t)
    vocab = vocab_rows * d * (1 if m.tied_embeddings else 2)
    lm_head = vocab_rows * d
    norms = m.norm_params
    router = m.router_params
    pair_full = m.attention_flops_per_pair  # 2 * q_heads * (qk + v)
    kv_full = m.kv_elements_per_token_layer

    order = ring_order(rows, cols)
    if strategy == "megatron":
        qh = ceil(m.q_heads, t)
        if mla:
            attn = ceil(m.attention_params, t)
            kv = kv_full  # the latent is shared by all heads: every die keeps it whole
        else:
            kvh = ceil(m.kv_heads, t) if t <= m.kv_heads else ceil(qh, m.q_heads // m.kv_heads)
            attn = d * hd * (2 * qh + 2 * kvh)
            kv = 2 * kvh * hd
        pair = pair_full * qh / m.q_heads
        s = 1
        gather = reduce = 0.0
        groups = [[cell] for cell in order]  # no group collectives
    else:  # gqa-hybrid
        g = math.gcd(t, kv_heads)
        s = t // g
        qg, kvg = m.q_heads // g, kv_heads // g
        if mla:
            attn = ceil(m.attention_params, t)
            kv = kv_full / s
        else:
            attn = d * (2 * ceil(qg * hd, s) + 2 * ceil(kvg * hd, s))
            kv = 2 * kvg * hd / s
        pair = pair_full / t
        gather = (m.q_heads + 2 * kv_heads) / g * (m.qk_head_dim if mla else hd) if s > 1 else 0.0
        reduce = m.q_heads / g * (m.v_dim + 2) if s > 1 else 0.0
        groups = [order[i * s:(i + 1) * s] for i in range(g)]
    ring_h, ring_l, ring_x = _ring_profile(wafer, rows, cols, [order])
    grp_h, grp_l, grp_x = _ring_profile(wafer, rows, cols, groups)

    moe_static = attn + norms + router + m.shared_experts * expert
    moe_held = moe_static + m.experts * expert
    f = lambda v: np.asarray(v, dtype=dtype)
    return TPPlan(
        dies=f(t), attn_params=f(attn), mlp_params=f(mlp), expert_params=f(expert), moe_static_params=f(moe_static),
        moe_held_params=f(moe_held), replicated_params=f(norms), vocab_params=f(vocab), lm_head_params=f(lm_head),
        attn_pair_flops=f(pair), kv_elems=f(kv), kv_read_amplification=f(t * kv / kv_full),
        allreduce_elems=f(2 * d if t > 1 else 0), ring_hops=f(ring_h), ring_load=f(ring_l), ring_internode=f(ring_x),
        group_size=f(s), group_allgather_elems=f(gather), group_allreduce_elems=f(reduce), group_hops=f(grp_h),
        group_load=f(grp_l), group_internode=f(grp_x), perimeter_links=f(2 * (rows + cols)),
    )


def stack_plans(plans: list[TPPlan]) -> TPPlan:
    """Stack plans along a new leading axis ``[N]`` (for ``vmap`` over instances)."""
    return jax.tree_util.tree_map(lambda *xs: np.stack(xs), *plans)


def model_params(model: ModelSpec, dtype=jnp.float32) -> ModelParams:
    """Traced model numbers (:class:`mocap_jax.costs.ModelParams`)."""
    return ModelParams.from_spec(model, dtype)


# --------------------------------------------------------------------------- collectives


def ring_collective_time(hw: WaferParams, bytes_total, members, hops, load, internode, steps_per_member):
    """Seconds of a ring collective over ``members`` dies.

    ``steps_per_member x (members - 1)`` steps (2 for all-reduce, 1 for all-gather),
    each moving ``bytes_total / members`` bytes per die over the slowest ring step:
    ``max(hops x link latency, internode x node latency) + sync latency +
    chunk x load / (bandwidth x eff_link)``, bandwidth = node (network) bandwidth when
    the ring leaves a node, else the D2D / NVLink bandwidth.  Zero for one member.
    """
    n = jnp.maximum(members, 1.0)
    bw = jnp.where(internode > 0, hw.node_bandwidth, hw.link_bandwidth) * hw.eff_link
    lat = jnp.maximum(hops * hw.link_latency_s, internode * hw.node_latency_s) + hw.sync_latency_s
    steps = steps_per_member * (n - 1.0)
    return jnp.where(members > 1, steps * (lat + bytes_total / n * load / bw), 0.0)


def all_reduce_time(hw: WaferParams, plan: TPPlan, bytes_total):
    """Ring all-reduce of ``bytes_total`` (the full tensor) over all dies of the instance."""
    return ring_collective_time(hw, bytes_total, plan.dies, plan.ring_hops, plan.ring_load, plan.ring_internode, 2.0)


def all_gather_time(hw: WaferParams, plan: TPPlan, bytes_total):
    """Ring all-gather of a tensor of ``bytes_total`` (assembled size) over all dies."""
    return ring_collective_time(hw, bytes_total, plan.dies, plan.ring_hops, plan.ring_load, plan.ring_internode, 1.0)


def layer_comm_time(hw: WaferParams, plan: TPPlan, tokens):
    """Collectives of one transformer block on ``tokens`` tokens (all-reduces + group terms)."""
    ab = hw.activation_bytes
    t = all_reduce_time(hw, plan, tokens * plan.allreduce_elems * ab)
    t = t + ring_collective_time(hw, tokens * plan.group_allgather_elems * ab, plan.group_size, plan.group_hops,
                                 plan.group_load, plan.group_internode, 1.0)
    t = t + ring_collective_time(hw, tokens * plan.group_allreduce_elems * ab, plan.group_size, plan.group_hops,
                                 plan.group_load, plan.group_internode, 2.0)
    return t


# --------------------------------------------------------------------------- remote KV


@_pytree
class RemoteKV:
    """KV of a decode instance's batch held in DRAM outside the instance.

    Fields:
      tokens: ``[K]`` KV tokens (summed over the batch's requests) held at remote
        location k (a die, or a group of dies at the same distance).
      hops: ``[K]`` hop distance from location k to the nearest die of the instance.
      internode: ``[K]`` 1 when the route leaves a node (cluster), else 0.
      ingress_links: scalar, links the remote reads can enter the instance by.
    """

    tokens: Array
    hops: Array
    internode: Array
    ingress_links: Array

    @staticmethod
    def none(dtype=jnp.float32) -> "RemoteKV":
        z = np.zeros(1, dtype)
        return RemoteKV(tokens=z, hops=z, internode=z, ingress_links=np.asarray(1.0, dtype))


def remote_kv_time(model: ModelParams, hw: WaferParams, plan: TPPlan, remote: RemoteKV):
    """Seconds per block to read the remote KV into the instance.

    Per location: ``bytes_k = tokens_k x KV elements per token per block x
    kv_read_amplification x kv_bytes``, limited by the remote die's DRAM and by the
    route's bottleneck link, plus hop latency; all locations stream at once but share
    the instance's ``ingress_links``::

        max( max_k [max(bytes_k / (dram_bw eff), bytes_k / (link_bw eff)) + latency_k],
             sum_k bytes_k / (ingress_links x link_bw x eff) )
    """
    bytes_k = remote.tokens * model.kv_elements_per_token_layer * plan.kv_read_amplification * hw.kv_bytes
    link = jnp.where(remote.internode > 0, hw.node_bandwidth, hw.link_bandwidth) * hw.eff_link
    lat = jnp.maximum(remote.hops * hw.link_latency_s, remote.internode * hw.node_latency_s)
    per = jnp.maximum(bytes_k / (hw.dram_bandwidth * hw.eff_dram), bytes_k / link) + lat
    per = jnp.where(remote.tokens > 0, per, 0.0)
    agg = jnp.sum(bytes_k) / (jnp.maximum(remote.ingress_links, 1.0) * hw.link_bandwidth * hw.eff_link)
    return jnp.maximum(jnp.max(per, initial=0.0), agg)


# --------------------------------------------------------------------------- iteration time


def _iteration_time(model: ModelParams, hw: WaferParams, plan: TPPlan, tokens, attn_pairs, kv_local_tokens,
                    head_tokens, remote_per_layer):
    """Seconds of one iteration of the instance (all blocks, embedding, LM head)."""
    wb, ab = hw.weight_bytes, hw.activation_bytes
    act = 2.0 * tokens * model.hidden * ab
    dense_params = plan.attn_params + plan.mlp_params + plan.replicated_params
    dense_gemm = roofline(2.0 * dense_params * tokens, dense_params * wb + act,
                          hw.peak_flops, hw.eff_gemm, hw.dram_bandwidth, hw.eff_dram)
    touched = jnp.minimum(model.experts, tokens * model.experts_active)
    moe_gemm = roofline(2.0 * (plan.moe_static_params + model.experts_active * plan.expert_params) * tokens,
                        (plan.moe_static_params + touched * plan.expert_params) * wb + act,
                        hw.peak_flops, hw.eff_gemm, hw.dram_bandwidth, hw.eff_dram)
    local = roofline(plan.attn_pair_flops * attn_pairs, kv_local_tokens * plan.kv_elems * hw.kv_bytes,
                     hw.peak_flops, hw.eff_attention, hw.dram_bandwidth, hw.eff_dram)
    attn = local + remote_per_layer - hw.remote_kv_overlap * jnp.minimum(local, remote_per_layer)
    per_layer = attn + layer_comm_time(hw, plan, tokens) + hw.layer_overhead_s
    moe_layers = model.layers - model.dense_layers
    blocks = model.dense_layers * (dense_gemm + per_layer) + moe_layers * (moe_gemm + per_layer)
    embed = tokens * model.hidden * (wb + ab) / (hw.dram_bandwidth * hw.eff_dram) \
        + all_reduce_time(hw, plan, tokens * model.hidden * ab)
    head = roofline(2.0 * plan.lm_head_params * head_tokens, plan.lm_head_params * wb,
                    hw.peak_flops, hw.eff_gemm, hw.dram_bandwidth, hw.eff_dram)
    head = head + all_gather_time(hw, plan, head_tokens * model.vocab * ab)
    head = jnp.where(head_tokens > 0, head, 0.0)
    return blocks + embed + head


def prefill_time(model: ModelParams, hw: WaferParams, plan: TPPlan, tokens, attn_pairs, kv_read_tokens, head_tokens):
    """Seconds of one chunked-prefill iteration from its aggregate contents.

    Args (broadcastable scalars or arrays):
      tokens: prompt tokens processed this iteration (sum of chunk sizes).
      attn_pairs: causal (query, key) pairs, ``sum_r c_r (p_r + (c_r + 1) / 2)``.
      kv_read_tokens: KV tokens read per block, ``sum_r (p_r + c_r)``.
      head_tokens: requests whose last chunk is in this iteration (LM head runs once each).

    Returns:
      seconds, broadcast over the inputs; 0 where ``tokens == 0`` (no iteration).
    """
    t = _iteration_time(model, hw, plan, tokens, attn_pairs, kv_read_tokens, head_tokens, 0.0)
    return jnp.where(tokens > 0, t, 0.0)  # an idle instance runs no iteration


def _float_dtype(x):
    return x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else jnp.float32


def prefill_iteration_time(model: ModelParams, hw: WaferParams, plan: TPPlan, chunk, prefix, last, mask=None):
    """Seconds of one chunked-prefill iteration of a batch of requests.

    Args:
      chunk: ``[R]`` tokens of each request's chunk in this iteration.
      prefix: ``[R]`` tokens of the request already prefilled (KV present).
      last: ``[R]`` bool, the chunk ends its prompt (the LM head emits the first token).
      mask: ``[R]`` bool, live requests (padding rows are ignored); default all.
    """
    chunk, prefix = jnp.asarray(chunk), jnp.asarray(prefix)
    mask = jnp.ones(chunk.shape, bool) if mask is None else jnp.asarray(mask)
    c = jnp.where(mask, chunk, 0)
    p = jnp.where(mask, prefix, 0)
    tokens = jnp.sum(c, axis=-1)
    pairs = jnp.sum(c * (p + (c + 1) / 2.0), axis=-1)
    kv = jnp.sum(jnp.where(c > 0, p + c, 0), axis=-1)
    head = jnp.sum(mask & jnp.asarray(last), axis=-1).astype(_float_dtype(c))
    return prefill_time(model, hw, plan, tokens, pairs, kv, head)


def decode_time(model: ModelParams, hw: WaferParams, plan: TPPlan, requests, context_tokens,
                remote: RemoteKV | None = None):
    """Seconds of one continuous-batching decode iteration from its aggregate contents.

    Weights are read once per block; each request's query attends to its whole KV
    (``context_tokens`` = sum over the batch of KV tokens incl. the token being
    decoded).  KV in ``remote`` is part of ``context_tokens`` but read across the mesh.

    Args:
      requests: requests in the batch (one new token each).
      context_tokens: total KV tokens the batch attends to.
      remote: KV held outside the instance (default none).

    Returns:
      seconds, broadcast over the inputs; 0 where ``requests == 0`` (no iteration).
    """
    remote = RemoteKV.none() if remote is None else remote
    remote_tokens = jnp.sum(remote.tokens)
    local = jnp.maximum(context_tokens - remote_tokens, 0.0)
    r = remote_kv_time(model, hw, plan, remote)
    t = _iteration_time(model, hw, plan, requests, context_tokens, local, requests, r)
    return jnp.where(requests > 0, t, 0.0)  # an empty batch runs no iteration


def decode_iteration_time(model: ModelParams, hw: WaferParams, plan: TPPlan, context, mask=None,
                          remote: RemoteKV | None = None):
    """Seconds of one decode iteration of a batch.

    Args:
      context: ``[R]`` KV tokens each request attends to (including the new token).
      mask: ``[R]`` bool, live requests; default all.
      remote: KV held outside the instance (its tokens are part of ``context``).
    """
    context = jnp.asarray(context)
    mask = jnp.ones(context.shape, bool) if mask is None else jnp.asarray(mask)
    n = jnp.sum(mask, axis=-1).astype(_float_dtype(context))
    ctx = jnp.sum(jnp.where(mask, context, 0), axis=-1)
    return decode_time(model, hw, plan, n, ctx, remote)


# --------------------------------------------------------------------------- memory


def weight_bytes_per_die(model: ModelParams, hw: WaferParams, plan: TPPlan):
    """Weight bytes one die of the instance holds."""
    moe_layers = model.layers - model.dense_layers
    params = model.dense_layers * (plan.attn_params + plan.mlp_params + plan.replicated_params) \
        + moe_layers * plan.moe_held_params + plan.vocab_params
    return params * hw.weight_bytes


def kv_bytes_per_token_per_die(model: ModelParams, hw: WaferParams, plan: TPPlan):
    """KV bytes one token of one request adds to each die of the instance (all blocks)."""
    return model.layers * plan.kv_elems * hw.kv_bytes


def workspace_bytes(model: ModelParams, hw: WaferParams, tokens):
    """Activation buffers of an iteration of ``tokens`` tokens (per die)."""
    return hw.activation_workspace_factor * tokens * model.hidden * hw.activation_bytes


def kv_capacity_tokens(model: ModelParams, hw: WaferParams, plan: TPPlan, workspace_tokens):
    """KV tokens the instance can hold after weights and workspace (0 if the weights do not fit)."""
    room = hw.usable_dram - weight_bytes_per_die(model, hw, plan) - workspace_bytes(model, hw, workspace_tokens)
    return jnp.maximum(room, 0.0) / kv_bytes_per_token_per_die(model, hw, plan)


def kv_transfer_time(hw: WaferParams, bytes_, hops, bottleneck_bandwidth, internode=0.0):
    """Seconds to move ``bytes_`` of KV over a route of ``hops`` hops (prefill -> decode).

    ``bottleneck_bandwidth`` is the route's effective raw bandwidth in bytes/s (e.g.
    the D2D link bandwidth divided by the number of transfers sharing its busiest link).
    """
    lat = jnp.maximum(hops * hw.link_latency_s, internode * hw.node_latency_s)
    return jnp.where(bytes_ > 0, lat + bytes_ / (bottleneck_bandwidth * hw.eff_link), 0.0)


__all__ = [
    "STRATEGIES", "TPPlan", "InstanceConfig", "RemoteKV", "ring_order", "tp_plan", "stack_plans", "model_params",
    "ring_collective_time", "all_reduce_time", "all_gather_time", "layer_comm_time", "remote_kv_time",
    "prefill_time", "prefill_iteration_time", "decode_time", "decode_iteration_time", "weight_bytes_per_die",
    "kv_bytes_per_token_per_die", "workspace_bytes", "kv_capacity_tokens", "kv_transfer_time",
]
