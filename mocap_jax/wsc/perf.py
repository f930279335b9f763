"""Instance performance models for WSC-LLM serving: iteration times, collectives, remote KV, memory.

The timing functions are pure ``jax.numpy`` functions of

* ``model``: :class:`mocap_jax.costs.ModelParams` (traced model numbers),
* ``hw``: :class:`~mocap_jax.wsc.hardware.WaferParams` (traced hardware numbers),
* ``plan``: :class:`~mocap_jax.wsc.plan.TPPlan` (traced per-die shares of one instance),

plus the iteration's contents, and can be ``jit``-ed and ``vmap``-ed over any of them
(design points, instance shapes, batches).  Every op class costs
:func:`mocap_jax.costs.roofline` (max of compute and DRAM time) on one die; ring
collectives cost ``steps x (hop latency + sync + chunk bytes x link load / link bw)``.
Compute and communication of one layer are sequential (Megatron-style TP puts the
all-reduces on the critical path).

Traffic on shared resources (:func:`iteration_traffic`): the DRAM bytes an iteration reads
per die and the bytes its ring collectives move per use of a link, which the serving
simulation turns into demands on the wafer's links and DRAM when contention is modelled;
the bandwidth a stream gets there enters these functions as a :class:`WaferParams` with
scaled ``dram_bandwidth`` / ``link_bandwidth`` / ``node_bandwidth``.

Units: seconds, bytes, FLOPs, tokens.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from ..costs import ModelParams, pytree, roofline, tensor_parallel
from .hardware import WaferParams
from .plan import TPPlan

Array = Any


# --------------------------------------------------------------------------- collectives


def ring_collective_time(hw: WaferParams, bytes_total, members, hops, load, internode, steps_per_member):
    """Seconds of a ring collective over ``members`` dies
    (:func:`mocap_jax.costs.tensor_parallel.ring_collective_time`, the rule the pipeline stages use).

    The slowest ring step costs ``max(hops x link latency, internode x node latency) + sync
    latency`` and moves its chunk at ``bandwidth x eff_link / load``: the node (network) bandwidth
    when the ring leaves a node, else the D2D / NVLink bandwidth, shared by ``load`` ring steps.
    """
    bw = jnp.where(internode > 0, hw.node_bandwidth, hw.link_bandwidth) * hw.eff_link
    lat = jnp.maximum(hops * hw.link_latency_s, internode * hw.node_latency_s) + hw.sync_latency_s
    return tensor_parallel.ring_collective_time(bytes_total, members, lat, bw / jnp.maximum(load, 1e-30),
                                                steps_per_member)


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


@pytree
class RemoteKV:
    """KV of a decode instance's batch held in DRAM outside the instance (location k: a die,
    or a group of dies at the same distance)."""

    tokens: Array          # [K] KV tokens (summed over the batch's requests) held at location k
    hops: Array            # [K] hops from location k to the nearest die of the instance
    internode: Array       # [K] 1 when the route leaves a node (cluster), else 0
    ingress_links: Array   # [] links the remote reads can enter the instance by

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


def iteration_time(model: ModelParams, hw: WaferParams, plan: TPPlan, tokens, attn_pairs, kv_local_tokens,
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


def iteration_traffic(model: ModelParams, hw: WaferParams, plan: TPPlan, tokens, kv_local_tokens, head_tokens):
    """Bytes an iteration moves on shared resources, beside its compute (same contents as :func:`iteration_time`).

    Returns ``(dram, ring, group)``: DRAM bytes read per die (weights, activations, local KV,
    embedding rows, LM head), and the bytes one ring step's route carries over a link it
    uses, summed over the iteration's collectives, for the all-die ring (all-reduces,
    embedding all-reduce, logits all-gather) and for the attention-group rings.  A ring
    collective of ``B`` bytes over ``n`` members moves ``B / n`` per step in ``k (n - 1)``
    steps (``k`` = 2 all-reduce, 1 all-gather).
    """
    wb, ab = hw.weight_bytes, hw.activation_bytes
    act = 2.0 * tokens * model.hidden * ab
    dense_params = plan.attn_params + plan.mlp_params + plan.replicated_params
    touched = jnp.minimum(model.experts, tokens * model.experts_active)
    local_kv = kv_local_tokens * plan.kv_elems * hw.kv_bytes
    moe_layers = model.layers - model.dense_layers
    dram = model.dense_layers * (dense_params * wb + act + local_kv) \
        + moe_layers * ((plan.moe_static_params + touched * plan.expert_params) * wb + act + local_kv) \
        + tokens * model.hidden * (wb + ab) + jnp.where(head_tokens > 0, plan.lm_head_params * wb, 0.0)

    def per_step(members, steps_per_member, bytes_total):
        n = jnp.maximum(members, 1.0)
        return jnp.where(members > 1, steps_per_member * (n - 1.0) / n * bytes_total, 0.0)

    ring = model.layers * per_step(plan.dies, 2.0, tokens * plan.allreduce_elems * ab) \
        + per_step(plan.dies, 2.0, tokens * model.hidden * ab) \
        + jnp.where(head_tokens > 0, per_step(plan.dies, 1.0, head_tokens * model.vocab * ab), 0.0)
    group = model.layers * (per_step(plan.group_size, 1.0, tokens * plan.group_allgather_elems * ab)
                            + per_step(plan.group_size, 2.0, tokens * plan.group_allreduce_elems * ab))
    return dram, ring, group


def remote_read_time(link_bytes, link_rate, dram_bytes, dram_rate, latency):
    """Seconds per block to read remote KV as flows on routes (the contention model).

    ``link_bytes [L]`` / ``dram_bytes [D]``: bytes per block crossing each link resource /
    read from each die's DRAM; ``link_rate`` / ``dram_rate``: the bandwidth (bytes/s, with
    efficiency) the reads get there; ``latency``: the farthest location's hop latency.  The
    reads of all locations stream at once, so the most loaded resource sets the time::

        max( max_l link_bytes_l / link_rate_l, max_d dram_bytes_d / dram_rate_d ) + latency
    """
    link = jnp.max(jnp.where(link_bytes > 0, link_bytes / jnp.maximum(link_rate, 1e-30), 0.0), initial=0.0)
    dram = jnp.max(jnp.where(dram_bytes > 0, dram_bytes / jnp.maximum(dram_rate, 1e-30), 0.0), initial=0.0)
    return jnp.where((jnp.sum(link_bytes) > 0) | (jnp.sum(dram_bytes) > 0), jnp.maximum(link, dram) + latency, 0.0)


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
    t = iteration_time(model, hw, plan, tokens, attn_pairs, kv_read_tokens, head_tokens, 0.0)
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
    t = iteration_time(model, hw, plan, requests, context_tokens, local, requests, r)
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


__all__ = [
    "RemoteKV", "ring_collective_time", "all_reduce_time", "all_gather_time", "layer_comm_time", "remote_kv_time",
    "iteration_time", "iteration_traffic", "remote_read_time", "prefill_time", "prefill_iteration_time", "decode_time",
    "decode_iteration_time", "weight_bytes_per_die", "kv_bytes_per_token_per_die", "workspace_bytes",
    "kv_capacity_tokens",
]
