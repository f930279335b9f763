"""Model specifications: a decoder-only transformer and its derived per-layer quantities.

:class:`ModelSpec` describes GQA or MLA attention and a dense or MoE SwiGLU MLP; the presets
are public model configs, and parameter counts computed from the fields land within 1% of the
published totals (tested).  Units: parameters, elements, bytes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from . import checks
from .checks import SpecError


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer.

    Attributes:
      name: preset or user name.
      layers: number of transformer blocks.
      hidden: model width d.
      ffn: intermediate size of the dense MLP, or of one expert for MoE layers.
      q_heads, kv_heads, head_dim: GQA attention shape (q projection width is
        ``q_heads * head_dim``, which may differ from ``hidden``).
      vocab: vocabulary size (embedding and LM head).
      experts: routed experts per MoE layer (0 = dense model).
      experts_active: routed experts used per token (top-k).
      shared_experts: always-on experts per MoE layer (of size ``ffn``).
      dense_layers: for MoE models, the number of leading layers that are dense
        (DeepSeek-V3 style); their MLP width is ``dense_ffn``.
      dense_ffn: MLP width of those leading dense layers (defaults to ``ffn``).
      tied_embeddings: LM head shares the embedding matrix.
      attention: ``"gqa"`` or ``"mla"`` (multi-head latent attention).
      q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim:
        MLA shape (DeepSeek-V2/V3); ignored for GQA.
      published_params, published_active_params: the totals the authors quote
        (parameters), used by tests and ``mocap-jax models``.
    """

    name: str
    layers: int
    hidden: int
    ffn: int
    q_heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    experts: int = 0
    experts_active: int = 0
    shared_experts: int = 0
    dense_layers: int = 0
    dense_ffn: int = 0
    tied_embeddings: bool = False
    attention: str = "gqa"
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    published_params: float | None = None
    published_active_params: float | None = None

    def __post_init__(self):
        where = f"model {self.name!r}"
        if not isinstance(self.name, str) or not self.name:
            raise SpecError(f"model name must be a non-empty string, got {self.name!r}")
        dim = checks.LIMITS["model_dim"]
        checks.integer(f"{where}: layers", self.layers, 1, checks.LIMITS["layers"])
        for f in ("hidden", "ffn", "q_heads", "kv_heads", "head_dim", "vocab"):
            checks.integer(f"{where}: {f}", getattr(self, f), 1, dim)
        for f in ("experts", "experts_active", "shared_experts", "dense_layers", "dense_ffn", "q_lora_rank",
                  "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            checks.integer(f"{where}: {f}", getattr(self, f), 0, dim)
        checks.flag(f"{where}: tied_embeddings", self.tied_embeddings)
        checks.choice(f"{where}: attention", self.attention, ("gqa", "mla"))
        for f in ("published_params", "published_active_params"):
            if getattr(self, f) is not None:
                checks.positive(f"{where}: {f}", getattr(self, f), 1e15)
        if self.attention == "gqa" and self.q_heads % self.kv_heads:
            raise SpecError(f"{where}: q_heads ({self.q_heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.attention == "mla" and min(self.kv_lora_rank, self.qk_nope_head_dim, self.qk_rope_head_dim,
                                           self.v_head_dim) <= 0:
            raise SpecError(f"{where}: MLA needs positive kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim")
        if self.experts_active > self.experts:
            raise SpecError(f"{where}: need experts_active <= experts, got {self.experts_active} of {self.experts}")
        if self.experts and not self.experts_active:
            raise SpecError(f"{where}: an MoE model needs experts_active >= 1")
        if self.dense_layers > self.layers:
            raise SpecError(f"{where}: dense_layers ({self.dense_layers}) must not exceed layers ({self.layers})")

    # ---- derived: attention
    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def qk_head_dim(self) -> int:
        """Per-head width of q.k products."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.attention == "mla" else self.head_dim

    @property
    def v_dim(self) -> int:
        """Per-head width of the value vectors."""
        return self.v_head_dim if self.attention == "mla" else self.head_dim

    @property
    def kv_elements_per_token_layer(self) -> int:
        """Cached elements per token per layer: 2*kv_heads*head_dim (GQA) or kv_lora_rank + rope dim (MLA)."""
        if self.attention == "mla":
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.kv_heads * self.head_dim

    def kv_bytes_per_token_layer(self, bytes_per_element: float = 2) -> float:
        """KV-cache bytes one token adds to one layer."""
        return self.kv_elements_per_token_layer * bytes_per_element

    @property
    def attention_params(self) -> int:
        """Parameters of one attention block (projections; norms are counted in ``norm_params``)."""
        d, h = self.hidden, self.q_heads
        if self.attention == "mla":
            qk = self.qk_head_dim
            if self.q_lora_rank:
                q = d * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * h * qk
            else:
                q = d * h * qk
            kv = d * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
            kv += self.kv_lora_rank * h * (self.qk_nope_head_dim + self.v_head_dim)
            o = h * self.v_head_dim * d
            return q + kv + o
        qo = 2 * d * h * self.head_dim
        kv = 2 * d * self.kv_heads * self.head_dim
        return qo + kv

    @property
    def attention_flops_per_pair(self) -> int:
        """FLOPs of one (query token, key token) pair in one layer: 2*q_heads*(qk + v)."""
        return 2 * self.q_heads * (self.qk_head_dim + self.v_dim)

    @property
    def attention_buffer_elements(self) -> int:
        """Activation elements per token an attention block holds while it runs over a chunk:
        the residual stream (hidden), the queries and the attention output (q_heads x head widths)."""
        return self.hidden + self.q_heads * (self.qk_head_dim + self.v_dim)

    def mlp_buffer_elements(self, moe: bool) -> int:
        """Activation elements per token of an MLP block's intermediates: gate and up projections of
        every expert the token uses (2 x width each), the output (hidden), and router logits (MoE)."""
        if moe:
            return 2 * (self.experts_active + self.shared_experts) * self.ffn + self.hidden + self.experts
        return 2 * (self.dense_ffn or self.ffn) + self.hidden

    # ---- derived: MLP
    @property
    def expert_params(self) -> int:
        """Parameters of one SwiGLU expert (or of the dense MLP of a dense model)."""
        return 3 * self.hidden * self.ffn

    @property
    def dense_mlp_params(self) -> int:
        width = self.dense_ffn or self.ffn
        return 3 * self.hidden * width

    @property
    def router_params(self) -> int:
        return self.hidden * self.experts if self.is_moe else 0

    @property
    def norm_params(self) -> int:
        extra = 2 * self.head_dim if (self.is_moe and self.attention == "gqa" and self.q_heads * self.head_dim != self.hidden) else 0
        return 2 * self.hidden + extra

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.is_moe else 0

    @property
    def n_dense_layers(self) -> int:
        return self.layers - self.moe_layers

    @property
    def dense_layer_params(self) -> int:
        """Parameters (= active parameters) of one dense transformer block."""
        return self.attention_params + self.dense_mlp_params + self.norm_params

    @property
    def moe_layer_params(self) -> int:
        """Parameters of one MoE transformer block (all experts)."""
        if not self.is_moe:
            return 0
        mlp = (self.experts + self.shared_experts) * self.expert_params + self.router_params
        return self.attention_params + mlp + self.norm_params

    @property
    def moe_layer_active_params(self) -> int:
        """Parameters one token touches in an MoE block (top-k + shared experts)."""
        if not self.is_moe:
            return 0
        mlp = (self.experts_active + self.shared_experts) * self.expert_params + self.router_params
        return self.attention_params + mlp + self.norm_params

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def lm_head_params(self) -> int:
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    @property
    def total_params(self) -> int:
        return (self.n_dense_layers * self.dense_layer_params + self.moe_layers * self.moe_layer_params
                + self.embedding_params + self.lm_head_params + self.hidden)

    @property
    def active_params(self) -> int:
        return (self.n_dense_layers * self.dense_layer_params + self.moe_layers * self.moe_layer_active_params
                + self.embedding_params + self.lm_head_params + self.hidden)

    def layer_gemm_flops_per_token(self, moe: bool) -> int:
        """GEMM FLOPs one token spends in one block: 2 x active parameters of the block."""
        return 2 * (self.moe_layer_active_params if moe else self.dense_layer_params)

    def summary(self, bytes_per_param: float = 2) -> dict[str, Any]:
        return {
            "name": self.name,
            "layers": self.layers,
            "attention": self.attention,
            "params_b": self.total_params / 1e9,
            "active_params_b": self.active_params / 1e9,
            "published_params_b": None if self.published_params is None else self.published_params / 1e9,
            "weight_gb": self.total_params * bytes_per_param / 1e9,
            "kv_bytes_per_token_layer": self.kv_bytes_per_token_layer(bytes_per_param),
            "kv_bytes_per_token": self.kv_bytes_per_token_layer(bytes_per_param) * self.layers,
        }

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


MODEL_PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        ModelSpec("llama3.1-8b", 32, 4096, 14336, 32, 8, 128, 128256, published_params=8.03e9),
        ModelSpec("llama3-70b", 80, 8192, 28672, 64, 8, 128, 128256, published_params=70.6e9),
        ModelSpec("mistral-large-123b", 88, 12288, 28672, 96, 8, 128, 32768, published_params=122.6e9),
        ModelSpec("qwen3-235b-a22b", 94, 4096, 1536, 64, 4, 128, 151936, experts=128, experts_active=8,
                  published_params=235.1e9, published_active_params=22.2e9),
        ModelSpec("llama3.1-405b", 126, 16384, 53248, 128, 8, 128, 128256, published_params=405.9e9),
        ModelSpec("qwen3-30b-a3b", 48, 2048, 768, 32, 4, 128, 151936, experts=128, experts_active=8,
                  tied_embeddings=False, published_params=30.5e9, published_active_params=3.3e9),
        ModelSpec("mixtral-8x22b", 56, 6144, 16384, 48, 8, 128, 32768, experts=8, experts_active=2,
                  published_params=140.6e9, published_active_params=39.1e9),
        # MLA example (DeepSeek-V3): 576 cached elements per token per layer.
        ModelSpec("deepseek-v3", 61, 7168, 2048, 128, 128, 128, 129280, experts=256, experts_active=8,
                  shared_experts=1, dense_layers=3, dense_ffn=18432, attention="mla", q_lora_rank=1536,
                  kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                  published_params=671e9, published_active_params=37e9),
        # WSC-LLM's small model class.
        ModelSpec("llama2-7b", 32, 4096, 11008, 32, 32, 128, 32000, published_params=6.74e9),
        # Llama-2-70B (GQA, 32k vocabulary): the model of published TensorRT-LLM / LMDeploy measurements.
        ModelSpec("llama2-70b", 80, 8192, 28672, 64, 8, 128, 32000, published_params=69.0e9),
    ]
}

MODEL_ALIASES = {
    "llama-3-70b": "llama3-70b", "llama3.1-70b": "llama3-70b", "mistral-large": "mistral-large-123b",
    "mistral-large-2407": "mistral-large-123b", "qwen3-235b": "qwen3-235b-a22b", "llama3-405b": "llama3.1-405b",
    "llama-3.1-405b": "llama3.1-405b", "llama3-8b": "llama3.1-8b", "qwen3-30b": "qwen3-30b-a3b",
}

STUDY_MODELS = ("llama3-70b", "mistral-large-123b", "qwen3-235b-a22b", "llama3.1-405b")
