"""Tensor parallelism inside a pipeline stage: Megatron-style shares of one die, and ring collectives.

A stage group of ``t`` dies splits every transformer block the Megatron way:

* attention by heads: ``ceil(q_heads / t)`` query heads per die; KV heads ``ceil(kv_heads / t)``
  per die while ``t <= kv_heads``, beyond that each die keeps (a replica of) the KV heads its
  query heads read, ``ceil(q_heads_per_die / (q_heads / kv_heads))``; a latent (MLA) cache is
  shared by all heads, so every die keeps it whole and the projections split evenly;
* the QKV and gate/up projections by output columns, the output and down projections by input
  rows, each expert of an MoE block the same way (every die holds a slice of every expert);
* norms and the router are replicated; embedding and LM head split by vocabulary rows;
* two all-reduces of ``tokens x hidden`` activations per block (after attention, after the
  MLP) and one after the vocabulary-parallel embedding, over a ring of the group's dies.

Every per-die quantity equals the whole-block quantity exactly when ``t = 1``.  The functions
are pure in an array namespace ``xp`` (``jax.numpy`` or ``numpy``) and take the degree ``t`` as a
traced number (scalar or ``[N]`` per stage), so sweeps ``vmap`` over it.  Units: parameters,
elements, FLOPs, bytes, seconds.
"""

from __future__ import annotations

import jax.numpy as jnp

from .params import ModelParams


# --------------------------------------------------------------------------- which degrees a model allows


def heads_problem(q_heads: int, kv_heads: int, grouped: bool, t: int) -> str:
    """Why ``t`` dies cannot split a model's heads (empty if they can): ``t`` must divide the query
    heads and, for grouped-query attention, divide the KV heads or be a multiple of them (engines
    split KV heads, or replicate them beyond ``kv_heads`` dies)."""
    if q_heads % t:
        return f"does not divide the {q_heads} attention heads"
    if grouped and kv_heads % t and t % kv_heads:
        return f"neither divides nor is a multiple of the {kv_heads} KV heads"
    return ""


# --------------------------------------------------------------------------- head and column shares


def q_heads_share(q_heads, t, xp=jnp):
    """Query heads one die computes: ``ceil(q_heads / t)``."""
    return xp.ceil(q_heads / t)


def kv_heads_share(q_heads, kv_heads, t, xp=jnp):
    """KV heads one die keeps: split while ``t <= kv_heads``, replicated beyond."""
    per_die = xp.ceil(kv_heads / t)
    replicated = xp.ceil(q_heads_share(q_heads, t, xp) / (q_heads / kv_heads))
    return xp.where(t <= kv_heads, per_die, replicated)


def column_share(width, t, xp=jnp):
    """Columns (or rows) of a width-``width`` projection one die holds: ``ceil(width / t)``."""
    return xp.ceil(width / t)


def _whole_at_one(t, whole, share, xp):
    """``share`` for ``t > 1``, and the exact whole-block value when one die holds everything."""
    return xp.where(t > 1, share, whole)


def projection_shapes(hidden, q_heads, kv_heads, head_dim, ffn, gated, t, xp=jnp) -> dict:
    """``(K, N)`` of each projection GEMM one die runs (weights ``K x N``).

    Keys: ``attn_pre_proj`` (fused QKV), ``attn_post_proj`` (output), ``mlp_up_proj`` (gate
    and up fused when ``gated``), ``mlp_down_proj``.
    """
    q = q_heads_share(q_heads, t, xp)
    kv = kv_heads_share(q_heads, kv_heads, t, xp)
    f = column_share(ffn, t, xp)
    return {
        "attn_pre_proj": (hidden, (q + 2 * kv) * head_dim),
        "attn_post_proj": (q * head_dim, hidden),
        "mlp_up_proj": (hidden, xp.where(gated, 2.0, 1.0) * f),
        "mlp_down_proj": (f, hidden),
    }


# --------------------------------------------------------------------------- per-die block quantities


def attention_params_per_die(model: ModelParams, t, xp=jnp):
    """Attention projection parameters one die holds (and reads) per block."""
    gqa = 2.0 * model.hidden * model.head_dim * (q_heads_share(model.q_heads, t, xp)
                                                 + kv_heads_share(model.q_heads, model.kv_heads, t, xp))
    latent = xp.ceil(model.attention_params / t)
    return _whole_at_one(t, model.attention_params, xp.where(model.latent_attention > 0, latent, gqa), xp)


