"""The specs as pytrees of traced numbers: what the array programs see of a model, a die and a placement.

:class:`ModelParams`, :class:`HardwareParams` and :class:`StageLayout` are frozen dataclasses
whose every field is a traced leaf, so a sweep can ``vmap`` over any of them; they are built
on the host from :class:`~mocap_jax.specs.ModelSpec`, :class:`~mocap_jax.specs.HardwareSpec`
and a stage-to-die map.  Units: bytes, seconds, FLOPs, FLOP/s, bytes/s.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..specs import HardwareSpec, ModelSpec
from ..specs.mesh import group_rings, group_routes, handoff_routes, shared_handoff_bandwidth, snake_placement

Array = Any

def pytree(cls):
    """Frozen dataclass registered as a pytree whose fields are all traced leaves."""
    cls = dataclass(frozen=True)(cls)
    return jax.tree_util.register_dataclass(cls, data_fields=[f.name for f in dataclasses.fields(cls)], meta_fields=[])


@pytree
class ModelParams:
    """Numbers of a :class:`ModelSpec` the cost model needs (all scalars, traced)."""

    layers: Array                 # int, transformer blocks
    dense_layers: Array           # int, leading dense blocks (== layers for dense models)
    hidden: Array                 # model width
    dense_layer_params: Array     # parameters of one dense block
    moe_layer_params: Array       # parameters of one MoE block (all experts)
    moe_static_params: Array      # MoE block params every token touches (attention, router, shared experts)
    moe_active_params: Array      # MoE block params one token touches (static + top-k experts)
    expert_params: Array          # parameters of one routed expert
    experts: Array                # routed experts per MoE block
    experts_active: Array         # top-k
    attention_flops_per_pair: Array  # FLOPs per (query, key) pair per block
    kv_elements_per_token_layer: Array
    embedding_params: Array
    lm_head_params: Array
    vocab: Array
    attention_buffer_elements: Array  # activation elements per token of an attention block over a chunk
    dense_mlp_buffer_elements: Array  # activation elements per token of a dense MLP block's intermediates
    moe_mlp_buffer_elements: Array    # the same for an MoE block (0 for dense models)
    q_heads: Array                # query heads per block
    kv_heads: Array               # KV heads per block (1 for a latent, MLA, cache shared by all heads)
    head_dim: Array               # width of one head
    attention_params: Array       # attention projection parameters of one block
    dense_mlp_width: Array        # FFN width of a dense block's MLP
    expert_width: Array           # FFN width of one routed expert (0 for dense models)
    norm_params: Array            # norm parameters of one block (replicated under tensor parallelism)
    router_params: Array          # router parameters of one MoE block (replicated)
    shared_experts: Array         # always-on experts per MoE block
    latent_attention: Array       # 1 for MLA attention, else 0

    @staticmethod
    def from_spec(m: ModelSpec, dtype=jnp.float32) -> "ModelParams":
        f = lambda v: np.asarray(v, dtype=dtype)
        return ModelParams(
            layers=np.asarray(m.layers, np.int32),
            dense_layers=np.asarray(m.n_dense_layers, np.int32),
            hidden=f(m.hidden),
            dense_layer_params=f(m.dense_layer_params),
            moe_layer_params=f(m.moe_layer_params),
            moe_static_params=f(m.moe_layer_active_params - m.experts_active * m.expert_params if m.is_moe else 0),
            moe_active_params=f(m.moe_layer_active_params),
            expert_params=f(m.expert_params if m.is_moe else 0),
            experts=f(m.experts),
            experts_active=f(m.experts_active),
            attention_flops_per_pair=f(m.attention_flops_per_pair),
            kv_elements_per_token_layer=f(m.kv_elements_per_token_layer),
            embedding_params=f(m.embedding_params),
            lm_head_params=f(m.lm_head_params if not m.tied_embeddings else 0),
            vocab=f(m.vocab),
            attention_buffer_elements=f(m.attention_buffer_elements),
            dense_mlp_buffer_elements=f(m.mlp_buffer_elements(False)),
            moe_mlp_buffer_elements=f(m.mlp_buffer_elements(True) if m.is_moe else 0),
            q_heads=f(m.q_heads),
            kv_heads=f(1 if m.attention == "mla" else m.kv_heads),
            head_dim=f(m.head_dim),
            attention_params=f(m.attention_params),
            dense_mlp_width=f(m.dense_ffn or m.ffn),
            expert_width=f(m.ffn if m.is_moe else 0),
            norm_params=f(m.norm_params),
            router_params=f(m.router_params),
            shared_experts=f(m.shared_experts),
            latent_attention=f(m.attention == "mla"),
        )


@pytree
class HardwareParams:
    """Per-die numbers of a :class:`HardwareSpec` (all scalars, traced)."""

    peak_flops: Array
    hbm_capacity: Array
    hbm_bandwidth: Array
    link_latency_s: Array
    eff_gemm: Array
    eff_attention: Array
    eff_hbm: Array
    eff_link: Array
    usable_hbm_fraction: Array
    weight_bytes: Array
    kv_bytes: Array
    activation_bytes: Array
    mlp_token_tile: Array            # tokens per MLP / LM-head tile (0: untiled)
    activation_buffer_scale: Array   # multiplier on the activation buffers
    layer_overhead_s: Array
    gemm_fixed_s: Array

    @staticmethod
    def from_spec(h: HardwareSpec, dtype=jnp.float32) -> "HardwareParams":
        names = [f.name for f in dataclasses.fields(HardwareParams)]
        return HardwareParams(**{n: np.asarray(getattr(h, n), dtype=dtype) for n in names})

    @property
    def usable_hbm(self):
        return self.hbm_capacity * self.usable_hbm_fraction


@pytree
class StageLayout:
    """Where stages sit and how their hand-offs travel, padded to ``N_pad`` stages.

    A stage runs on a group of ``t`` dies (tensor parallelism, :mod:`.tensor_parallel`);
    single-die stages have ``t = 1``.

    Fields:
      num_stages: int scalar N (<= N_pad).
      handoff_hops: [N_pad] hops of the route s -> s+1 (the longest rank route; 0 for s >= N-1).
      handoff_bandwidth: [N_pad] effective raw bandwidth of that hand-off, bytes/s: the
        bottleneck link's share, summed over the ``t`` rank routes that carry it at once
        (1 where unused, never 0 or inf, to keep gradients and divisions finite).
      tensor_parallel: scalar, dies per stage group t (every group of a layout has the same size).
      group_hops: [N_pad] longest step of the group's collective ring, hops (0 for t = 1).
      group_bandwidth: [N_pad] effective raw bandwidth of the ring's slowest step, bytes/s
        (1 for t = 1).
    """

    num_stages: Array
    handoff_hops: Array
    handoff_bandwidth: Array
    tensor_parallel: Array
    group_hops: Array
    group_bandwidth: Array

    @staticmethod
    def single_die(num_stages, handoff_hops, handoff_bandwidth) -> "StageLayout":
        """A layout of one-die stages from its hand-off routes (``[..., N_pad]`` arrays)."""
        hops = np.asarray(handoff_hops)
        return StageLayout(num_stages=num_stages, handoff_hops=hops, handoff_bandwidth=handoff_bandwidth,
                           tensor_parallel=np.ones_like(hops[..., 0]), group_hops=np.zeros_like(hops),
                           group_bandwidth=np.ones_like(hops))

    @staticmethod
    def from_groups(hw: HardwareSpec, groups, n_pad: int | None = None, dtype=jnp.float32) -> "StageLayout":
        """Layout of stage groups ``[N, t]`` (die indices, each row in ring order).

        Hand-offs share links with each other (a full pipeline runs them concurrently);
        each group's ring shares links only with the other rings.
        """
        groups = np.asarray(groups)
        if groups.ndim == 1:
            groups = groups[:, None]
        n, t = groups.shape
        n_pad = n if n_pad is None else n_pad
        if n_pad < n:
            raise ValueError(f"stage bucket {n_pad} is smaller than {n} stages")
        hops, bw = group_routes(hw, groups)
        ring_hops, ring_bw = group_rings(hw, groups)
        vec = lambda fill: np.full(n_pad, fill, np.float64)
        hh, hb, gh, gb = vec(0.0), vec(1.0), vec(0.0), vec(1.0)
        s = np.arange(n - 1)
        hh[: n - 1], hb[: n - 1] = hops[s, s + 1], bw[s, s + 1]
        gh[:n], gb[:n] = ring_hops, ring_bw
        cast = lambda v: np.asarray(v).astype(dtype)
        return StageLayout(num_stages=np.asarray(n, np.int32), handoff_hops=cast(hh), handoff_bandwidth=cast(hb),
                           tensor_parallel=cast(t), group_hops=cast(gh), group_bandwidth=cast(gb))

    @staticmethod
    def from_placement(hw: HardwareSpec, placement, n_pad: int | None = None, dtype=jnp.float32) -> "StageLayout":
        """Layout of one-die stages at die ``placement[s]``; hand-offs share links with each other."""
        placement = np.asarray(placement)
        n = len(placement)
        n_pad = n if n_pad is None else n_pad
        if n_pad < n:
            raise ValueError(f"stage bucket {n_pad} is smaller than {n} stages")
        hops, _ = handoff_routes(hw, placement)
        hops_p = np.zeros(n_pad)
        hops_p[: n - 1] = hops[: n - 1]
        return StageLayout.single_die(np.asarray(n, np.int32), hops_p.astype(dtype),
                                      shared_handoff_bandwidth(hw, placement, n_pad, dtype))

    @staticmethod
    def snake(hw: HardwareSpec, num_stages: int | None = None, n_pad: int | None = None, dtype=jnp.float32):
        return StageLayout.from_placement(hw, snake_placement(hw, num_stages), n_pad, dtype)
