"""The cost model: the specs as traced numbers (:mod:`.params`), the per-chunk, per-stage
formulas (:mod:`.stage`) that every simulator in the package evaluates, the token-dependent
GEMM efficiency (:mod:`.efficiency`) and the tensor-parallel shares and collectives
(:mod:`.tensor_parallel`)."""

from . import efficiency, tensor_parallel
from .params import HardwareParams, ModelParams, StageLayout, pytree
from .stage import (attention_time, dense_layer_time, embedding_time, experts_touched, gemm_time, handoff_time,
                    item_activation_bytes, lm_head_time, moe_layer_time, roofline, stage_attention_times,
                    stage_kv_bytes_per_token, stage_layer_counts, stage_times, stage_weight_bytes)

__all__ = [
    "HardwareParams", "ModelParams", "StageLayout", "pytree", "attention_time", "dense_layer_time",
    "efficiency", "embedding_time", "experts_touched", "gemm_time", "handoff_time", "item_activation_bytes",
    "lm_head_time", "moe_layer_time", "roofline", "stage_attention_times", "stage_kv_bytes_per_token",
    "stage_layer_counts", "stage_times", "stage_weight_bytes", "tensor_parallel",
]
