"""The calibration configurations (the test transformer, its (chunk, prefix, batch) grid, the
measurement plan) and the vendor peaks of known accelerators."""

from __future__ import annotations

from dataclasses import dataclass


from ...specs import ModelSpec


@dataclass(frozen=True)
class CalibrationSize:
    """One calibration configuration: the test transformer, the grid and the measurement plan."""

    name: str
    model: ModelSpec
    chunks: tuple[int, ...]
    prefixes: tuple[int, ...]
    batches: tuple[int, ...]
    dtype: str                   # "float32" or "bfloat16"
    kv_block: int                # prefix tokens per attention step
    q_block: int                 # query block of the causal in-chunk attention
    q_rows: int                  # query rows per prefix tile (0: the whole chunk at once)
    rounds: int                  # timed rounds over the whole grid (after one warm-up round)
    min_rounds: int              # rounds kept even when the time budget runs out
    min_sample_s: float          # a timing sample lasts at least this long (back-to-back calls)
    measure_budget_s: float      # stop adding rounds after this much measuring time
    test_fraction: float = 0.4
    needs_accelerator: bool = False


def _llama_like(name, layers, hidden, ffn, q_heads, kv_heads, head_dim) -> ModelSpec:
    # vocab is irrelevant (no embedding / LM head is run) but must be positive.
    return ModelSpec(name=name, layers=layers, hidden=hidden, ffn=ffn, q_heads=q_heads, kv_heads=kv_heads,
                     head_dim=head_dim, vocab=32000)


SIZES: dict[str, CalibrationSize] = {
    "small": CalibrationSize(
        name="small",
        model=_llama_like("calib-small", layers=2, hidden=512, ffn=1536, q_heads=8, kv_heads=2, head_dim=64),
        chunks=(32, 64, 128, 256), prefixes=(0, 512, 1024, 2048, 3072), batches=(1, 2),
        dtype="float32", kv_block=256, q_block=128, q_rows=512,
        rounds=11, min_rounds=3, min_sample_s=0.01, measure_budget_s=20.0),
    "cpu": CalibrationSize(
        name="cpu",
        model=_llama_like("calib-cpu", layers=4, hidden=768, ffn=2048, q_heads=12, kv_heads=4, head_dim=64),
        chunks=(32, 64, 128, 256, 512), prefixes=(0, 1024, 2048, 4096, 8192), batches=(1, 2, 4),
        dtype="float32", kv_block=256, q_block=128, q_rows=512,
        rounds=4, min_rounds=3, min_sample_s=0.02, measure_budget_s=120.0),
    "gpu": CalibrationSize(
        name="gpu",
        # Llama-3.1-8B blocks (hidden 4096, FFN 14336, GQA 32/8 x 128), four of them, in bf16.
        model=_llama_like("calib-gpu-llama8b-blocks", layers=4, hidden=4096, ffn=14336, q_heads=32, kv_heads=8,
                          head_dim=128),
        chunks=(128, 256, 512, 1024, 2048, 4096), prefixes=(0, 2048, 4096, 8192, 16384, 32768), batches=(1, 2),
        dtype="bfloat16", kv_block=512, q_block=256, q_rows=0,
        rounds=7, min_rounds=3, min_sample_s=0.02, measure_budget_s=240.0, needs_accelerator=True),
}

# Vendor dense peaks (FLOP/s) at bf16/fp16 and HBM bandwidths (bytes/s) by JAX device_kind substring.
GPU_NOMINAL = (
    ("gh200", 989e12, 4.0e12, "GH200: 989 TFLOP/s dense BF16, 4 TB/s HBM3"),  # before "h200": a substring
    ("h200", 989e12, 4.8e12, "H200 SXM: 989 TFLOP/s dense BF16, 4.8 TB/s HBM3e"),
    ("h100", 989e12, 3.35e12, "H100 SXM: 989 TFLOP/s dense BF16, 3.35 TB/s HBM3"),
    ("b200", 2.25e15, 7.7e12, "B200: 2.25 PFLOP/s dense BF16, 7.7 TB/s HBM3e"),
    ("a100", 312e12, 2.039e12, "A100 SXM 80GB: 312 TFLOP/s dense BF16, 2.039 TB/s HBM2e"),
)

FIT_NAMES = ("eff_gemm", "eff_attention", "eff_hbm", "layer_overhead_s")


def check_size(size) -> CalibrationSize:
    if isinstance(size, CalibrationSize):
        return size
    if not isinstance(size, str) or size not in SIZES:
        raise ValueError(f"unknown calibration size {size!r}; choose one of {', '.join(SIZES)} "
                         f"(small: the test grid, under a minute on a 2-core CPU; cpu: a fuller CPU grid; "
                         f"gpu: Llama-8B-sized blocks, needs a GPU)")
    return SIZES[size]


# --------------------------------------------------------------------------- the test transformer
