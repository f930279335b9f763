"""Hardware specifications: a mesh of identical dies (one or more wafers) or a GPU node.

:class:`HardwareSpec` holds per-die peak FLOP/s, HBM and link numbers and the efficiency
parameters of the roofline cost model; :func:`mocap_wafer` and :func:`gpu_node` build the
presets.  Units: bytes, seconds, FLOP/s and bytes/s.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from . import checks
from .checks import SpecError


@dataclass(frozen=True)
class HardwareSpec:
    """A mesh of identical dies (one or more wafers) or a GPU node.

    Dies form a ``rows x (cols * wafers)`` grid; wafers sit side by side along the
    column axis and the links that cross a wafer boundary have
    ``cross_wafer_bandwidth``.  ``topology="switch"`` models GPU nodes: every pair of
    devices is one hop apart, over the NVLink switch inside a node (``cols`` GPUs) and
    over the nodes' network between nodes (``wafers`` nodes, ``cross_wafer_bandwidth``).

    Attributes (per die / device):
      peak_flops: dense peak FLOP/s at the simulated precision.
      hbm_capacity: bytes of HBM.
      hbm_bandwidth: HBM bytes/s.
      link_bandwidth: bytes/s per direction per neighbour link (D2D or NVLink).
      cross_wafer_bandwidth: bytes/s per direction of a link crossing wafers (on a
        switch: of a GPU's network port to another node).
      link_latency_s: seconds per hop.
      eff_gemm, eff_attention, eff_hbm, eff_link: achieved / peak.
      usable_hbm_fraction: share of HBM the runtime may fill.
      weight_bytes, kv_bytes, activation_bytes: storage precision per element.
      mlp_token_tile: tokens the engine runs the MLP (and LM head) over at a time, so their
        intermediate tensors are bounded by the tile rather than by the chunk (hybrid
        prefilling); 0 runs them over the whole chunk (untiled).  Attention always runs over
        the whole chunk.  See :func:`mocap_jax.costs.stage.item_activation_bytes`.
      activation_buffer_scale: multiplier on those activation buffers (1 = the tensors stated
        there, 0 = activations take no memory).
      layer_overhead_s: fixed seconds per transformer block per item (kernel
        launches, synchronisation); 0 by default, fitted by ``mocap-jax calibrate``.
      gemm_fixed_s: fixed seconds of one GEMM kernel (launch, pipeline fill, tail wave),
        which makes GEMM efficiency rise with the tokens a GEMM processes
        (:mod:`mocap_jax.costs.efficiency`); the default is fitted to the Vidur A100 and
        H100 operator profiles (docs/cost_model.md); 0 gives a flat ``eff_gemm``.
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
    mlp_token_tile: int = 4096
    activation_buffer_scale: float = 1.0
    layer_overhead_s: float = 0.0
    gemm_fixed_s: float = 9.6e-6
    description: str = ""

    def __post_init__(self):
        where = f"hardware {self.name!r}"
        for f in ("rows", "cols", "wafers"):
            checks.integer(f"{where}: {f}", getattr(self, f), 1, checks.LIMITS["dies"])
        if self.num_dies > checks.LIMITS["dies"]:
            raise SpecError(f"{where}: {self.num_dies:,} dies exceed the largest mesh the simulator represents, "
                            f"{checks.LIMITS['dies']:,} dies")
        checks.choice(f"{where}: topology", self.topology, ("mesh", "switch"))
        for f in ("peak_flops", "hbm_capacity", "hbm_bandwidth", "link_bandwidth", "cross_wafer_bandwidth"):
            checks.positive(f"{where}: {f}", getattr(self, f), lo=checks.LIMITS["hardware_minimum"],
                            hint=" Give FLOP/s, bytes or bytes/s (1 at least).")
        for f in ("weight_bytes", "kv_bytes", "activation_bytes"):
            checks.number(f"{where}: {f}", getattr(self, f), 0.0, 16.0, lo_open=True,
                          hint=" Bytes per stored element, e.g. 2 for BF16, 1 for FP8.")
        for f in ("eff_gemm", "eff_attention", "eff_hbm", "eff_link"):
            checks.number(f"{where}: {f}", getattr(self, f), checks.LIMITS["efficiency_minimum"], 1.0)
        checks.fraction(f"{where}: usable_hbm_fraction", self.usable_hbm_fraction, open_low=True)
        for f in ("link_latency_s", "layer_overhead_s", "gemm_fixed_s"):
            checks.number(f"{where}: {f}", getattr(self, f), 0.0, checks.LIMITS["latency_s"])
        checks.integer(f"{where}: mlp_token_tile", self.mlp_token_tile, 0, checks.LIMITS["seq_len"],
                       hint=" Tokens per MLP tile, or 0 for untiled.")
        checks.number(f"{where}: activation_buffer_scale", self.activation_buffer_scale, 0.0, 64.0)
        if not isinstance(self.description, str):
            raise SpecError(f"{where}: description must be a string")

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
    """The MOCAP Blackwell-class die on a ``rows x cols`` mesh, ``wafers`` side by side."""
    name = f"mocap-{rows}x{cols}" + (f"x{wafers}w" if wafers > 1 else "")
    return HardwareSpec(name=changes.pop("name", name), rows=rows, cols=cols, wafers=wafers,
                        description=changes.pop("description", "Blackwell-class dies, 4.5 PFLOP/s FP8, 180 GB HBM, 5 TB/s D2D"),
                        **changes)


PRECISIONS = ("bf16", "fp8")


def gpu_node(kind: str, gpus: int | None = None, nodes: int = 1, precision: str = "bf16") -> HardwareSpec:
    """``nodes`` NVLink domains of ``gpus`` GPUs each (default: the product's node size).

    GPUs of one node are one hop apart over the NVLink switch (per-direction NVLink
    bandwidth); GPUs of different nodes over their scale-out NICs (``cross_wafer_bandwidth``).
    ``precision="fp8"`` runs GEMMs at the dense FP8 peak with 1-byte weights while attention
    stays at BF16 (as in the FlashAttention kernels engines use), so ``eff_attention`` is
    expressed against the FP8 peak; KV and activations stay 2 bytes.  Figures and their
    sources: :data:`mocap_jax.specs.gpus.GPUS`.
    """
    from .checks import choice, integer
    from .gpus import GPUS

    d = GPUS[choice("GPU", kind, tuple(GPUS))]
    gpus = d.node_gpus if gpus is None else integer("gpus", gpus, 1)
    if gpus > d.node_gpus:
        raise SpecError(f"one {d.product} node holds up to {d.node_gpus} GPUs, got gpus={gpus}; "
                        f"use nodes=... (or KIND-x{d.node_gpus}xNn) for more")
    nodes = integer("nodes", nodes, 1)
    choice("precision", precision, PRECISIONS)
    peak, weight_bytes, eff_attention = d.bf16_flops, 2.0, d.eff_attention
    if precision == "fp8":
        if d.fp8_flops is None:
            raise SpecError(f"{d.product} has no FP8 tensor cores; use precision='bf16'")
        peak, weight_bytes, eff_attention = d.fp8_flops, 1.0, d.eff_attention * d.bf16_flops / d.fp8_flops
    name = f"{kind}-x{gpus}" + (f"x{nodes}n" if nodes > 1 else "") + ("-fp8" if precision == "fp8" else "")
    return HardwareSpec(name=name, rows=1, cols=gpus, wafers=nodes, topology="switch", peak_flops=peak,
                        hbm_capacity=d.hbm_capacity, hbm_bandwidth=d.hbm_bandwidth,
                        link_bandwidth=d.nvlink_bandwidth, cross_wafer_bandwidth=d.network_bandwidth,
                        link_latency_s=1e-6, eff_gemm=d.eff_gemm, eff_attention=eff_attention, eff_link=0.85,
                        weight_bytes=weight_bytes,
                        description=f"{d.product}, {precision.upper()} dense"
                                    + (f", {nodes} nodes" if nodes > 1 else ""))


HARDWARE_PRESETS: dict[str, HardwareSpec] = {
    h.name: h
    for h in [
        mocap_wafer(4, 4),
        mocap_wafer(2, 2),
        mocap_wafer(2, 4),
        mocap_wafer(6, 6),
        mocap_wafer(8, 8),
        mocap_wafer(4, 4, wafers=2),
        gpu_node("a100"),
        gpu_node("h100"),
        gpu_node("h200"),
        gpu_node("h20"),
        gpu_node("b200"),
        gpu_node("gb200"),
    ]
}
