"""Agreement of the vectorised evaluator with the event-driven reference where their semantics are identical.

:func:`sample_configs` draws random configurations: dense and MoE presets; meshes of 4 to 32 dies
(two wafers included), all dies or a random subset of them as stages, snake or random stage-to-die
maps; GPipe, TeraPipe with random partitions, TeraPipe plans of several request groups with their
own slicings, and MBKR without pairing (which is exactly the plain result); both admission modes
and release policies; 1-3 batches; a share of them long and large enough not to fit.
:func:`run_reference_agreement` runs each through the vectorised evaluator (float32 or float64)
and the reference, and reports the largest relative disagreement per metric
(:data:`METRICS`) and the feasibility mismatches.  MBKR spills, where the array program
approximates, are compared by :mod:`mocap_jax.validation.agreement_mbkr`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..specs import LIMITS, checks, get_hardware, get_model
from .reference import reference_run
from .reference.items import scheme_groups
from .reference.spill import MBKRSettings

#: models drawn from (dense and MoE presets of different depths and widths)
AGREEMENT_MODELS = ("llama3.1-8b", "llama3-70b", "mistral-large-123b", "qwen3-30b-a3b", "qwen3-235b-a22b",
                    "mixtral-8x22b")
#: meshes drawn from: 4, 8, 16 dies, and two wafers side by side (32 dies)
AGREEMENT_MESHES = ("mocap-2x2", "mocap-2x4", "mocap-4x4", "mocap-4x4x2w")
#: metrics compared, in report order
METRICS = ("finish_times", "start_times", "raw_latency_s", "peak_mem_bytes_per_stage", "kv_peak_bytes_per_stage",
           "throughput_rps", "period_s", "bubble_fraction")
#: the largest relative disagreement promised where the semantics are identical
TOLERANCE = {"float64": 1e-9, "float32": 1e-4}


@dataclass(frozen=True)
class AgreementConfig:
    """One configuration both simulators run.

    Attributes:
      model, hardware: preset names.
      seq_len: prompt tokens per request.
      scheme: ``terapipe``, ``gpipe`` or ``mbkr`` (MBKR configurations carry their settings).
      batch: requests per batch.
      partition: chunk sizes of a chunked scheme with one group (None otherwise).
      groups: ``((requests, (tokens, ...)), ...)`` of a TeraPipe plan (None otherwise).
      microbatch: requests per GPipe microbatch.
      release, admission, num_batches: policies and batches run back to back.
      placement: die of each stage (None: the snake order over every die).
      pairing, p1, p2, read_overlap, spill: MBKR settings (scheme ``mbkr``).
    """

    model: str
    hardware: str
    seq_len: int
    scheme: str
    batch: int
    partition: tuple[int, ...] | None = None
    groups: tuple[tuple[int, tuple[int, ...]], ...] | None = None
    microbatch: int = 1
    release: str = "stage"
    admission: str = "streaming"
    num_batches: int = 1
    placement: tuple[int, ...] | None = None
    pairing: str = "none"
    p1: float = 0.0
    p2: float = 0.85
    read_overlap: float = 0.5
    spill: str = "overflow"

    @property
    def mbkr(self) -> MBKRSettings | None:
        if self.scheme != "mbkr":
            return None
        return MBKRSettings(self.pairing, self.p1, self.p2, self.read_overlap, self.spill)

    def request_groups(self) -> list:
        """One batch's request groups, ``[(requests, [tokens, ...]), ...]``."""
        if self.groups is not None:
            return [(b, list(c)) for b, c in self.groups]
        return scheme_groups(self.scheme, self.seq_len, self.batch, list(self.partition or ()), self.microbatch)

    def describe(self) -> str:
        what = (f" groups={[(b, list(c)) for b, c in self.groups]}" if self.groups is not None else
                f" partition={list(self.partition)}" if self.partition is not None else
                f" microbatch={self.microbatch}")
        mb = (f" pairing={self.pairing} p1={self.p1:.3f} p2={self.p2:.3f} read_overlap={self.read_overlap:.3f} "
              f"spill={self.spill}") if self.scheme == "mbkr" else ""
        place = "" if self.placement is None else f" placement={list(self.placement)}"
        return (f"{self.model} on {self.hardware}: S={self.seq_len} {self.scheme} B={self.batch}{what} "
                f"release={self.release} admission={self.admission} num_batches={self.num_batches}{mb}{place}")


