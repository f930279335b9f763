"""Agreement of the vectorised simulator with the event-driven reference (DESIGN §9.1).

:func:`sample_configs` draws random configurations (presets incl. MoE models, meshes of
4 to 32 dies, sequence lengths, random chunk partitions, batches, both schemes, both
admission modes, both release policies, 1-3 batches, snake or random stage-to-die maps);
:func:`run_reference_agreement` runs every one through :func:`mocap_jax.simulate`
(vectorised, in float32 or float64) and through
:func:`~mocap_jax.validation.reference.reference_simulate` and reports the largest
relative disagreement per metric.  Used by ``mocap-jax validate``, the differential
tests and the sweep tooling.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..specs import get_hardware
from .reference import ReferenceResult, reference_simulate

#: Models drawn from (dense and MoE presets of different depths and widths).
AGREEMENT_MODELS = ("llama3.1-8b", "llama3-70b", "mistral-large-123b", "qwen3-30b-a3b", "qwen3-235b-a22b",
                    "mixtral-8x22b")
#: Meshes drawn from: 4, 8, 16 dies, and two wafers side by side (32 dies).
AGREEMENT_MESHES = ("mocap-2x2", "mocap-2x4", "mocap-4x4", "mocap-4x4x2w")
#: Metrics compared, in report order.
METRICS = ("finish_times", "prefill_latency_s", "kv_peak_bytes_per_stage", "peak_mem_bytes_per_stage",
           "throughput_rps", "bubble_fraction")

# Floors of the relative-error denominators (a metric whose reference value is 0, e.g.
# the peak KV of gpipe under the stage policy, is compared against these).
_FLOOR = {"finish_times": 1e-12, "prefill_latency_s": 1e-12, "kv_peak_bytes_per_stage": 1.0,
          "peak_mem_bytes_per_stage": 1.0, "throughput_rps": 1e-12, "bubble_fraction": 1e-12}


@dataclass(frozen=True)
class AgreementConfig:
    """One configuration, as the keyword arguments both simulators take.

    Attributes:
      model, hardware: preset names.
      seq_len: prompt tokens per request.
      scheme: ``"terapipe"`` or ``"gpipe"``.
      batch: requests per batch.
      partition: chunk sizes (terapipe) or None (gpipe).
      microbatch: requests per gpipe microbatch.
      release, admission: KV release policy and admission mode.
      num_batches: batches run back to back.
      placement: die of each stage (a permutation of every die), or None for the snake order.
    """

    model: str
    hardware: str
    seq_len: int
    scheme: str
    batch: int
    partition: tuple[int, ...] | None
    microbatch: int
    release: str
    admission: str
    num_batches: int
    placement: tuple[int, ...] | None = None

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``simulate`` / ``reference_simulate`` (without model and hardware)."""
        kw = dict(seq_len=self.seq_len, scheme=self.scheme, batch=self.batch, release=self.release,
                  admission=self.admission, num_batches=self.num_batches, microbatch=self.microbatch)
        if self.partition is not None:
            kw["partition"] = list(self.partition)
            kw["chunks"] = len(self.partition)
        if self.placement is not None:
            kw["placement"] = list(self.placement)
        return kw

    def describe(self) -> str:
        part = f" partition={list(self.partition)}" if self.partition is not None else f" microbatch={self.microbatch}"
        place = "" if self.placement is None else f" placement={list(self.placement)}"
        return (f"{self.model} on {self.hardware}: S={self.seq_len} {self.scheme} B={self.batch}{part} "
                f"release={self.release} admission={self.admission} num_batches={self.num_batches}{place}")


def random_partition(rng: np.random.Generator, seq_len: int, chunks: int) -> tuple[int, ...]:
    """A random composition of ``seq_len`` into ``chunks`` positive parts (uniform over cut sets)."""
    chunks = min(chunks, seq_len)
    cuts = np.sort(rng.choice(np.arange(1, seq_len), size=chunks - 1, replace=False)) if chunks > 1 else np.array([], int)
    edges = np.concatenate([[0], cuts, [seq_len]])
    return tuple(int(x) for x in np.diff(edges))


