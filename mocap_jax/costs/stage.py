"""Per-chunk, per-stage cost model as traced array programs.

A chunk of ``c`` tokens for each of ``b`` requests after ``p`` prefix tokens, on a stage
holding a block of layers: GEMMs (dense, or MoE reading the experts actually touched),
causal attention over the prefix and the chunk, embedding on the first stage and the LM head
(one token per request) on the last, each a roofline ``max(FLOPs / (peak x eff), bytes /
(bandwidth x eff))`` with a GEMM efficiency that rises with the tokens a GEMM processes
(:mod:`.efficiency`); the activation hand-off to the next stage over the route between the two
stages; and the bytes a stage holds (weights, KV per token, an in-flight item's workspace).  A
stage may run on a group of ``t`` dies (tensor parallelism): every cost is then one die's share
(:mod:`.tensor_parallel`) plus the group's all-reduces, and ``t = 1`` gives the single-die
costs exactly.  The formulas are written against an array namespace ``xp`` (``jax.numpy`` by default, ``numpy`` for
the event-driven reference), so both simulators share one statement of the cost model.

Shapes: ``c``, ``p``, ``b`` broadcast together; stage quantities are ``[N]`` over (padded)
stages.  Units: seconds, bytes, FLOPs.
"""

from __future__ import annotations

import jax.numpy as jnp

from . import tensor_parallel as tp
from .computed_once import computed_once
from .efficiency import DENSE_LAYER_GEMMS, MOE_LAYER_GEMMS, gemm_efficiency
from .params import HardwareParams, ModelParams, StageLayout


# --------------------------------------------------------------------------- layers per stage


def stage_layer_counts(model: ModelParams, num_stages, n_pad: int, xp=jnp):
    """Balanced contiguous blocks of layers per stage.

    ``L // N`` layers each; the ``L % N`` extra layers go to interior stages first
    (stages 1..N-2, then 0, then N-1), because the end stages also hold the
    embedding and the LM head.

    Returns ``(dense[N_pad], moe[N_pad])`` layer counts (float), zero on padded stages.
    """
    s = xp.arange(n_pad)
    n = num_stages
    L = model.layers
    base = L // n
    extra = L % n
    rank = xp.where(s == 0, n - 2, xp.where(s == n - 1, n - 1, s - 1))
    rank = xp.where(n == 1, 0, rank)
    count = xp.where(s < n, base + (rank < extra), 0)
    end = xp.cumsum(count)
    start = end - count
    dense = xp.clip(xp.minimum(end, model.dense_layers) - start, 0, None)
    moe = count - dense
    dt = model.hidden.dtype
    return dense.astype(dt), moe.astype(dt)


# --------------------------------------------------------------------------- per-block formulas


def roofline(flops, bytes_, peak, eff_compute, bandwidth, eff_bw, xp=jnp):
    """max(FLOPs / (peak x eff), bytes / (bandwidth x eff)) in seconds."""
    return xp.maximum(flops / (peak * eff_compute), bytes_ / (bandwidth * eff_bw))


def gemm_time(params, tokens, bytes_, kernels, hw: HardwareParams, xp=jnp):
    """GEMMs over ``params`` weights (in ``kernels`` kernels) on ``tokens`` tokens reading ``bytes_``."""
    return roofline(2 * params * tokens, bytes_, hw.peak_flops, gemm_efficiency(tokens, params, kernels, hw, xp),
                    hw.hbm_bandwidth, hw.eff_hbm, xp)


def dense_layer_time(model: ModelParams, hw: HardwareParams, c, p, b, xp=jnp, tensor_parallel=1.0):
    """Seconds for one dense block on a chunk of ``c`` tokens x ``b`` requests after prefix ``p``
    (one die's share of a ``tensor_parallel``-die group; collectives excluded)."""
    tokens = b * c
    act = 2 * tokens * model.hidden * hw.activation_bytes
    params = tp.dense_layer_params_per_die(model, tensor_parallel, xp)
    gemm = gemm_time(params, tokens, params * hw.weight_bytes + act, DENSE_LAYER_GEMMS, hw, xp)
    return gemm + attention_time(model, hw, c, p, b, xp, tensor_parallel) + hw.layer_overhead_s


def attention_time(model: ModelParams, hw: HardwareParams, c, p, b, xp=jnp, tensor_parallel=1.0):
    """Causal attention of a chunk over its prefix and itself, one block (one die's heads)."""
    flops = tp.attention_flops_per_pair_per_die(model, tensor_parallel, xp) * b * c * (p + (c + 1) / 2)
    kv_read = b * (p + c) * tp.kv_elements_per_die(model, tensor_parallel, xp) * hw.kv_bytes
    return roofline(flops, kv_read, hw.peak_flops, hw.eff_attention, hw.hbm_bandwidth, hw.eff_hbm, xp)


def experts_touched(model: ModelParams, c, b, xp=jnp):
    """Routed experts a chunk touches: min(E, tokens x top_k)."""
    return xp.minimum(model.experts, b * c * model.experts_active)


