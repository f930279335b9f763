"""Resource partition: instance shapes, TP strategies and prefill/decode counts.

1. Enumerate every rectangular instance shape that fits the wafer (both orientations
   count as one shape on a mesh) and every TP strategy in the given set.
2. Evaluate, in one ``jit(vmap)`` call over all candidates, the per-die goodput of a
   prefill instance and of a decode instance on the workload
   (:func:`mocap_jax.wsc.goodput.instance_goodput`).
3. Pick the best candidate of each phase (highest goodput per die; ties go to fewer
   dies, then to the earlier strategy in the list).
4. Size the counts: among all ``(n_prefill, n_decode) >= 1`` that fit the dies, take
   the one with the highest served rate ``min(n_p x r_p, n_d x r_d)`` (both phases
   keep pace), then fewest dies, that can actually be packed as non-overlapping
   rectangles (:func:`mocap_jax.wsc.placement.pack_instances`, exact).

Goodput per die is :mod:`mocap_jax.wsc.goodput`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..specs import ModelSpec, SpecError, checks, get_model
from .goodput import ServingTargets, goodput_batch
from .hardware import WaferParams, WaferSpec, get_wafer
from .layout import pack_instances
from .plan import STRATEGIES, InstanceConfig, model_params, stack_plans, tp_plan
from .traces import get_workload
from .workload import WorkloadParams, WorkloadSpec

#: largest decode batch a search considers: every batch up to it is evaluated for every instance plan
#: and hardware point of a call at once (about 18 KB per batch there: 300 MB at this bound)
MAX_DECODE_BATCH = 16384

Array = Any


# --------------------------------------------------------------------------- enumeration


def instance_shapes(wafer: WaferSpec, max_dies: int | None = None) -> list[tuple[int, int]]:
    """Rectangular instance shapes that fit the wafer, one per shape up to rotation on a mesh.

    On a cluster (rows = nodes): ``1 x k`` inside one node, and whole nodes ``r x cols``.
    """
    shapes = []
    if wafer.is_mesh:
        for h in range(1, wafer.rows + 1):
            for w in range(1, wafer.cols + 1):
                if h > w and w <= wafer.rows and h <= wafer.cols:
                    continue  # its rotation (w x h) is already listed
                shapes.append((h, w))
    else:
        shapes = [(1, k) for k in range(1, wafer.cols + 1)] + [(r, wafer.cols) for r in range(2, wafer.rows + 1)]
    if max_dies is not None:
        shapes = [s for s in shapes if s[0] * s[1] <= max_dies]
    return sorted(shapes, key=lambda s: (s[0] * s[1], s))


@dataclass
class Candidate:
    """One (shape, strategy) evaluated as prefill and as decode instance."""

    config: InstanceConfig
    prefill_fits: bool
    prefill_rps: float
    prefill_rps_per_die: float
    prefill_iter_s: float
    ttft_s: float
    decode_fits: bool
    decode_rps: float
    decode_rps_per_die: float
    decode_batch: int
    tpot_s: float
    decode_batch_slo: int
    weight_gb_per_die: float
    kv_tokens_capacity: float

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.update(rows=self.config.rows, cols=self.config.cols, strategy=self.config.strategy, dies=self.config.dies)
        del d["config"]
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


@dataclass
class PartitionResult:
    """Outcome of :func:`partition` (see the module docstring)."""

    wafer: str
    model: str
    workload: str
    offered_rps: float
    strategies: tuple[str, ...]
    candidates: list[Candidate]
    prefill: Candidate
    decode: Candidate
    n_prefill: int
    n_decode: int
    prefill_capacity_rps: float
    decode_capacity_rps: float
    served_rps: float
    dies_used: int
    dies_total: int
    min_prefill_for_rate: int
    min_decode_for_rate: int
    meets_rate: bool
    packing: list[tuple[str, int, int, int, int]] = field(default_factory=list)  # (kind, row, col, rows, cols)
    runtime_s: float = 0.0
    evaluate_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in ("wafer", "model", "workload", "offered_rps", "n_prefill", "n_decode",
                                            "prefill_capacity_rps", "decode_capacity_rps", "served_rps",
                                            "dies_used", "dies_total", "min_prefill_for_rate", "min_decode_for_rate",
                                            "meets_rate", "runtime_s", "evaluate_s")}
        d["strategies"] = list(self.strategies)
        d["prefill"] = self.prefill.to_dict()
        d["decode"] = self.decode.to_dict()
        d["packing"] = [dict(kind=k, row=r, col=c, rows=h, cols=w) for k, r, c, h, w in self.packing]
        d["candidates"] = [c.to_dict() for c in self.candidates]
        return d


def _pick(cands: list[Candidate], key: str, strategies: Sequence[str]) -> Candidate | None:
    ok = [c for c in cands if getattr(c, key) > 0]
    if not ok:
        return None
    return max(ok, key=lambda c: (getattr(c, key), -c.config.dies, -strategies.index(c.config.strategy)))


def size_counts(wafer: WaferSpec, prefill: tuple[int, int], prefill_rps: float, decode: tuple[int, int],
                decode_rps: float, node_budget: int = 200_000):
    """Instance counts that maximise ``min(n_p r_p, n_d r_d)`` and can be packed on the wafer.

    Returns:
      (n_prefill, n_decode, packing) with packing a list of ``(kind, row, col, rows, cols)``.

    Raises:
      SpecError: not even one instance of each phase can be packed.
    """
    a_p, a_d = prefill[0] * prefill[1], decode[0] * decode[1]
    d = wafer.num_dies
    options = []
    for n_p in range(1, d // a_p + 1):
        for n_d in range(1, (d - n_p * a_p) // a_d + 1):
            options.append((min(n_p * prefill_rps, n_d * decode_rps), n_p * a_p + n_d * a_d, n_p, n_d))
    options.sort(key=lambda o: (-o[0], o[1], -o[3]))
    for _, _, n_p, n_d in options:
        placed = pack_instances(wafer.rows, wafer.cols, [(prefill, n_p), (decode, n_d)],
                                allow_rotation=wafer.is_mesh, node_budget=node_budget)
        if placed is not None:
            kinds = ("prefill", "decode")
            return n_p, n_d, [(kinds[i], r, c, h, w) for i, r, c, h, w in placed]
    raise SpecError(f"cannot place one {prefill[0]}x{prefill[1]} prefill and one {decode[0]}x{decode[1]} decode "
                    f"instance together on the {wafer.rows}x{wafer.cols} grid of {wafer.name}; use a larger wafer")


def evaluate_candidates(model: ModelSpec, wafer: WaferSpec, workload: WorkloadSpec, targets: ServingTargets,
                        strategies: Sequence[str] = STRATEGIES, max_batch: int = 512,
                        shapes: Sequence[tuple[int, int]] | None = None, dtype=jnp.float32) -> list[Candidate]:
    """Evaluate every (shape, strategy) candidate in one vmapped call."""
    return evaluate_candidates_many(model, [wafer], workload, targets, strategies, max_batch, shapes, dtype)[0]


def evaluate_candidates_many(model: ModelSpec, wafers: Sequence[WaferSpec], workload: WorkloadSpec,
                             targets: ServingTargets, strategies: Sequence[str] = STRATEGIES, max_batch: int = 512,
                             shapes: Sequence[tuple[int, int]] | None = None,
                             dtype=jnp.float32) -> list[list[Candidate]]:
    """Candidates of several hardware points of one grid and topology: one ``jit(vmap(vmap))`` call.

    The instance plans depend only on the grid's topology, so they are shared; the hardware
    numbers are a batch ``[H]``.  Both batches are padded (plans to a multiple of 128, hardware to
    a multiple of 16) so that grids and sweeps of different sizes share one compiled program: a
    call takes a few milliseconds, a compile most of a second (the default exploration's two grids
    have 64 and 128 plans once padded to 64).
    Returns one candidate list per wafer.
    """
    checks.integer("max_batch", max_batch, 1, MAX_DECODE_BATCH, above=" Decode batches are searched up to it; give a "
                   "realistic bound (default 512).")
    wafers = list(wafers)
    first = wafers[0]
    if any((w.rows, w.cols, w.topology) != (first.rows, first.cols, first.topology) for w in wafers):
        raise SpecError("evaluate_candidates_many: every wafer must have the same grid and topology")
    shapes = instance_shapes(first) if shapes is None else list(shapes)
    configs = [InstanceConfig(h, w, s) for (h, w) in shapes for s in strategies]
    plans = [tp_plan(model, first, c, dtype) for c in configs]
    plans = stack_plans(plans + [plans[-1]] * (-len(plans) % 128))
    hws = [WaferParams.from_spec(w, dtype) for w in wafers]
    hw = jax.tree_util.tree_map(lambda *xs: np.stack(xs), *(hws + [hws[-1]] * (-len(hws) % 16)))
    out = goodput_batch(model_params(model, dtype), hw, plans, WorkloadParams.from_spec(workload, dtype), targets,
                         max_batch)
    out = jax.tree_util.tree_map(np.asarray, out)
    return [[
        Candidate(config=c, prefill_fits=bool(out["prefill_fits"][h, i]), prefill_rps=float(out["prefill_rps"][h, i]),
                  prefill_rps_per_die=float(out["prefill_rps_per_die"][h, i]),
                  prefill_iter_s=float(out["prefill_iter_s"][h, i]), ttft_s=float(out["ttft_s"][h, i]),
                  decode_fits=bool(out["decode_fits"][h, i]), decode_rps=float(out["decode_rps"][h, i]),
                  decode_rps_per_die=float(out["decode_rps_per_die"][h, i]),
                  decode_batch=int(out["decode_batch"][h, i]), tpot_s=float(out["tpot_s"][h, i]),
                  decode_batch_slo=int(out["decode_batch_slo"][h, i]),
                  weight_gb_per_die=float(out["weight_bytes_per_die"][h, i]) / 1e9,
                  kv_tokens_capacity=float(out["kv_tokens_capacity"][h, i]))
        for i, c in enumerate(configs)] for h in range(len(wafers))]


def validate_strategies(strategies: Sequence[str]) -> tuple[str, ...]:
    strategies = tuple(strategies)
    if not strategies:
        raise SpecError(f"give at least one TP strategy ({', '.join(STRATEGIES)})")
    bad = [s for s in strategies if s not in STRATEGIES]
    if bad:
        raise SpecError(f"unknown TP strategy {bad[0]!r}; choose from {', '.join(STRATEGIES)}")
    return tuple(dict.fromkeys(strategies))


def _packable_pair(wafer: WaferSpec, cands: list[Candidate], strategies: Sequence[str], tries: int = 6):
    """The best (prefill, decode) candidates whose instances can be packed together, with their counts.

    Candidates are ranked by goodput per die; when the best pair cannot share the grid, the
    pairs of the ``tries`` best of each phase are tried in order of their summed ranks, then every
    other pair in the same order: the best candidates may all be too large to share the grid where
    smaller ones fit (a model that needs most of a die's DRAM for its weights), and a pair that
    cannot be packed is a property of its two shapes, so each pair of shapes is tried once.
    """
    rank = lambda key: sorted([c for c in cands if getattr(c, key) > 0],
                              key=lambda c: (-getattr(c, key), c.config.dies, strategies.index(c.config.strategy)))
    pre, dec = rank("prefill_rps_per_die"), rank("decode_rps_per_die")
    pairs = sorted((i + j, i, j) for i in range(len(pre)) for j in range(len(dec)))
    first = [q for q in pairs if q[1] < tries and q[2] < tries]
    refused = set()
    for _, i, j in first + [q for q in pairs if q[1] >= tries or q[2] >= tries]:
        p, d = pre[i], dec[j]
        shapes = ((p.config.rows, p.config.cols), (d.config.rows, d.config.cols))
        if shapes in refused or p.config.dies + d.config.dies > wafer.num_dies:
            continue
        try:
            return p, d, size_counts(wafer, shapes[0], p.prefill_rps, shapes[1], d.decode_rps)
        except SpecError:
            refused.add(shapes)
    small_p, small_d = min(pre, key=lambda c: c.config.dies), min(dec, key=lambda c: c.config.dies)
    dies, larger = ("dies", "a larger wafer or dies with more DRAM") if wafer.is_mesh else \
        ("GPUs", "a larger cluster or GPUs with more memory")
    raise SpecError(f"no prefill instance and decode instance that meet the SLOs can be packed together on the "
                    f"{wafer.rows}x{wafer.cols} grid of {wafer.name}: the smallest are {small_p.config.rows}x"
                    f"{small_p.config.cols} and {small_d.config.rows}x{small_d.config.cols} ("
                    f"{small_p.config.dies} + {small_d.config.dies} {dies}); use {larger}")


def choose_partition(model: ModelSpec, wafer: WaferSpec, workload: WorkloadSpec, strategies: tuple[str, ...],
                     cands: list[Candidate]) -> PartitionResult:
    """Best prefill and decode candidates (highest goodput per die) and their counts.

    Raises:
      SpecError: no feasible prefill or decode candidate, or the two cannot be packed together.
    """
    best_p = _pick(cands, "prefill_rps_per_die", strategies)
    best_d = _pick(cands, "decode_rps_per_die", strategies)
    if best_p is None or best_d is None:
        weights_gb = model.total_params * wafer.weight_bytes / 1e9
        fits_any = [c for c in cands if c.prefill_fits or c.decode_fits]
        why = ("its weights" + f" ({weights_gb:.0f} GB)" + " do not fit any rectangular instance"
               if not fits_any else "no instance meets the SLOs (TTFT / TPOT)")
        phase = "prefill" if best_p is None else "decode"
        raise SpecError(f"model {model.name} has no feasible {phase} instance on {wafer.name} "
                        f"({wafer.rows}x{wafer.cols} dies of {wafer.dram_capacity / 1e9:g} GB): {why}; use dies with "
                        f"more DRAM (--dram-gb), a larger grid, a smaller model, or looser SLOs")
    best_p, best_d, (n_p, n_d, packing) = _packable_pair(wafer, cands, strategies)
    cap_p, cap_d = n_p * best_p.prefill_rps, n_d * best_d.decode_rps
    served = min(cap_p, cap_d)
    return PartitionResult(
        wafer=wafer.name, model=model.name, workload=workload.name, offered_rps=workload.rate,
        strategies=strategies, candidates=cands, prefill=best_p, decode=best_d, n_prefill=n_p, n_decode=n_d,
        prefill_capacity_rps=cap_p, decode_capacity_rps=cap_d, served_rps=served,
        dies_used=n_p * best_p.config.dies + n_d * best_d.config.dies, dies_total=wafer.num_dies,
        min_prefill_for_rate=math.ceil(workload.rate / best_p.prefill_rps - 1e-9),
        min_decode_for_rate=math.ceil(workload.rate / best_d.decode_rps - 1e-9),
        meets_rate=served >= workload.rate, packing=packing)


def partition(model: "str | ModelSpec", wafer: "str | WaferSpec", workload: "str | WorkloadSpec" = "azure-conv",
              rate: float | None = None, strategies: Sequence[str] = STRATEGIES, chunk_tokens: int = 2048,
              tpot_slo_s: float = 0.1, ttft_slo_s: float = 10.0, max_batch: int = 512,
              max_instance_dies: int | None = None, dtype=jnp.float32) -> PartitionResult:
    """Choose prefill/decode instance shapes, TP strategies and counts for a workload.

    Args:
      model: preset name or :class:`ModelSpec`.
      wafer: WSC-LLM hardware preset name or :class:`WaferSpec`.
      workload: preset name, trace CSV path or :class:`WorkloadSpec`.
      rate: offered requests/s (default: the workload's).
      strategies: TP strategies to consider (:data:`mocap_jax.wsc.STRATEGIES`).
      chunk_tokens: prefill token budget per iteration.
      tpot_slo_s, ttft_slo_s: SLOs (seconds).
      max_batch: largest decode batch considered.
      max_instance_dies: skip shapes with more dies.

    Raises:
      SpecError (a ValueError): bad input, or a model that fits no instance of the wafer.
    """
    t0 = time.perf_counter()
    model = get_model(model)
    wafer = get_wafer(wafer)
    workload = get_workload(workload, rate)
    strategies = validate_strategies(strategies)
    targets = ServingTargets.make(chunk_tokens, tpot_slo_s, ttft_slo_s, dtype)
    checks.integer("max_batch", max_batch, 1, MAX_DECODE_BATCH, above=" Decode batches are searched up to it; give a "
                   "realistic bound (default 512).")
    if max_instance_dies is not None and (not isinstance(max_instance_dies, int) or max_instance_dies < 1):
        raise SpecError(f"max_instance_dies must be a positive integer, got {max_instance_dies!r}")
    shapes = instance_shapes(wafer, max_instance_dies)
    t1 = time.perf_counter()
    cands = evaluate_candidates(model, wafer, workload, targets, strategies, max_batch, shapes, dtype)
    t_eval = time.perf_counter() - t1
    res = choose_partition(model, wafer, workload, strategies, cands)
    return dataclasses.replace(res, runtime_s=time.perf_counter() - t0, evaluate_s=t_eval)


__all__ = [
    "instance_shapes", "Candidate", "PartitionResult",
    "evaluate_candidates", "evaluate_candidates_many", "size_counts", "choose_partition", "partition",
    "validate_strategies",
]