def reference(cfg: AgreementConfig):
    """The reference run of a configuration."""
    return reference_run(cfg.model, cfg.hardware, cfg.request_groups(), release=cfg.release,
                         admission=cfg.admission, num_batches=cfg.num_batches,
                         placement=None if cfg.placement is None else list(cfg.placement), mbkr=cfg.mbkr)


def vectorised(cfg: AgreementConfig, dtype: str, timeline: bool = False):
    """The vectorised evaluation of a configuration (:class:`mocap_jax.api.SimResult`; with the
    occupancy timeline if ``timeline``)."""
    from ..api import resolve
    from ..api.simulate import run
    from ..schedule.items import item_table, pad_items
    from ..schedule.shape import bucket

    placement = None if cfg.placement is None else list(cfg.placement)
    stages = None if placement is None else len(placement)
    common = dict(release=cfg.release, admission=cfg.admission, num_batches=cfg.num_batches, placement=placement,
                  stages=stages, dtype=dtype, pairing=cfg.pairing, p1=cfg.p1, p2=cfg.p2,
                  read_overlap=cfg.read_overlap, spill=cfg.spill)
    if cfg.groups is None:
        part = None if cfg.partition is None else list(cfg.partition)
        c = resolve(cfg.model, cfg.hardware, cfg.seq_len, cfg.scheme, batch=cfg.batch, partition=part,
                    microbatch=cfg.microbatch, **common)
        return run(c, timeline=timeline)
    c = resolve(cfg.model, cfg.hardware, cfg.seq_len, cfg.scheme, chunks=1, batch=cfg.batch, **common)
    tokens = np.concatenate([np.asarray(t, np.int64) for _, t in cfg.groups])
    lengths = [len(t) for _, t in cfg.groups]
    requests = np.repeat([b for b, _ in cfg.groups], lengths)
    slots = bucket(len(tokens))
    table = pad_items(item_table(tokens, requests, np.repeat(np.arange(len(lengths)), lengths)), slots)
    return run(c, timeline=timeline, items=(table, slots))


# --------------------------------------------------------------------------- sampling


def random_partition(rng: np.random.Generator, seq_len: int, chunks: int) -> tuple[int, ...]:
    """A random composition of ``seq_len`` into ``min(chunks, seq_len)`` positive parts."""
    chunks = min(chunks, seq_len)
    cuts = np.sort(rng.choice(np.arange(1, seq_len), size=chunks - 1, replace=False)) if chunks > 1 else []
    return tuple(int(x) for x in np.diff(np.concatenate([[0], cuts, [seq_len]])))


def weights_fit(model: str, hardware: str, stages: int) -> bool:
    """Whether every stage's weights fit a die (the API refuses configurations that do not)."""
    from .. import costs

    m, hw = get_model(model), get_hardware(hardware)
    if stages > m.layers:
        return False
    w = costs.stage_weight_bytes(costs.ModelParams.from_spec(m, np.float64),
                                 costs.HardwareParams.from_spec(hw, np.float64), stages, stages, xp=np)
    return bool(np.max(w) < hw.hbm_capacity * hw.usable_hbm_fraction)


def random_placement(rng: np.random.Generator, hardware: str, subset: float = 0.2,
                     shuffle: float = 0.25) -> tuple[int, ...] | None:
    """None (snake over every die), a random map of every die, or a random subset of the dies in random order."""
    dies = get_hardware(hardware).num_dies
    u = rng.random()
    if u < subset:
        return tuple(int(x) for x in rng.permutation(dies)[: int(rng.integers(2, dies + 1))])
    if u < subset + shuffle:
        return tuple(int(x) for x in rng.permutation(dies))
    return None