def moe_layer_time(model: ModelParams, hw: HardwareParams, c, p, b, xp=jnp, tensor_parallel=1.0):
    """Seconds for one MoE block: GEMMs of active parameters, weight bytes of touched experts
    (one die's share; collectives excluded)."""
    tokens = b * c
    act = 2 * tokens * model.hidden * hw.activation_bytes
    t = tensor_parallel
    weights = (tp.moe_static_params_per_die(model, t, xp)
               + experts_touched(model, c, b, xp) * tp.expert_params_per_die(model, t, xp)) * hw.weight_bytes
    gemm = gemm_time(tp.moe_active_params_per_die(model, t, xp), tokens, weights + act, MOE_LAYER_GEMMS, hw, xp)
    return gemm + attention_time(model, hw, c, p, b, xp, t) + hw.layer_overhead_s


def embedding_time(model: ModelParams, hw: HardwareParams, c, b):
    """Embedding lookup: gather ``b x c`` rows and write the activations."""
    return b * c * model.hidden * (hw.weight_bytes + hw.activation_bytes) / (hw.hbm_bandwidth * hw.eff_hbm)


def lm_head_time(model: ModelParams, hw: HardwareParams, b, xp=jnp, tensor_parallel=1.0):
    """LM head for one token per request (prefill-only serving), one die's vocabulary rows."""
    params = tp.lm_head_params_per_die(model, tensor_parallel, xp)
    return gemm_time(params, b, params * hw.weight_bytes, 1, hw, xp)


def _per_item(xp, values):
    """Per-item block times, kept once per item for the ``[..., N_pad]`` tables that broadcast them
    over the stages (left to XLA, each table's fused kernel evaluates them once per stage cell)."""
    return computed_once(values) if xp is jnp else values


def _on_stages(x):
    """A per-item ``[...]`` value with a length-1 stage axis appended, to broadcast over ``[N_pad]``."""
    return x[..., None]


def _group_ring(hw: HardwareParams, layout: StageLayout, shift: int = 0, xp=jnp):
    """``(t, step latency, step bandwidth)`` of each stage group's ring (of stage s + ``shift``);
    ``t`` is the layout's scalar group size."""
    hops, bw = layout.group_hops, layout.group_bandwidth
    if shift:
        hops, bw = xp.roll(hops, -shift), xp.roll(bw, -shift)
    return layout.tensor_parallel, hops * hw.link_latency_s, bw * hw.eff_link


def handoff_time(model: ModelParams, hw: HardwareParams, layout: StageLayout, c, b, n_pad: int, xp=jnp):
    """Hand-off delay d[..., s] from stage s to s+1.

    ``hops x latency + bytes / effective bandwidth`` over the route between the groups
    (each of the sender's ``t`` dies sends ``1/t`` of the activations to its counterpart),
    plus the receiving group's all-gather that reassembles them (none for one die).
    ``c`` and ``b`` have shape ``[...]``; the result is ``[..., N_pad]``, zero for
    ``s >= N - 1`` (no hand-off after the last stage, none on padded stages).
    """
    bytes_ = _on_stages(b * c * model.hidden * hw.activation_bytes)
    s = xp.arange(n_pad)
    live = s < layout.num_stages - 1
    d = layout.handoff_hops * hw.link_latency_s + bytes_ / (layout.handoff_bandwidth * hw.eff_link)
    d = d + tp.all_gather_time(bytes_, *_group_ring(hw, layout, 1, xp), xp=xp)
    return xp.where(live, d, 0.0)


def stage_times(model: ModelParams, hw: HardwareParams, layout: StageLayout, c, p, b, last, n_pad: int, xp=jnp):
    """Time of each item on each stage, ``t[..., N_pad]`` in seconds.

    A stage group's time is one die's share of every block plus two all-reduces of the
    block's activations per block (and one after the embedding on stage 0, an all-gather of
    the logits after the LM head on stage N-1).

    Args:
      c, p, b: ``[...]`` chunk tokens, prefix tokens, requests of each item.
      last: ``[...]`` bool, the item ends its requests (the LM head runs on the last stage).
      n_pad: static stage bucket size.
    """
    dense, moe = stage_layer_counts(model, layout.num_stages, n_pad, xp)
    t_group = layout.tensor_parallel
    # the block formulas depend on the item only (one group size for every stage), so they run
    # once per item and broadcast over the stage axis; only the rings differ from stage to stage
    dense_block, moe_block, embedding, lm_head = (_on_stages(x) for x in _per_item(xp, (
        dense_layer_time(model, hw, c, p, b, xp, t_group), moe_layer_time(model, hw, c, p, b, xp, t_group),
        embedding_time(model, hw, c, b), lm_head_time(model, hw, b, xp, t_group))))
    ring = _group_ring(hw, layout, 0, xp)
    activations = _on_stages(b * c * model.hidden * hw.activation_bytes)
    reduce = tp.all_reduce_time(activations, *ring, xp=xp)
    t = dense * (dense_block + 2 * reduce) + moe * (moe_block + 2 * reduce)
    s = xp.arange(n_pad)
    t = t + xp.where(s == 0, embedding + reduce, 0.0)
    logits = tp.all_gather_time(_on_stages(b * model.vocab * hw.activation_bytes), *ring, xp=xp)
    head = xp.where(_on_stages(last), lm_head + logits, 0.0)
    t = t + xp.where(s == layout.num_stages - 1, head, 0.0)
    return xp.where(s < layout.num_stages, t, 0.0)