def sample_config(rng: np.random.Generator, model: str | None = None, hardware: str | None = None,
                  scheme: str | None = None, max_chunks: int = 16) -> AgreementConfig:
    """Draw one configuration; any of ``model``, ``hardware``, ``scheme`` may be fixed."""
    model = model or str(rng.choice(AGREEMENT_MODELS))
    hardware = hardware or str(rng.choice(AGREEMENT_MESHES))
    scheme = scheme or str(rng.choice(["terapipe", "gpipe"], p=[0.7, 0.3]))
    if rng.random() < 0.25:   # memory stress: long prompts, large batches (many are infeasible)
        seq_len = int(round(2 ** rng.uniform(16, 18)))       # 64k .. 262k tokens
        batch = int(round(2 ** rng.uniform(3.5, 6)))         # 11 .. 64 requests
    else:
        seq_len = int(round(2 ** rng.uniform(8, 17)))        # 256 .. 131k tokens, log-uniform
        batch = int(round(2 ** rng.uniform(0, 4)))           # 1 .. 16 requests, log-uniform
    if scheme == "terapipe":
        chunks = int(rng.integers(1, max_chunks + 1))
        partition = random_partition(rng, seq_len, chunks)
        microbatch = 1
    else:
        partition = None
        microbatch = int(rng.integers(-(-batch // max_chunks), batch + 1))   # at most max_chunks microbatches
    release = str(rng.choice(["stage", "request"]))
    admission = str(rng.choice(["streaming", "synchronous"]))
    num_batches = int(rng.integers(1, 4))
    placement = None
    if rng.random() < 0.2:   # a random stage-to-die map: multi-hop hand-offs, wafer crossings
        placement = tuple(int(x) for x in rng.permutation(get_hardware(hardware).num_dies))
    return AgreementConfig(model=model, hardware=hardware, seq_len=seq_len, scheme=scheme, batch=batch,
                           partition=partition, microbatch=microbatch, release=release, admission=admission,
                           num_batches=num_batches, placement=placement)


def sample_configs(n: int, seed: int = 0, **fixed) -> list[AgreementConfig]:
    """``n`` configurations from a seeded generator (same seed, same list)."""
    rng = np.random.default_rng(seed)
    return [sample_config(rng, **fixed) for _ in range(n)]


def _rel(got, want, floor) -> float:
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    if got.shape != want.shape:
        raise ValueError(f"shape mismatch: vectorised {got.shape} vs reference {want.shape}")
    both_inf = np.isinf(got) & np.isinf(want) & (np.sign(got) == np.sign(want))
    with np.errstate(invalid="ignore"):
        err = np.abs(got - want) / np.maximum(np.abs(want), floor)
    err = np.where(both_inf, 0.0, err)
    err = np.where(np.isnan(err), np.inf, err)
    return float(err.max()) if err.size else 0.0


def compare(vec: Any, ref: ReferenceResult) -> dict[str, Any]:
    """Relative errors of one vectorised result against the reference.

    Args:
      vec: a :class:`mocap_jax.SimResult`-like object (``finish_times [K, N]``,
        ``prefill_latency_s``, ``kv_peak_bytes_per_stage [N]``, ...).
      ref: the :class:`ReferenceResult` of the same configuration.

    Returns:
      ``{metric: max relative error}`` for every metric in :data:`METRICS`, plus
      ``feasible_match`` (bool).  Latency and throughput are compared as raw numbers,
      so an inf/0 on one side only (a feasibility flip) counts as an infinite error.
    """
    out = {}
    for m in METRICS:
        out[m] = _rel(getattr(vec, m), getattr(ref, m), _FLOOR[m])
    out["feasible_match"] = bool(vec.feasible) == bool(ref.feasible)
    return out


@dataclass
class AgreementReport:
    """Accumulates per-configuration errors (max, and the configuration that set it)."""

    dtype: str
    max_rel_err: dict[str, float] = field(default_factory=lambda: {m: 0.0 for m in METRICS})
    worst: dict[str, str] = field(default_factory=dict)
    configs: int = 0
    feasible_mismatches: int = 0
    infeasible_configs: int = 0
    mismatched: list[str] = field(default_factory=list)

    def add(self, cfg: AgreementConfig, errs: dict[str, Any], ref_feasible: bool) -> None:
        self.configs += 1
        self.infeasible_configs += int(not ref_feasible)
        if not errs["feasible_match"]:
            self.feasible_mismatches += 1
            self.mismatched.append(cfg.describe())
        for m in METRICS:
            if not errs["feasible_match"] and m in ("prefill_latency_s", "throughput_rps"):
                continue  # counted as a feasibility mismatch instead
            if errs[m] > self.max_rel_err[m]:
                self.max_rel_err[m] = errs[m]
                self.worst[m] = cfg.describe()

    def as_dict(self) -> dict[str, Any]:
        return dict(dtype=self.dtype, configs=self.configs, max_rel_err=dict(self.max_rel_err),
                    overall_max_rel_err=max(self.max_rel_err.values()), worst=dict(self.worst),
                    feasible_mismatches=self.feasible_mismatches, infeasible_configs=self.infeasible_configs,
                    mismatched=list(self.mismatched[:10]))


def run_reference_agreement(configs: int = 200, seed: int = 0, dtype: str = "float32",
                            config_list: list[AgreementConfig] | None = None) -> dict[str, Any]:
    """Run random configurations through both simulators and report the largest disagreements.

    Args:
      configs: number of random configurations (ignored when ``config_list`` is given).
      seed: seed of the configuration generator.
      dtype: precision of the vectorised simulator, ``"float32"`` or ``"float64"``
        (float64 needs ``jax_enable_x64``).  The reference always runs in float64.
      config_list: explicit configurations instead of random ones.

    Returns:
      A dict: ``dtype``; ``configs``; ``max_rel_err`` (per metric: finish_times,
      prefill_latency_s, kv_peak_bytes_per_stage, peak_mem_bytes_per_stage,
      throughput_rps, bubble_fraction); ``overall_max_rel_err``; ``worst`` (per metric,
      the configuration with the largest error); ``feasible_mismatches`` (configurations
      the two call feasible differently; expected only in float32, at the boundary);
      ``infeasible_configs``; ``reference_wall_s``; ``vectorised_wall_s``.
    """
    import mocap_jax

    if dtype not in ("float32", "float64"):
        raise ValueError(f"dtype must be 'float32' or 'float64', got {dtype!r}")
    if dtype == "float64":
        import jax

        if not jax.config.jax_enable_x64:
            raise ValueError("float64 agreement needs 64-bit JAX: set JAX_ENABLE_X64=1 "
                             "or jax.config.update('jax_enable_x64', True) first")
    cfgs = config_list if config_list is not None else sample_configs(configs, seed)
    report = AgreementReport(dtype=dtype)
    ref_wall = vec_wall = 0.0
    for cfg in cfgs:
        t0 = time.perf_counter()
        ref = reference_simulate(cfg.model, cfg.hardware, **cfg.kwargs())
        t1 = time.perf_counter()
        vec = mocap_jax.simulate(cfg.model, cfg.hardware, dtype=dtype, **cfg.kwargs())
        t2 = time.perf_counter()
        ref_wall += t1 - t0
        vec_wall += t2 - t1
        report.add(cfg, compare(vec, ref), ref.feasible)
    out = report.as_dict()
    out.update(seed=seed, reference_wall_s=ref_wall, vectorised_wall_s=vec_wall)
    return out


def tolerance(dtype: str) -> float:
    """The agreement the project promises: 1e-9 relative in float64, 1e-4 in float32."""
    return 1e-9 if dtype == "float64" else 1e-4


__all__ = ["AGREEMENT_MESHES", "AGREEMENT_MODELS", "METRICS", "AgreementConfig", "AgreementReport", "compare",
           "random_partition", "run_reference_agreement", "sample_config", "sample_configs", "tolerance"]