def sample_config(rng: np.random.Generator, models=AGREEMENT_MODELS, meshes=AGREEMENT_MESHES, schemes=None,
                  max_chunks: int = 16) -> AgreementConfig:
    """One random configuration (see the module docstring); ``schemes`` restricts the kinds drawn from
    (``terapipe``, ``gpipe``, ``plan``: several groups, ``mbkr``: MBKR without pairing)."""
    kinds = ("terapipe", "gpipe", "plan", "mbkr") if schemes is None else tuple(schemes)
    weights = np.array([{"terapipe": 0.4, "gpipe": 0.25, "plan": 0.25, "mbkr": 0.1}[k] for k in kinds])
    while True:
        model, hardware = str(rng.choice(models)), str(rng.choice(meshes))
        placement = random_placement(rng, hardware)
        stages = get_hardware(hardware).num_dies if placement is None else len(placement)
        if weights_fit(model, hardware, stages):
            break
    kind = str(rng.choice(kinds, p=weights / weights.sum()))
    if rng.random() < 0.25:    # memory stress: long prompts, large batches (many do not fit)
        seq_len, batch = int(round(2 ** rng.uniform(15, 18))), int(round(2 ** rng.uniform(3, 6)))
    else:
        seq_len, batch = int(round(2 ** rng.uniform(8, 17))), int(round(2 ** rng.uniform(0, 4)))
    common = dict(model=model, hardware=hardware, seq_len=seq_len, batch=batch,
                  release=str(rng.choice(["stage", "request"])), admission=str(rng.choice(["streaming", "synchronous"])),
                  num_batches=int(rng.integers(1, 4)), placement=placement)
    if kind == "gpipe":
        micro = int(rng.integers(-(-batch // max_chunks), batch + 1))
        return AgreementConfig(scheme="gpipe", microbatch=micro, **common)
    if kind == "plan":
        count = int(rng.integers(1, min(batch, 4) + 1))
        cuts = np.sort(rng.choice(np.arange(1, batch), size=count - 1, replace=False)) if count > 1 else []
        sizes = np.diff(np.concatenate([[0], cuts, [batch]]))
        per = max(max_chunks // count, 1)
        groups = tuple((int(b), random_partition(rng, seq_len, int(rng.integers(1, per + 1)))) for b in sizes)
        return AgreementConfig(scheme="terapipe", groups=groups, **common)
    partition = random_partition(rng, seq_len, int(rng.integers(1, max_chunks + 1)))
    return AgreementConfig(scheme="mbkr" if kind == "mbkr" else "terapipe", partition=partition, **common)


def check_configs(name: str, n: Any, lo: int = 1) -> int:
    """``n`` configurations to run through the event-driven reference, as an int in
    ``[lo, LIMITS["reference_configs"]]``."""
    return checks.integer(name, n, lo, LIMITS["reference_configs"],
                          above=" The reference takes milliseconds per configuration; split a larger check into "
                                "runs with different seeds.")


def sample_configs(n: int, seed: int = 0, **kw) -> list[AgreementConfig]:
    """``n`` configurations from a seeded generator (same seed, same list)."""
    n = check_configs("configs", n)
    rng = np.random.default_rng(seed)
    return [sample_config(rng, **kw) for _ in range(n)]


# --------------------------------------------------------------------------- comparison


def relative_error(got, want, floor) -> float:
    """Largest ``|got - want| / max(|want|, floor)`` (equal infinities agree; NaN is infinitely wrong)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        raise ValueError(f"shape mismatch: vectorised {got.shape} vs reference {want.shape}")
    with np.errstate(invalid="ignore", divide="ignore"):
        err = np.abs(got - want) / np.maximum(np.abs(want), floor)
    err = np.where(got == want, 0.0, err)
    return float(np.nan_to_num(err, nan=np.inf).max(initial=0.0))


def compare(vec, ref) -> dict[str, Any]:
    """Relative errors of one vectorised result against the reference of the same configuration.

    Per-stage KV peaks are relative to the largest KV an item writes on the stage (a peak may be 0);
    start times to the finish of the run; the bubble fraction (``1 - work / (stages x latency)``,
    whose rounding is absolute, about an ulp of 1: exactly 0 on one stage) to at least 1%.  Throughput is compared only when both sides agree on
    feasibility (``feasible_match``), since it is 0 for an infeasible point.
    """
    kv_scale = np.maximum(ref.kv_bytes.max(axis=0), 1.0)
    floors = {"finish_times": 1e-300, "start_times": float(ref.finish_times.max()), "raw_latency_s": 1e-300,
              "peak_mem_bytes_per_stage": 1.0, "kv_peak_bytes_per_stage": kv_scale, "throughput_rps": 1e-300,
              "period_s": 1e-300, "bubble_fraction": 1e-2}
    match = bool(vec.feasible) == bool(ref.feasible)
    out = {m: relative_error(getattr(vec, m), getattr(ref, m), floors[m]) for m in METRICS}
    if not match:
        out["throughput_rps"] = 0.0
    out["feasible_match"] = match
    out["capacity_margin"] = float(np.min(np.abs(ref.peak_mem_bytes_per_stage - ref.capacity_bytes))
                                   / ref.capacity_bytes)
    return out


@dataclass
class AgreementReport:
    """Largest errors per metric over configurations, and the configuration that set each."""

    dtype: str
    max_rel_err: dict[str, float] = field(default_factory=lambda: {m: 0.0 for m in METRICS})
    worst: dict[str, str] = field(default_factory=dict)
    configs: int = 0
    infeasible_configs: int = 0
    feasible_mismatches: int = 0
    mismatched: list[str] = field(default_factory=list)

    def add(self, cfg: AgreementConfig, errs: dict[str, Any], ref_feasible: bool) -> None:
        self.configs += 1
        self.infeasible_configs += int(not ref_feasible)
        if not errs["feasible_match"]:
            self.feasible_mismatches += 1
            self.mismatched.append(f"{cfg.describe()} (capacity margin {errs['capacity_margin']:.1e})")
        for m in METRICS:
            if errs[m] > self.max_rel_err[m]:
                self.max_rel_err[m] = errs[m]
                self.worst[m] = cfg.describe()

    def as_dict(self) -> dict[str, Any]:
        return dict(dtype=self.dtype, configs=self.configs, max_rel_err=dict(self.max_rel_err),
                    overall_max_rel_err=max(self.max_rel_err.values()), worst=dict(self.worst),
                    infeasible_configs=self.infeasible_configs, feasible_mismatches=self.feasible_mismatches,
                    mismatched=self.mismatched[:10], tolerance=TOLERANCE[self.dtype])


def check_dtype(dtype: str) -> None:
    """Refuse anything but float32, or float64 without 64-bit JAX."""
    from ..specs import SpecError

    if dtype not in TOLERANCE:
        raise SpecError(f"dtype must be 'float32' or 'float64', got {dtype!r}")
    if dtype == "float64":
        import jax

        if not jax.config.jax_enable_x64:
            raise SpecError("float64 agreement needs 64-bit JAX: set JAX_ENABLE_X64=1 or "
                            "jax.config.update('jax_enable_x64', True) first")


def run_reference_agreement(configs: int = 200, seed: int = 0, dtype: str = "float32",
                            config_list: list[AgreementConfig] | None = None) -> dict[str, Any]:
    """Run configurations through both simulators and report the largest disagreement per metric.

    Args:
      configs: random configurations (ignored when ``config_list`` is given).
      seed: seed of the generator.
      dtype: precision of the vectorised evaluator (the reference always runs in float64).
      config_list: explicit configurations.

    Returns:
      ``dtype``, ``configs``, ``max_rel_err`` per metric, ``overall_max_rel_err``, ``worst`` (the
      configuration of each maximum), ``infeasible_configs`` (reference), ``feasible_mismatches``
      and ``mismatched`` (with each one's distance of a peak from the capacity), ``tolerance``,
      ``within_tolerance``, ``seed``, ``reference_wall_s``, ``vectorised_wall_s``.
    """
    check_dtype(dtype)
    cfgs = config_list if config_list is not None else sample_configs(configs, seed)
    report = AgreementReport(dtype=dtype)
    ref_wall = vec_wall = 0.0
    for cfg in cfgs:
        t0 = time.perf_counter()
        ref = reference(cfg)
        t1 = time.perf_counter()
        vec = vectorised(cfg, dtype)
        vec_wall += time.perf_counter() - t1
        ref_wall += t1 - t0
        report.add(cfg, compare(vec, ref), ref.feasible)
    out = report.as_dict()
    out.update(within_tolerance=bool(out["overall_max_rel_err"] <= TOLERANCE[dtype]
                                     and (dtype == "float32" or out["feasible_mismatches"] == 0)),
               seed=seed, reference_wall_s=ref_wall, vectorised_wall_s=vec_wall)
    return out


__all__ = ["AGREEMENT_MESHES", "AGREEMENT_MODELS", "METRICS", "TOLERANCE", "AgreementConfig", "AgreementReport",
           "check_dtype", "compare", "random_partition", "random_placement", "reference", "relative_error",
           "run_reference_agreement", "sample_config", "sample_configs", "vectorised", "weights_fit"]