def kv_elements_per_die(model: ModelParams, t, xp=jnp):
    """KV-cache elements one token adds to one die per block."""
    share = kv_heads_share(model.q_heads, model.kv_heads, t, xp) / model.kv_heads
    return _whole_at_one(t, model.kv_elements_per_token_layer, model.kv_elements_per_token_layer * share, xp)


def attention_flops_per_pair_per_die(model: ModelParams, t, xp=jnp):
    """Attention FLOPs per (query, key) pair per block on one die (its query heads)."""
    share = q_heads_share(model.q_heads, t, xp) / model.q_heads
    return _whole_at_one(t, model.attention_flops_per_pair, model.attention_flops_per_pair * share, xp)


def expert_params_per_die(model: ModelParams, t, xp=jnp):
    """Parameters of one routed expert held by one die (0 for dense models)."""
    return _whole_at_one(t, model.expert_params, 3.0 * model.hidden * column_share(model.expert_width, t, xp), xp)


def dense_layer_params_per_die(model: ModelParams, t, xp=jnp):
    """Parameters of one dense block held by one die."""
    mlp = 3.0 * model.hidden * column_share(model.dense_mlp_width, t, xp)
    return _whole_at_one(t, model.dense_layer_params, attention_params_per_die(model, t, xp) + mlp
                         + model.norm_params, xp)


def moe_static_params_per_die(model: ModelParams, t, xp=jnp):
    """MoE-block parameters every token touches, per die (attention, norms, router, shared experts)."""
    share = attention_params_per_die(model, t, xp) + model.norm_params + model.router_params \
        + model.shared_experts * expert_params_per_die(model, t, xp)
    return _whole_at_one(t, model.moe_static_params, share, xp)


def moe_active_params_per_die(model: ModelParams, t, xp=jnp):
    """MoE-block parameters one token touches, per die (static + top-k expert slices)."""
    share = moe_static_params_per_die(model, t, xp) + model.experts_active * expert_params_per_die(model, t, xp)
    return _whole_at_one(t, model.moe_active_params, share, xp)


def moe_layer_params_per_die(model: ModelParams, t, xp=jnp):
    """All parameters of one MoE block held by one die."""
    share = moe_static_params_per_die(model, t, xp) + model.experts * expert_params_per_die(model, t, xp)
    return _whole_at_one(t, model.moe_layer_params, share, xp)


def embedding_params_per_die(model: ModelParams, t, xp=jnp):
    """Embedding rows one die holds (vocabulary-parallel)."""
    return _whole_at_one(t, model.embedding_params, column_share(model.vocab, t, xp) * model.hidden, xp)


def lm_head_params_per_die(model: ModelParams, t, xp=jnp):
    """LM-head rows one die holds (vocabulary-parallel; 0 when tied to the embedding)."""
    share = xp.where(model.lm_head_params > 0, column_share(model.vocab, t, xp) * model.hidden, 0.0)
    return _whole_at_one(t, model.lm_head_params, share, xp)


# --------------------------------------------------------------------------- collectives


def ring_collective_time(bytes_total, members, step_latency_s, step_bandwidth, steps_per_member, xp=jnp):
    """Seconds of a ring collective over ``members`` dies.

    ``steps_per_member x (members - 1)`` steps (2 for an all-reduce: reduce-scatter then
    all-gather; 1 for an all-gather), each moving ``bytes_total / members`` per die and
    costing ``step_latency_s + chunk / step_bandwidth`` (the slowest ring step's latency and
    effective bandwidth).  Zero for one member.
    """
    n = xp.maximum(members, 1.0)
    steps = steps_per_member * (n - 1.0)
    return xp.where(members > 1, steps * (step_latency_s + bytes_total / n / step_bandwidth), 0.0)


def all_reduce_time(bytes_total, members, step_latency_s, step_bandwidth, xp=jnp):
    """Ring all-reduce of a ``bytes_total`` tensor: ``2 (t-1)`` steps of ``bytes / t``."""
    return ring_collective_time(bytes_total, members, step_latency_s, step_bandwidth, 2.0, xp)


def all_gather_time(bytes_total, members, step_latency_s, step_bandwidth, xp=jnp):
    """Ring all-gather assembling a ``bytes_total`` tensor: ``t - 1`` steps of ``bytes / t``."""
    return ring_collective_time(bytes_total, members, step_latency_s, step_bandwidth, 1.0, xp)


def send_recv_time(bytes_, latency_s, bandwidth):
    """One point-to-point transfer: route latency plus bytes over the route's effective bandwidth."""
    return latency_s + bytes_ / bandwidth
