"""Tensor-parallel instance plans: how a TP strategy splits a model over an instance's dies.

An *instance* is a rectangle of ``rows x cols`` dies running tensor parallelism (TP) over all
of its ``t = rows * cols`` dies.  :func:`tp_plan` computes once on the host, from the integer
model shape, the per-die shares and the collective profile of an instance and stores them as a
:class:`TPPlan` pytree of numbers, so that plans of different shapes and strategies stack into
one batch (:func:`stack_plans`) for the timing functions of :mod:`mocap_jax.wsc.perf`.

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

Units: parameters and elements per die per transformer block unless noted.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..costs import ModelParams, pytree, tensor_parallel
from ..specs import HardwareSpec, ModelSpec, SpecError
from ..specs import mesh as _mesh
from .hardware import WaferSpec

Array = Any

STRATEGIES = ("megatron", "gqa-hybrid")


@pytree
class TPPlan:
    """Per-die shares of one tensor-parallel instance (scalars; ``[N]`` when stacked).

    Parameter counts are per die and per transformer block unless noted; element
    counts are per token.
    """

    dies: Array                    # [] t, dies in the instance
    attn_params: Array             # [] attention projection parameters per die per block
    mlp_params: Array              # [] dense-MLP parameters per die per block
    expert_params: Array           # [] parameters of one routed expert per die
    moe_static_params: Array       # [] MoE-block parameters every token touches per die
    moe_held_params: Array         # [] all parameters of one MoE block per die
    replicated_params: Array       # [] norm (and router) parameters every die keeps whole
    vocab_params: Array            # [] embedding + LM head parameters per die (whole model)
    lm_head_params: Array          # [] LM head parameters per die
    attn_pair_flops: Array         # [] attention FLOPs per (query, key) pair per block per die
    kv_elems: Array                # [] KV elements per token per block per die
    kv_read_amplification: Array   # [] KV elements the instance reads per token / the model's
    allreduce_elems: Array         # [] elements per token per block all-reduced over all dies
    ring_hops: Array               # [] hops of the longest all-die ring step
    ring_load: Array               # [] most all-die ring steps sharing one directed link
    ring_internode: Array          # [] 1 when a ring step leaves a node (cluster), else 0
    group_size: Array              # [] s, dies per attention group (1 for megatron)
    group_allgather_elems: Array   # [] elements per token per block all-gathered in a group
    group_allreduce_elems: Array   # [] elements per token per block all-reduced in a group
    group_hops: Array              # [] hops of the longest group ring step
    group_load: Array              # [] most group ring steps (all groups at once) sharing a link
    group_internode: Array         # [] 1 when a group ring step leaves a node, else 0
    perimeter_links: Array         # [] directed links entering the rectangle, 2 (rows + cols)


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


def _ring_profile(is_mesh: bool, rows: int, cols: int, rings: list[list[tuple[int, int]]]):
    """(max hops, max link load, crosses nodes) of concurrent rings inside a rows x cols instance."""
    rings = [r for r in rings if len(r) > 1]
    if not rings:
        return 0, 0, 0
    if not is_mesh:
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


def instance_rings(model: ModelSpec, config: InstanceConfig) -> tuple[list[tuple[int, int]], list[list[tuple[int, int]]]]:
    """Cells (row, col inside the instance) of its all-die ring and of its attention-group rings.

    The all-die ring carries the Megatron all-reduces; ``gqa-hybrid`` adds one ring per
    attention group of ``s = t / gcd(t, kv_heads)`` consecutive ring members (``megatron``:
    single-cell groups, no group collectives).
    """
    order = _mesh.ring_order(config.rows, config.cols)
    if config.strategy == "megatron":
        return order, [[cell] for cell in order]
    kv_heads = 1 if model.attention == "mla" else model.kv_heads
    g = math.gcd(config.dies, kv_heads)
    s = config.dies // g
    return order, [order[i * s:(i + 1) * s] for i in range(g)]


def tp_plan(model: ModelSpec, wafer: WaferSpec, config: InstanceConfig, dtype=jnp.float32) -> TPPlan:
    """Per-die shares and collective profile of ``config`` for ``model`` on ``wafer``.

    The plan depends on the wafer only through its topology (mesh or cluster), so plans are
    computed once per (model, topology, instance, dtype) and shared by every hardware point.

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
    return _plan(model, wafer.is_mesh, config, np.dtype(dtype).name)


@functools.lru_cache(maxsize=4096)
def _plan(m: ModelSpec, is_mesh: bool, config: InstanceConfig, dtype: str) -> TPPlan:
    rows, cols = config.rows, config.cols
    t = rows * cols
    d, hd = m.hidden, m.head_dim
    mla = m.attention == "mla"
    kv_heads = 1 if mla else m.kv_heads
    ceil = lambda a, b: -(-a // b)

    share = lambda width: int(tensor_parallel.column_share(width, t, np))
    ffn_dense = m.dense_ffn or m.ffn
    mlp = 3 * d * share(ffn_dense)
    expert = 3 * d * share(m.ffn) if m.is_moe else 0
    vocab_rows = share(m.vocab)
    vocab = vocab_rows * d * (1 if m.tied_embeddings else 2)
    lm_head = vocab_rows * d
    norms = m.norm_params
    router = m.router_params
    pair_full = m.attention_flops_per_pair  # 2 * q_heads * (qk + v)
    kv_full = m.kv_elements_per_token_layer

    order, groups = instance_rings(m, config)
    if config.strategy == "megatron":
        qh = int(tensor_parallel.q_heads_share(m.q_heads, t, np))
        if mla:
            attn = share(m.attention_params)
            kv = kv_full  # the latent is shared by all heads: every die keeps it whole
        else:
            kvh = int(tensor_parallel.kv_heads_share(m.q_heads, m.kv_heads, t, np))
            attn = d * hd * (2 * qh + 2 * kvh)
            kv = 2 * kvh * hd
        pair = pair_full * qh / m.q_heads
        s = 1
        gather = reduce = 0.0
    else:  # gqa-hybrid
        g = len(groups)
        s = t // g
        qg, kvg = m.q_heads // g, kv_heads // g
        if mla:
            attn = share(m.attention_params)
            kv = kv_full / s
        else:
            attn = d * (2 * ceil(qg * hd, s) + 2 * ceil(kvg * hd, s))
            kv = 2 * kvg * hd / s
        pair = pair_full / t
        gather = (m.q_heads + 2 * kv_heads) / g * (m.qk_head_dim if mla else hd) if s > 1 else 0.0
        reduce = m.q_heads / g * (m.v_dim + 2) if s > 1 else 0.0
    ring_h, ring_l, ring_x = _ring_profile(is_mesh, rows, cols, [order])
    grp_h, grp_l, grp_x = _ring_profile(is_mesh, rows, cols, groups)

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




__all__ = ["STRATEGIES", "TPPlan", "InstanceConfig", "instance_rings", "tp_plan", "stack_plans",
           "model_params"]
