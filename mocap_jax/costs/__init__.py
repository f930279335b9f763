"""The cost model: the specs as traced numbers (:mod:`.params`) and the per-chunk, per-stage
formulas (:mod:`.stage`) that every simulator in the package evaluates."""

from .params import HardwareParams, ModelParams, StageLayout, pytree
from .stage import (attention_time, dense_layer_time, embedding_time, experts_touched, handoff_time,
                    item_activation_bytes, lm_head_time, moe_layer_time, roofline, stage_attention_times,
                    stage_kv_bytes_per_token, stage_layer_counts, stage_times, stage_weight_bytes)

__all__ = [
    "HardwareParams", "ModelParams", "StageLayout", "pytree", "attention_time", "dense_layer_time",
    "embedding_time", "experts_touched", "handoff_time", "item_activation_bytes", "lm_head_time", "moe_layer_time",
    "roofline", "stage_attention_times", "stage_kv_bytes_per_token", "stage_layer_counts", "stage_times",
    "stage_weight_bytes",
]
