"""Model and hardware specifications (DESIGN §2, §3).

Two frozen dataclasses describe *what* is simulated:

* :class:`ModelSpec` -- a decoder-only transformer (GQA or MLA attention, dense or
  MoE SwiGLU MLP), with derived per-layer quantities (parameters, FLOPs, KV bytes).
* :class:`HardwareSpec` -- a mesh of identical dies (a wafer, several wafers joined
  edge to edge, or a GPU node behind a switch), with per-die peak FLOP/s, HBM and
  link numbers and the efficiency parameters of the roofline cost model.

Both are plain Python (hashable, JSON/TOML round-trippable).  The array programs
never see them directly: :mod:`mocap_jax.params` turns them into pytrees of
traced numbers so that sweeps can ``vmap`` over any numeric field.

Units: bytes, seconds, FLOPs, FLOP/s and bytes/s throughout.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping


class SpecError(ValueError):
    """Bad user input for a spec, preset name or spec file (a ``ValueError``)."""


# --------------------------------------------------------------------------- models


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
        for f in ("layers", "hidden", "ffn", "q_heads", "kv_heads", "head_dim", "vocab"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise SpecError(f"model {self.name!r}: {f} must be a positive integer, got {v!r}")
        if self.attention not in ("gqa", "mla"):
            raise SpecError(f"model {self.name!r}: attention must be 'gqa' or 'mla', got {self.attention!r}")
        if self.attention == "gqa" and self.q_heads % self.kv_heads:
            raise SpecError(f"model {self.name!r}: q_heads ({self.q_heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.attention == "mla" and min(self.kv_lora_rank, self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim) <= 0:
            raise SpecError(f"model {self.name!r}: MLA needs positive kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim")
        if self.experts < 0 or self.experts_active < 0 or self.experts_active > self.experts:
            raise SpecError(f"model {self.name!r}: need 0 <= experts_active <= experts, got {self.experts_active} of {self.experts}")
        if self.experts and not self.experts_active:
            raise SpecError(f"model {self.name!r}: an MoE model needs experts_active >= 1")
        if not 0 <= self.dense_layers <= self.layers:
            raise SpecError(f"model {self.name!r}: dense_layers must be in [0, layers]")

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
    ]
}

MODEL_ALIASES = {
    "llama-3-70b": "llama3-70b", "llama3.1-70b": "llama3-70b", "mistral-large": "mistral-large-123b",
    "mistral-large-2407": "mistral-large-123b", "qwen3-235b": "qwen3-235b-a22b", "llama3-405b": "llama3.1-405b",
    "llama-3.1-405b": "llama3.1-405b", "llama3-8b": "llama3.1-8b", "qwen3-30b": "qwen3-30b-a3b",
}

STUDY_MODELS = ("llama3-70b", "mistral-large-123b", "qwen3-235b-a22b", "llama3.1-405b")


# --------------------------------------------------------------------------- hardware


@dataclass(frozen=True)
class HardwareSpec:
    """A mesh of identical dies (one or more wafers) or a GPU node.

    Dies form a ``rows x (cols * wafers)`` grid; wafers sit side by side along the
    column axis and the links that cross a wafer boundary have
    ``cross_wafer_bandwidth``.  ``topology="switch"`` models a GPU node where every
    pair of devices is one hop apart over the switch (NVLink).

    Attributes (per die / device):
      peak_flops: dense peak FLOP/s at the simulated precision.
      hbm_capacity: bytes of HBM.
      hbm_bandwidth: HBM bytes/s.
      link_bandwidth: bytes/s per direction per neighbour link (D2D or NVLink).
      cross_wafer_bandwidth: bytes/s per direction of a link crossing wafers.
      link_latency_s: seconds per hop.
      eff_gemm, eff_attention, eff_hbm, eff_link: achieved / peak.
      usable_hbm_fraction: share of HBM the runtime may fill.
      weight_bytes, kv_bytes, activation_bytes: storage precision per element.
      activation_workspace_factor: activation buffers of an in-flight item, in
        units of ``tokens x hidden x activation_bytes``.
      layer_overhead_s: fixed seconds per transformer block per item (kernel
        launches, synchronisation); 0 by default, fitted by ``mocap-jax calibrate``.
    """

    name: str
    rows: int = 4
    cols: int = 4
    wafers: int = 1
    topology: str = "mesh"
    peak_flops: float = 4.5e15
    hbm_capacity: float = 180e9
    hbm_bandwidth: float = 7.7e12
    link_bandwidth: float = 5e12
    cross_wafer_bandwidth: float = 5e12
    link_latency_s: float = 100e-9
    eff_gemm: float = 0.78
    eff_attention: float = 0.71
    eff_hbm: float = 0.85
    eff_link: float = 0.85
    usable_hbm_fraction: float = 0.9
    weight_bytes: float = 2.0
    kv_bytes: float = 2.0
    activation_bytes: float = 2.0
    activation_workspace_factor: float = 8.0
    layer_overhead_s: float = 0.0
    description: str = ""

    def __post_init__(self):
        for f in ("rows", "cols", "wafers"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise SpecError(f"hardware {self.name!r}: {f} must be a positive integer, got {v!r}")
        if self.topology not in ("mesh", "switch"):
            raise SpecError(f"hardware {self.name!r}: topology must be 'mesh' or 'switch', got {self.topology!r}")
        for f in ("peak_flops", "hbm_capacity", "hbm_bandwidth", "link_bandwidth", "cross_wafer_bandwidth",
                  "weight_bytes", "kv_bytes", "activation_bytes"):
            v = getattr(self, f)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0 or not math.isfinite(v):
                raise SpecError(f"hardware {self.name!r}: {f} must be a positive number, got {v!r}")
        for f in ("eff_gemm", "eff_attention", "eff_hbm", "eff_link", "usable_hbm_fraction"):
            v = getattr(self, f)
            if not isinstance(v, (int, float)) or not 0 < v <= 1:
                raise SpecError(f"hardware {self.name!r}: {f} must be in (0, 1], got {v!r}")
        if self.link_latency_s < 0 or self.activation_workspace_factor < 0 or self.layer_overhead_s < 0:
            raise SpecError(f"hardware {self.name!r}: link_latency_s, activation_workspace_factor and "
                            f"layer_overhead_s must be >= 0")

    @property
    def grid_cols(self) -> int:
        return self.cols * self.wafers

    @property
    def num_dies(self) -> int:
        return self.rows * self.grid_cols

    @property
    def total_flops(self) -> float:
        return self.num_dies * self.peak_flops

    @property
    def total_hbm(self) -> float:
        return self.num_dies * self.hbm_capacity

    def replace(self, **changes) -> "HardwareSpec":
        return dataclasses.replace(self, **changes)

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "topology": self.topology,
            "grid": f"{self.rows}x{self.grid_cols}" + (f" ({self.wafers} wafers)" if self.wafers > 1 else ""),
            "dies": self.num_dies,
            "pflops_total": self.total_flops / 1e15,
            "hbm_tb_total": self.total_hbm / 1e12,
            "hbm_gb_per_die": self.hbm_capacity / 1e9,
            "hbm_tbps_per_die": self.hbm_bandwidth / 1e12,
            "link_tbps": self.link_bandwidth / 1e12,
            "description": self.description,
        }

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def mocap_wafer(rows: int = 4, cols: int = 4, wafers: int = 1, **changes) -> HardwareSpec:
    """The MOCAP Blackwell-class die (DESIGN §2) on a ``rows x cols`` mesh, ``wafers`` side by side."""
    name = f"mocap-{rows}x{cols}" + (f"x{wafers}w" if wafers > 1 else "")
    return HardwareSpec(name=changes.pop("name", name), rows=rows, cols=cols, wafers=wafers,
                        description=changes.pop("description", "Blackwell-class dies, 4.5 PFLOP/s FP8, 180 GB HBM, 5 TB/s D2D"),
                        **changes)


def gpu_node(kind: str, gpus: int = 8) -> HardwareSpec:
    """A node of ``gpus`` GPUs behind an NVLink switch (every pair one hop)."""
    table = {
        # peak dense, HBM bytes, HBM B/s, NVLink B/s per direction, GEMM eff, attention eff
        "b200": (2.25e15, 180e9, 7.7e12, 900e9, 0.78, 0.71, "B200 BF16 dense, NVLink 5"),
        "h100": (0.989e15, 80e9, 3.35e12, 450e9, 0.80, 0.75, "H100 SXM BF16 dense, NVLink 4"),
        "a100": (312e12, 80e9, 2.039e12, 300e9, 0.80, 0.70, "A100 SXM 80GB BF16 dense, NVLink 3"),
    }
    peak, cap, bw, link, eg, ea, desc = table[kind]
    return HardwareSpec(name=f"{kind}-x{gpus}", rows=1, cols=gpus, topology="switch", peak_flops=peak,
                        hbm_capacity=cap, hbm_bandwidth=bw, link_bandwidth=link, cross_wafer_bandwidth=link,
                        link_latency_s=1e-6, eff_gemm=eg, eff_attention=ea, eff_link=0.85, description=desc)


HARDWARE_PRESETS: dict[str, HardwareSpec] = {
    h.name: h
    for h in [
        mocap_wafer(4, 4),
        mocap_wafer(2, 2),
        mocap_wafer(2, 4),
        mocap_wafer(6, 6),
        mocap_wafer(8, 8),
        mocap_wafer(4, 4, wafers=2),
        gpu_node("b200"),
        gpu_node("h100"),
        gpu_node("a100"),
    ]
}


# --------------------------------------------------------------------------- lookup & files


def _suggest(name: str, choices) -> str:
    close = difflib.get_close_matches(name.lower(), list(choices), n=3, cutoff=0.4)
    return f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""


def _load_file(path: Path) -> Mapping[str, Any]:
    try:
        text = path.read_bytes()
    except OSError as e:
        raise SpecError(f"cannot read spec file {str(path)!r}: {e.strerror}") from None
    try:
        if path.suffix.lower() == ".toml":
            return tomllib.loads(text.decode("utf-8-sig"))
        return json.loads(text.decode("utf-8-sig"))
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SpecError(f"spec file {str(path)!r} is not valid {path.suffix.lstrip('.').upper() or 'JSON'}: {e}") from None


def _from_mapping(cls, data: Mapping[str, Any], origin: str):
    if not isinstance(data, Mapping):
        raise SpecError(f"{origin}: expected a table/object of fields, got {type(data).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise SpecError(f"{origin}: unknown field(s) {unknown}.{_suggest(unknown[0], names)} "
                        f"Known fields: {sorted(names)}")
    required = [f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    missing = [k for k in required if k not in data and k != "name"]
    if missing:
        raise SpecError(f"{origin}: missing required field(s) {missing}")
    kwargs = dict(data)
    kwargs.setdefault("name", Path(origin).stem)
    for f in dataclasses.fields(cls):
        if f.name in kwargs and f.type in ("float", "float | None") and isinstance(kwargs[f.name], int) \
                and not isinstance(kwargs[f.name], bool):
            kwargs[f.name] = float(kwargs[f.name])
    try:
        return cls(**kwargs)
    except SpecError as e:
        raise SpecError(f"{origin}: {e}") from None
    except TypeError as e:
        raise SpecError(f"{origin}: {e}") from None


def _parse_mesh_name(name: str) -> HardwareSpec | None:
    """``mocap-RxC`` or ``mocap-RxCxWw`` (W wafers side by side)."""
    import re

    m = re.fullmatch(r"mocap-(\d+)x(\d+)(?:x(\d+)w)?", name)
    if not m:
        return None
    r, c, w = int(m.group(1)), int(m.group(2)), int(m.group(3) or 1)
    if min(r, c, w) <= 0:
        raise SpecError(f"hardware {name!r}: rows, cols and wafers must be positive")
    return mocap_wafer(r, c, wafers=w)


def get_model(name_or_spec: "str | ModelSpec | Path") -> ModelSpec:
    """Resolve a preset name, a path to a JSON/TOML file, or pass a ModelSpec through."""
    if isinstance(name_or_spec, ModelSpec):
        return name_or_spec
    name = str(name_or_spec)
    key = name.lower()
    key = MODEL_ALIASES.get(key, key)
    if key in MODEL_PRESETS:
        return MODEL_PRESETS[key]
    p = Path(name)
    if p.suffix.lower() in (".json", ".toml"):
        data = _load_file(p)
        return _from_mapping(ModelSpec, data.get("model", data), str(p))
    raise SpecError(f"unknown model {name!r}.{_suggest(key, list(MODEL_PRESETS) + list(MODEL_ALIASES))} "
                    f"Run `mocap-jax models` for the list, or pass a .json/.toml spec file.")


def get_hardware(name_or_spec: "str | HardwareSpec | Path") -> HardwareSpec:
    """Resolve a preset name (also any ``mocap-RxC`` / ``mocap-RxCxWw``), a spec file, or a HardwareSpec."""
    if isinstance(name_or_spec, HardwareSpec):
        return name_or_spec
    name = str(name_or_spec)
    key = name.lower()
    if key in HARDWARE_PRESETS:
        return HARDWARE_PRESETS[key]
    mesh = _parse_mesh_name(key)
    if mesh is not None:
        return mesh
    p = Path(name)
    if p.suffix.lower() in (".json", ".toml"):
        data = _load_file(p)
        return _from_mapping(HardwareSpec, data.get("hardware", data), str(p))
    raise SpecError(f"unknown hardware {name!r}.{_suggest(key, HARDWARE_PRESETS)} "
                    f"Run `mocap-jax hardware` for the list, use mocap-RxC for any mesh, or pass a .json/.toml spec file.")


__all__ = [
    "SpecError", "ModelSpec", "HardwareSpec", "MODEL_PRESETS", "HARDWARE_PRESETS", "STUDY_MODELS",
    "mocap_wafer", "gpu_node", "get_model", "get_hardware", "field",
]