def stage_weight_bytes(model: ModelParams, hw: HardwareParams, num_stages, n_pad: int, xp=jnp, tensor_parallel=1.0):
    """Weight bytes held by each die of each stage, ``[N_pad]`` (embedding on stage 0, LM head on
    stage N-1); ``tensor_parallel``: dies per stage group."""
    dense, moe = stage_layer_counts(model, num_stages, n_pad, xp)
    t = tensor_parallel
    s = xp.arange(n_pad)
    params = dense * tp.dense_layer_params_per_die(model, t, xp) + moe * tp.moe_layer_params_per_die(model, t, xp)
    params = params + xp.where(s == 0, tp.embedding_params_per_die(model, t, xp), 0.0)
    params = params + xp.where(s == num_stages - 1, tp.lm_head_params_per_die(model, t, xp), 0.0)
    return params * hw.weight_bytes


def stage_kv_bytes_per_token(model: ModelParams, hw: HardwareParams, num_stages, n_pad: int, xp=jnp,
                             tensor_parallel=1.0):
    """KV bytes one token of one request adds to each die of each stage, ``[N_pad]``."""
    dense, moe = stage_layer_counts(model, num_stages, n_pad, xp)
    return (dense + moe) * tp.kv_elements_per_die(model, tensor_parallel, xp) * hw.kv_bytes


def item_activation_bytes(model: ModelParams, hw: HardwareParams, layout: StageLayout, c, b, last, n_pad: int,
                          xp=jnp):
    """Activation buffers of an in-flight item on each stage, ``[..., N_pad]`` bytes.

    A stage runs its blocks one after another and reuses their buffers, so an item needs the
    largest block's buffers (the KV it writes is counted apart, as KV):

    * an attention block runs over the whole chunk of ``b x c`` request-tokens and holds, per
      token, the residual stream, the queries and the attention output
      (``ModelParams.attention_buffer_elements``; FlashAttention-style kernels never hold the
      score matrix);
    * an MLP block holds the residual stream of the whole chunk and the intermediates of
      ``min(b x c, mlp_token_tile)`` tokens (the whole chunk when the tile is 0): gate and up
      projections and the output (``*_mlp_buffer_elements``).  Engines for prefill-only serving run the MLP over token tiles
      while attention stays whole (PrefillOnly's hybrid prefilling), because the MLP
      intermediates are the largest tensors of a prefill;
    * on the last stage the LM head's logits for one token per request (``b x vocab``), on the
      item that ends its requests.

    Under tensor parallelism over ``t`` dies the residual stream is whole on every die while the
    head and FFN parts are split ``t`` ways (Megatron sharding): the bytes are per die.  Everything is
    scaled by ``activation_buffer_scale`` and stored at ``activation_bytes``.
    """
    dense, moe = stage_layer_counts(model, layout.num_stages, n_pad, xp)
    t_group = layout.tensor_parallel
    tokens = _on_stages(b * c)
    bb = _on_stages(b)
    tile = xp.where(hw.mlp_token_tile > 0, xp.minimum(tokens, hw.mlp_token_tile), tokens)
    mlp = xp.maximum(xp.where(dense > 0, model.dense_mlp_buffer_elements, 0.0),
                     xp.where(moe > 0, model.moe_mlp_buffer_elements, 0.0))
    s = xp.arange(n_pad)
    head = xp.where((s == layout.num_stages - 1) & _on_stages(last), bb * model.vocab, 0.0)
    attention = model.hidden + (model.attention_buffer_elements - model.hidden) / t_group
    mlp = model.hidden + (mlp - model.hidden) / t_group
    elements = xp.maximum(tokens * attention, tokens * model.hidden + tile * mlp) + head
    return xp.where(s < layout.num_stages, hw.activation_buffer_scale * elements * hw.activation_bytes, 0.0)


def stage_attention_times(model: ModelParams, hw: HardwareParams, layout: StageLayout, c, p, b, n_pad: int, xp=jnp):
    """Attention part of each item's time on each stage, ``[..., N_pad]`` seconds (for read overlap)."""
    dense, moe = stage_layer_counts(model, layout.num_stages, n_pad, xp)
    block = _per_item(xp, attention_time(model, hw, c, p, b, xp, layout.tensor_parallel))
    return (dense + moe) * _on_stages(block)
