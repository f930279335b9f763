"""Datasheet figures of the GPUs the simulator has presets for, each with the pages they come from.

One :class:`GPUDatasheet` per GPU: dense (no sparsity) BF16 and FP8 tensor peaks, HBM capacity
and bandwidth, NVLink bandwidth per direction, the GPUs one NVLink domain joins (node size) and
the scale-out network bandwidth per GPU.  :func:`mocap_jax.specs.gpu_node` turns an entry into a
:class:`~mocap_jax.specs.HardwareSpec`.  Vendors quote NVLink as the sum of both directions
(900 GB/s on H100); the simulator's links are per direction, so the table holds half of it.
Units: FLOP/s, bytes, bytes/s.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPUDatasheet:
    """Public figures of one GPU (per GPU unless noted).

    Attributes:
      key: preset prefix (``h100`` gives ``h100-x8``).
      product: the product the figures describe.
      bf16_flops: dense BF16 tensor-core peak, FLOP/s.
      fp8_flops: dense FP8 tensor-core peak, FLOP/s; ``None`` when the GPU has no FP8.
      hbm_capacity: bytes of HBM.
      hbm_bandwidth: HBM bytes/s.
      nvlink_bandwidth: NVLink bytes/s per direction (half the vendor's bidirectional figure).
      node_gpus: GPUs joined by one NVLink switch domain.
      network_bandwidth: scale-out NIC bytes/s per GPU per direction (between NVLink domains).
      eff_gemm, eff_attention: achieved / peak for large BF16 GEMMs and for FlashAttention at BF16.
      sources: the pages the figures were read from.
    """

    key: str
    product: str
    bf16_flops: float
    fp8_flops: float | None
    hbm_capacity: float
    hbm_bandwidth: float
    nvlink_bandwidth: float
    node_gpus: int
    network_bandwidth: float
    eff_gemm: float
    eff_attention: float
    sources: tuple[str, ...]


# Scale-out NICs: DGX H100 / H200 / B200 carry eight single-port ConnectX-7 at up to 400 Gb/s, one
# per GPU (50 GB/s per direction); DGX A100 eight 200 Gb/s Mellanox adapters (25 GB/s).
_DGX_NICS = "https://docs.nvidia.com/dgx-basepod/reference-architecture-infrastructure-foundation-enterprise-ai/latest/core-components.html"
_DGX_A100_NICS = "https://geektopia.es/es/technology/2020/05/14/noticias/nvidia-anuncia-el-servidor-dgx-a100-ocho-tesla-a100-desde-200-000-dolares.html"
# Efficiencies: large BF16 GEMMs reach about 80% of peak on H100 and 78% on B200, FlashAttention-3
# about 75% of H100 BF16 peak and FlashAttention-4 about 71% of B200's (H200 and H20 share the H100
# die, GB200 the B200's).  A100: the GEMM plateau fitted to the Vidur A100 operator profiles
# (0.72, docs/cost_model.md) and FlashAttention-2's up to 73% of A100 peak
# (https://arxiv.org/abs/2307.08691).

GPUS: dict[str, GPUDatasheet] = {
    g.key: g
    for g in [
        GPUDatasheet(
            "a100", "A100 SXM4 80 GB", bf16_flops=312e12, fp8_flops=None, hbm_capacity=80e9,
            hbm_bandwidth=2.039e12, nvlink_bandwidth=300e9, node_gpus=8, network_bandwidth=25e9,
            eff_gemm=0.72, eff_attention=0.70,
            sources=("https://glennklockwood.com/garden/processors/A100",
                     "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
                     "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf", _DGX_A100_NICS)),
        GPUDatasheet(
            "h100", "H100 SXM5 80 GB", bf16_flops=989e12, fp8_flops=1979e12, hbm_capacity=80e9,
            hbm_bandwidth=3.35e12, nvlink_bandwidth=450e9, node_gpus=8, network_bandwidth=50e9,
            eff_gemm=0.80, eff_attention=0.75,
            sources=("https://glennklockwood.com/garden/processors/h100",
                     "https://archive-lib.hpctech.co.jp/gpuproduct/nvidia-h100.html", _DGX_NICS)),
        GPUDatasheet(
            "h200", "H200 SXM 141 GB", bf16_flops=989e12, fp8_flops=1979e12, hbm_capacity=141e9,
            hbm_bandwidth=4.8e12, nvlink_bandwidth=450e9, node_gpus=8, network_bandwidth=50e9,
            eff_gemm=0.80, eff_attention=0.75,
            sources=("https://lzwjava.github.io/nvidia-h200-gpu-specs-en",
                     "https://www.saulelectric.com/nvidia-h200.html", _DGX_NICS)),
        GPUDatasheet(
            "h20", "H20 96 GB", bf16_flops=148e12, fp8_flops=296e12, hbm_capacity=96e9,
            hbm_bandwidth=4.0e12, nvlink_bandwidth=450e9, node_gpus=8, network_bandwidth=50e9,
            eff_gemm=0.80, eff_attention=0.75,
            sources=("https://willitrunai.com/es/gpus/h20-96gb",
                     "https://zangshuxian.com/new/674733024499207168", _DGX_NICS)),
        GPUDatasheet(
            "b200", "B200 (HGX / DGX B200)", bf16_flops=2.25e15, fp8_flops=4.5e15, hbm_capacity=180e9,
            hbm_bandwidth=8.0e12, nvlink_bandwidth=900e9, node_gpus=8, network_bandwidth=50e9,
            eff_gemm=0.78, eff_attention=0.71,
            sources=("https://glennklockwood.com/garden/processors/B200",
                     "https://brent-newsom-nvidia.github.io/AIPS-Boom/wiki/NVIDIA-DGX-B200", _DGX_NICS)),
        GPUDatasheet(
            "gb200", "B200 in GB200 NVL72", bf16_flops=2.5e15, fp8_flops=5.0e15, hbm_capacity=186e9,
            hbm_bandwidth=8.0e12, nvlink_bandwidth=900e9, node_gpus=72, network_bandwidth=50e9,
            eff_gemm=0.78, eff_attention=0.71,
            sources=("https://glennklockwood.com/garden/processors/B200",
                     "https://aiwiki.ai/wiki/nvidia_gb200_nvl72/raw")),
    ]
}
"""Per-GPU figures.  B200 memory: DGX B200 lists 1,440 GB and 64 TB/s for eight GPUs; GB200
NVL72 lists about 13.4 TB and 576 TB/s for 72 GPUs; FP8 peaks are half the quoted sparse figures."""
