"""Agreement of the vectorised simulator with the event-driven reference (DESIGN §9.1).

:func:`sample_configs` draws random configurations (presets incl. MoE models, meshes of
4 to 32 dies, sequence lengths, random chunk partitions, batches, both schemes, both
admission modes, both release policies, 1-3 batches, snake or random stage-to-die maps);
:func:`run_reference_agreement` runs every one through :func:`mocap_jax.simulate`
(vectorised, in float32 or float64) and through
:func:`~mocap_jax.validation.reference.reference_simulate` and reports the largest
relative disagreement per metric.  Used by ``mocap-jax validate``, the differential
tests and the sweep tooling.

MBKR is where the array program approximates (docs/semantics.md "MBKR"):
:func:`sample_mbkr_configs` draws MBKR configurations in groups that share one
vectorised call (sequence lengths drawn for a KV pressure around the spill threshold,
so that many spill), and :func:`run_mbkr_agreement` reports the mean and largest
relative error of latency and per-stage peak memory of ``mocap_jax.simulate_batch``
against :class:`~mocap_jax.validation.reference_mbkr.MBKRReferenceSimulator`, with the
targets :data:`MBKR_TARGET_MEAN` / :data:`MBKR_TARGET_MAX`.
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


def _check_dtype(dtype: str) -> None:
    """Raise ``ValueError`` unless ``dtype`` is float32, or float64 with 64-bit JAX enabled."""
    if dtype not in ("float32", "float64"):
        raise ValueError(f"dtype must be 'float32' or 'float64', got {dtype!r}")
    if dtype == "float64":
        import jax

        if not jax.config.jax_enable_x64:
            raise ValueError("float64 agreement needs 64-bit JAX: set JAX_ENABLE_X64=1 "
                             "or jax.config.update('jax_enable_x64', True) first")


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

    _check_dtype(dtype)
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


# --------------------------------------------------------------------------- MBKR


#: MBKR pairing policies drawn from, with their weights.
MBKR_PAIRINGS = ("cross-half", "none", "head-to-tail", "dynamic")
_MBKR_PAIRING_WEIGHTS = (0.35, 0.1, 0.25, 0.3)
#: Approximation targets of the array program's MBKR against the event-driven reference (issue 3).
MBKR_TARGET_MEAN = 0.01
MBKR_TARGET_MAX = 0.05
#: Chunk-count buckets (the array program's item padding): ``k_pad -> (fewest, most)`` chunks.
_CHUNK_BUCKETS = {4: (2, 4), 8: (5, 8), 16: (9, 16)}


@dataclass(frozen=True)
class MBKRAgreementConfig:
    """One MBKR configuration, as the keyword arguments both simulators take.

    Attributes:
      model, hardware: preset names.
      seq_len: prompt tokens per request.
      batch: requests per batch.
      partition: chunk sizes.
      release, admission: KV release policy and admission mode.
      num_batches: batches run back to back.
      pairing, p1, p2, read_overlap: MBKR settings.
      placement: die of each stage (the array side's searched placement, or a random map).
      fill: the KV pressure the sequence length was drawn for (B x S x KV per token of the
        most pressed stage over ``p2`` x its KV budget; informative only).
      group: index of the group of configurations that share one vectorised call.
    """

    model: str
    hardware: str
    seq_len: int
    batch: int
    partition: tuple[int, ...]
    release: str
    admission: str
    num_batches: int
    pairing: str
    p1: float
    p2: float
    read_overlap: float
    placement: tuple[int, ...]
    fill: float = 0.0
    group: int = 0

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``simulate`` / ``reference_simulate`` (without model and hardware)."""
        return dict(seq_len=self.seq_len, scheme="mbkr", batch=self.batch, partition=list(self.partition),
                    chunks=len(self.partition), release=self.release, admission=self.admission,
                    num_batches=self.num_batches, placement=list(self.placement), pairing=self.pairing,
                    p1=self.p1, p2=self.p2, read_overlap=self.read_overlap)

    def describe(self) -> str:
        return (f"{self.model} on {self.hardware}: S={self.seq_len} mbkr B={self.batch} "
                f"partition={list(self.partition)} release={self.release} admission={self.admission} "
                f"num_batches={self.num_batches} pairing={self.pairing} p1={self.p1:.3f} p2={self.p2:.3f} "
                f"read_overlap={self.read_overlap:.3f} placement={list(self.placement)}")


def _pressure_seq_len(model, hw, n: int, batch: int, fractions: np.ndarray, fill: float, p2: float) -> int:
    """Sequence length at which the most pressed stage's batch KV is ``fill x p2 x`` its KV budget.

    The budget shrinks with S (the largest chunk's workspace), so per stage s:
    ``B S kv[s] = fill p2 (usable - weights[s] - B c_max (kv[s] + factor hidden act))`` with
    ``c_max = max(fractions) S``, solved for S; the smallest over the stages.
    """
    from .. import costs

    mp = costs.ModelParams.from_spec(model, np.float64)
    hp = costs.HardwareParams.from_spec(hw, np.float64)
    kv = np.asarray(costs.stage_kv_bytes_per_token(mp, hp, n, n, xp=np), np.float64)
    w = np.asarray(costs.stage_weight_bytes(mp, hp, n, n, xp=np), np.float64)
    usable = hw.hbm_capacity * hw.usable_hbm_fraction
    act = hw.activation_workspace_factor * model.hidden * hw.activation_bytes
    fmax = float(fractions.max())
    q = fill * p2
    s_len = q * (usable - w) / (batch * (kv + q * fmax * (kv + act)))
    return int(max(s_len.min(), 1))


def _fraction_partition(fractions: np.ndarray, seq_len: int) -> tuple[int, ...]:
    """Chunk sizes proportional to ``fractions`` (each at least one token), summing to ``seq_len``."""
    m = len(fractions)
    sizes = np.maximum(np.floor(fractions * seq_len).astype(np.int64), 1)
    diff = seq_len - int(sizes.sum())
    order = np.argsort(-fractions)
    i = 0
    while diff != 0:
        j = order[i % m]
        if diff > 0:
            sizes[j] += 1
            diff -= 1
        elif sizes[j] > 1:
            sizes[j] -= 1
            diff += 1
        i += 1
    return tuple(int(x) for x in sizes)


def sample_mbkr_configs(n: int, seed: int = 0, group_size: int = 10, models=AGREEMENT_MODELS,
                        meshes=AGREEMENT_MESHES, pairings=MBKR_PAIRINGS, fill=(0.7, 1.8),
                        num_batches=(1, 2), buckets=(4, 8, 16)) -> list[MBKRAgreementConfig]:
    """``n`` random MBKR configurations in groups of ``group_size`` that share one vectorised call.

    A group fixes model, mesh, pairing, thresholds, read overlap, release policy, admission,
    number of batches, placement and chunk-count bucket; its points vary batch, chunk count,
    partition and sequence length.  The sequence length is drawn for a KV pressure ``fill``
    (uniform in the given range: B x S x KV per token of the most pressed stage over ``p2``
    x its KV budget), so that many configurations spill and some do not fit at all.

    Args:
      n: configurations (the last group may be smaller).
      seed: seed of the generator (same seed, same list).
      group_size: points per group.
      models, meshes, pairings: what to draw from (pairings with fixed weights when all four).
      fill: range of the KV pressure.
      num_batches: batch counts to draw from.
      buckets: chunk-count buckets (4: 2-4 chunks, 8: 5-8, 16: 9-16).
    """
    from .. import costs
    from ..api import searched_placement
    from ..specs.mesh import snake_placement
    from ..specs import get_model

    rng = np.random.default_rng(seed)
    weights = np.array([_MBKR_PAIRING_WEIGHTS[MBKR_PAIRINGS.index(p)] for p in pairings])
    weights = weights / weights.sum()
    out: list[MBKRAgreementConfig] = []
    g = 0
    while len(out) < n:
        model = str(rng.choice(models))
        hardware = str(rng.choice(meshes))
        m, hw = get_model(model), get_hardware(hardware)
        nst = hw.num_dies
        w = np.asarray(costs.stage_weight_bytes(costs.ModelParams.from_spec(m, np.float64),
                                                costs.HardwareParams.from_spec(hw, np.float64), nst, nst, xp=np))
        if nst > m.layers or w.max() > 0.8 * hw.hbm_capacity * hw.usable_hbm_fraction:
            continue  # weights (nearly) fill a die: no room for KV
        pairing = str(rng.choice(pairings, p=weights))
        p1 = 0.0 if rng.random() < 0.5 else float(rng.uniform(0.0, 0.6))
        p2 = float(rng.uniform(max(p1, 0.5), 0.98))
        overlap = 0.5 if rng.random() < 0.3 else float(rng.uniform(0.0, 1.0))
        release = str(rng.choice(["stage", "request"]))
        admission = str(rng.choice(["streaming", "synchronous"]))
        nb = int(rng.choice(num_batches))
        if rng.random() < 0.1:
            placement = tuple(int(x) for x in rng.permutation(hw.num_dies))
        elif pairing == "none":
            placement = tuple(int(x) for x in snake_placement(hw, nst))
        else:
            placement = tuple(int(x) for x in searched_placement(hw, nst, pairing))
        k_pad = int(rng.choice(buckets))
        lo, hi = _CHUNK_BUCKETS[k_pad]
        for _ in range(min(group_size, n - len(out))):
            batch = int(round(2 ** rng.uniform(0, 4)))
            chunks = int(rng.integers(lo, hi + 1))
            if rng.random() < 0.3:
                fractions = np.full(chunks, 1.0 / chunks)
            else:
                fractions = rng.dirichlet(np.full(chunks, 1.5))
            f = float(rng.uniform(*fill))
            seq_len = _pressure_seq_len(m, hw, nst, batch, fractions, f, p2)
            seq_len = int(min(max(seq_len, 4 * chunks), 2 ** 30 // batch))
            out.append(MBKRAgreementConfig(
                model=model, hardware=hardware, seq_len=seq_len, batch=batch,
                partition=_fraction_partition(fractions, seq_len), release=release, admission=admission,
                num_batches=nb, pairing=pairing, p1=p1, p2=p2, read_overlap=overlap, placement=placement, fill=f,
                group=g))
        g += 1
    return out


def _mbkr_vectorised(group: list[MBKRAgreementConfig], dtype: str, group_size: int) -> dict[str, np.ndarray]:
    """One ``simulate_batch`` call over a group (padded to ``group_size`` points: one compiled shape)."""
    import mocap_jax

    c0 = group[0]
    pts = list(group) + [group[-1]] * (group_size - len(group))
    width = max(len(c.partition) for c in pts)
    part = np.zeros((len(pts), width), np.int64)
    for i, c in enumerate(pts):
        part[i, : len(c.partition)] = c.partition
    from ..schedule import bucket

    k_pad = bucket(width)   # what simulate() pads the group's largest chunk count to
    out = mocap_jax.simulate_batch(
        c0.model, c0.hardware, np.array([c.seq_len for c in pts]), "mbkr", batch=np.array([c.batch for c in pts]),
        partition=part, release=c0.release, admission=c0.admission, num_batches=c0.num_batches,
        placement=list(c0.placement), dtype=dtype, k_pad=k_pad, pairing=c0.pairing, p1=c0.p1, p2=c0.p2,
        read_overlap=c0.read_overlap, block_size=group_size)
    return {k: np.asarray(v)[: len(group)] for k, v in out.items()}


def mbkr_errors(vec: dict[str, Any], ref) -> dict[str, Any]:
    """Relative errors of one vectorised MBKR point against the reference.

    Args:
      vec: per-point values: ``raw_latency_s``, ``feasible``, ``peak_mem_bytes_per_stage [N]``,
        ``kv_peak_bytes_per_stage [N]``, ``spilled_bytes``, ``blocking_s``.
      ref: the :class:`~mocap_jax.validation.reference_mbkr.MBKRReferenceResult`.

    Returns:
      ``latency`` (batch-0 latency, compared even when a side calls the point infeasible),
      ``peak_mem`` and ``kv_peak`` (largest over stages; peak KV relative to the largest
      stage peak), ``feasible_match``, ``spilled`` (the reference spilled), and the
      spilled-bytes and blocking relative differences.
    """
    n = len(ref.placement)
    lat_v, lat_r = float(vec["raw_latency_s"]), float(ref.batch_latency_s)
    pm_v = np.asarray(vec["peak_mem_bytes_per_stage"], np.float64)[:n]
    kv_v = np.asarray(vec["kv_peak_bytes_per_stage"], np.float64)[:n]
    kv_scale = max(float(ref.kv_peak_bytes_per_stage.max()), 1.0)
    spill_v, spill_r = float(vec["spilled_bytes"]), float(ref.spilled_bytes)
    block_v, block_r = float(vec["blocking_s"]), float(ref.blocking_s)
    return dict(
        latency=abs(lat_v - lat_r) / lat_r,
        peak_mem=float(np.max(np.abs(pm_v - ref.peak_mem_bytes_per_stage) / ref.peak_mem_bytes_per_stage)),
        kv_peak=float(np.max(np.abs(kv_v - ref.kv_peak_bytes_per_stage)) / kv_scale),
        feasible_match=bool(vec["feasible"]) == bool(ref.feasible),
        spilled=spill_r > 0,
        spilled_rel_diff=abs(spill_v - spill_r) / max(spill_r, 1.0),
        blocking_rel_diff=abs(block_v - block_r) / max(block_r, 1e-12) if (block_r > 0 or block_v > 0) else 0.0,
    )


def _stats(values: list[float]) -> tuple[float, float]:
    return (float(np.mean(values)), float(np.max(values))) if values else (0.0, 0.0)


def run_mbkr_agreement(configs: int = 1000, seed: int = 0, dtype: str = "float64", group_size: int = 10,
                       config_list: list[MBKRAgreementConfig] | None = None, keep_rows: bool = False,
                       **sample_kw) -> dict[str, Any]:
    """The array program's MBKR against the event-driven reference over random configurations.

    The array side runs one :func:`mocap_jax.simulate_batch` call per group of configurations
    (:func:`sample_mbkr_configs`), i.e. one compiled program per (stage bucket, chunk bucket,
    batches, static/dynamic pairing); the reference
    (:class:`~mocap_jax.validation.reference_mbkr.MBKRReferenceSimulator`) runs each one.
    Errors are relative: batch-0 prefill latency (the timeline's, also for configurations a
    side calls infeasible), per-stage peak memory and peak KV (the largest over stages).

    Args:
      configs: number of random configurations (ignored when ``config_list`` is given).
      seed: seed of the configuration generator.
      dtype: precision of the array program (``"float64"`` needs ``jax_enable_x64``).
      group_size: configurations per vectorised call (must match how ``config_list`` is grouped).
      config_list: explicit configurations (grouped by their ``group`` field).
      keep_rows: also return every configuration's errors (``rows``).
      **sample_kw: passed to :func:`sample_mbkr_configs`.

    Returns:
      A dict: ``dtype``, ``seed``, ``configs``; ``spilling_configs`` and ``spilling_share`` (the
      reference spilled); ``infeasible_configs`` (reference); ``feasible_mismatches`` and
      ``mismatched`` (up to 10 descriptions); ``latency_rel_err_mean``/``_max``,
      ``peak_mem_rel_err_mean``/``_max``, ``kv_peak_rel_err_mean``/``_max`` over every
      configuration, the same over spilling configurations (``spilling_*``) and over those both
      sides call feasible (``feasible_*``; ``feasible_configs``, ``spilling_feasible_configs``), the largest
      over non-spilling ones (``no_spill_max_rel_err``: these must agree exactly);
      ``worst_latency``/``worst_peak_mem`` (descriptions); ``by_pairing``; ``target_mean``,
      ``target_max`` and ``within_target``; ``reference_wall_s``, ``vectorised_wall_s``, ``wall_s``.
    """
    from .reference import reference_simulate

    _check_dtype(dtype)
    t_start = time.perf_counter()
    cfgs = config_list if config_list is not None else sample_mbkr_configs(configs, seed, group_size, **sample_kw)
    groups: dict[int, list[MBKRAgreementConfig]] = {}
    for c in cfgs:
        groups.setdefault(c.group, []).append(c)
    rows = []
    ref_wall = vec_wall = 0.0
    for gid, group in groups.items():
        size = max(group_size, len(group))
        t0 = time.perf_counter()
        vec = _mbkr_vectorised(group, dtype, size)
        vec_wall += time.perf_counter() - t0
        for i, cfg in enumerate(group):
            t1 = time.perf_counter()
            ref = reference_simulate(cfg.model, cfg.hardware, **cfg.kwargs())
            ref_wall += time.perf_counter() - t1
            errs = mbkr_errors({k: v[i] for k, v in vec.items()}, ref)
            errs.update(cfg=cfg, ref_feasible=bool(ref.feasible), vec_feasible=bool(vec["feasible"][i]))
            rows.append(errs)
    lat = [r["latency"] for r in rows]
    pm = [r["peak_mem"] for r in rows]
    kvp = [r["kv_peak"] for r in rows]
    sp = [r for r in rows if r["spilled"]]
    nsp = [r for r in rows if not r["spilled"]]
    worst_lat = max(rows, key=lambda r: r["latency"]) if rows else None
    worst_pm = max(rows, key=lambda r: r["peak_mem"]) if rows else None
    by_pairing = {}
    for p in MBKR_PAIRINGS:
        rp = [r for r in rows if r["cfg"].pairing == p]
        if not rp:
            continue
        lm, lx = _stats([r["latency"] for r in rp])
        pmm, pmx = _stats([r["peak_mem"] for r in rp])
        by_pairing[p] = dict(configs=len(rp), spilling=sum(r["spilled"] for r in rp), latency_rel_err_mean=lm,
                             latency_rel_err_max=lx, peak_mem_rel_err_mean=pmm, peak_mem_rel_err_max=pmx,
                             feasible_mismatches=sum(not r["feasible_match"] for r in rp))
    lm, lx = _stats(lat)
    pmm, pmx = _stats(pm)
    km, kx = _stats(kvp)
    slm, slx = _stats([r["latency"] for r in sp])
    spm, spx = _stats([r["peak_mem"] for r in sp])
    both = [r for r in rows if r["ref_feasible"] and r["vec_feasible"]]
    flm, flx = _stats([r["latency"] for r in both])
    fpm, fpx = _stats([r["peak_mem"] for r in both])
    out = dict(
        dtype=dtype, seed=seed, configs=len(rows), spilling_configs=len(sp),
        spilling_share=len(sp) / len(rows) if rows else 0.0,
        infeasible_configs=sum(not r["ref_feasible"] for r in rows),
        feasible_mismatches=sum(not r["feasible_match"] for r in rows),
        mismatched=[r["cfg"].describe() + f" (array feasible={r['vec_feasible']}, reference {r['ref_feasible']})"
                    for r in rows if not r["feasible_match"]][:10],
        latency_rel_err_mean=lm, latency_rel_err_max=lx, peak_mem_rel_err_mean=pmm, peak_mem_rel_err_max=pmx,
        kv_peak_rel_err_mean=km, kv_peak_rel_err_max=kx,
        spilling_latency_rel_err_mean=slm, spilling_latency_rel_err_max=slx,
        spilling_peak_mem_rel_err_mean=spm, spilling_peak_mem_rel_err_max=spx,
        feasible_configs=len(both), spilling_feasible_configs=sum(r["spilled"] for r in both),
        feasible_latency_rel_err_mean=flm, feasible_latency_rel_err_max=flx,
        feasible_peak_mem_rel_err_mean=fpm, feasible_peak_mem_rel_err_max=fpx,
        no_spill_max_rel_err=max([max(r["latency"], r["peak_mem"]) for r in nsp], default=0.0),
        worst_latency=worst_lat["cfg"].describe() if worst_lat else "",
        worst_peak_mem=worst_pm["cfg"].describe() if worst_pm else "",
        by_pairing=by_pairing, target_mean=MBKR_TARGET_MEAN, target_max=MBKR_TARGET_MAX,
        within_target=bool(lm <= MBKR_TARGET_MEAN and lx <= MBKR_TARGET_MAX and pmm <= MBKR_TARGET_MEAN
                           and pmx <= MBKR_TARGET_MAX),
        reference_wall_s=ref_wall, vectorised_wall_s=vec_wall, wall_s=time.perf_counter() - t_start,
    )
    if keep_rows:
        out["rows"] = rows
    return out


def tolerance(dtype: str) -> float:
    """The agreement the project promises: 1e-9 relative in float64, 1e-4 in float32."""
    return 1e-9 if dtype == "float64" else 1e-4


__all__ = ["AGREEMENT_MESHES", "AGREEMENT_MODELS", "METRICS", "AgreementConfig", "AgreementReport", "compare",
           "random_partition", "run_reference_agreement", "sample_config", "sample_configs", "tolerance",
           "MBKR_PAIRINGS", "MBKR_TARGET_MEAN", "MBKR_TARGET_MAX", "MBKRAgreementConfig", "mbkr_errors",
           "run_mbkr_agreement", "sample_mbkr_configs"]
