"""How far the array program's MBKR is from the event-driven reference, over configurations that spill.

The array program decides spills on the previous pass's timeline and charges their costs on it;
the reference decides every spill at the item's actual start.  :func:`sample_mbkr_configs` draws
configurations near the memory limit (the batch's KV drawn around each stage's KV budget) so that
many spill, with every pairing and both spill policies; :func:`run_mbkr_agreement` evaluates each
group of them in one ``simulate_batch`` call and runs each through the reference, and reports the
mean and largest relative error of batch 0's latency and of the per-stage peak memory, and the
feasibility mismatches, against the targets :data:`TARGET_MEAN` and :data:`TARGET_MAX`.

To keep compilation bounded, the configurations share a few compiled programs: a program fixes
the stage bucket, release policy, admission, number of batches, spill program (static pairs,
dynamic, or none) and spill policy; groups drawn for one program vary model, mesh, placement,
pairing and thresholds, and their points vary batch, sequence length and partition.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..specs import get_hardware, get_model
from .agreement import AGREEMENT_MODELS, AgreementConfig, check_configs, check_dtype, reference, weights_fit

#: the approximation the array program's MBKR promises against the reference (relative)
TARGET_MEAN = 0.01
TARGET_MAX = 0.05
#: item slots of every MBKR program (2 to 16 chunks)
K_PAD = 16
#: meshes for each stage bucket (stages = the bucket or one fewer; fewer dies than the mesh has: a random subset)
MESHES_FOR_BUCKET = {4: ("mocap-2x2", "mocap-2x4"), 8: ("mocap-2x4", "mocap-4x4", "mocap-4x4x2w"),
                     16: ("mocap-4x4", "mocap-4x4x2w"), 32: ("mocap-4x4x2w",)}
PROGRAM_FIELDS = ("raw_latency_s", "feasible", "peak_mem_bytes_per_stage", "kv_peak_bytes_per_stage",
                  "spilled_bytes_per_stage", "blocking_s_per_stage", "overflow")


@dataclass(frozen=True)
class Program:
    """What one compiled MBKR program fixes: stage bucket, policies, batches, spill program and policy."""

    stages: int
    release: str
    admission: str
    num_batches: int
    mode: str          # "static", "dynamic" or "none"
    spill: str


def draw_programs(rng: np.random.Generator, count: int, buckets=(4, 8, 16, 32)) -> list[Program]:
    """``count`` distinct programs cycling through static and dynamic pairs under both spill policies;
    from five programs on, the last one runs without pairing (MBKR off: exactly the plain result)."""
    kinds = [[("static", "overflow"), ("dynamic", "overflow"), ("static", "eager"), ("dynamic", "eager")][i % 4]
             for i in range(count)]
    if count >= 5:
        kinds[-1] = ("none", "overflow")
    out: list[Program] = []
    for mode, spill in kinds:
        while True:
            p = Program(int(rng.choice(buckets)), str(rng.choice(["stage", "request"])),
                        str(rng.choice(["streaming", "synchronous"])), int(rng.integers(1, 3)), mode, spill)
            if p not in out:
                out.append(p)
                break
    return out


def fill_batch(model: str, hardware: str, stages: int, partition, fill: float) -> int:
    """Largest batch whose memory without MBKR at its last chunk (the batch's KV plus the largest
    chunk's activation buffers) is at most ``fill`` times the tightest stage's KV budget (at least 1)."""
    from .. import costs

    m, hw = get_model(model), get_hardware(hardware)
    mp, hp = costs.ModelParams.from_spec(m, np.float64), costs.HardwareParams.from_spec(hw, np.float64)
    layout = costs.StageLayout.single_die(np.asarray(stages), np.zeros(stages), np.ones(stages))
    c = np.asarray(partition, np.float64)
    last = np.arange(len(c)) == len(c) - 1
    kv = costs.stage_kv_bytes_per_token(mp, hp, stages, stages, xp=np)
    budget = hw.hbm_capacity * hw.usable_hbm_fraction - costs.stage_weight_bytes(mp, hp, stages, stages, xp=np)

    def fill_of(batch: int) -> float:
        act = costs.item_activation_bytes(mp, hp, layout, c, np.full_like(c, batch), last, stages, xp=np).max(axis=0)
        return float(np.max((batch * c.sum() * kv + act) / budget))

    lo, hi = 1, 1 << 20
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fill_of(mid) <= fill else (lo, mid - 1)
    return lo


def _placement(rng, hardware: str, stages: int, pairing: str, searched: bool) -> tuple[int, ...]:
    """A random map (of a random subset of the dies when there are more dies than stages), the
    searched MBKR placement (as the API defaults to), or the snake order."""
    from ..api.config import searched_placement
    from ..specs.mesh import snake_placement

    hw = get_hardware(hardware)
    u = rng.random()
    if u < 0.25 or (stages < hw.num_dies and u < 0.5):
        return tuple(int(x) for x in rng.permutation(hw.num_dies)[:stages])
    if searched and pairing != "none" and u < 0.8:
        static = pairing if pairing != "dynamic" else "cross-half"
        return tuple(int(x) for x in searched_placement(hw, stages, static))
    return tuple(int(x) for x in snake_placement(hw, stages))


def sample_mbkr_configs(n: int, seed: int = 0, group_size: int = 10, programs: int = 12, buckets=(4, 8, 16, 32),
                        models=AGREEMENT_MODELS, fill=(0.9, 1.25), seq_log2=(13, 18),
                        searched: bool = True) -> list[tuple[Program, list]]:
    """``n`` MBKR configurations near the memory limit, in groups of ``group_size`` sharing one call.

    Returns ``[(program, [AgreementConfig, ...]), ...]``.  Sequence lengths are log-uniform over
    ``2 ** seq_log2``; the batch is drawn for a memory ``fill`` (uniform over the range: the batch's KV
    and the largest chunk's activations over the tightest stage's KV budget, scaled down where
    streaming batches under the request policy overlap); ``searched``: allow the searched MBKR
    placement (slow to search on large meshes; otherwise snake or random maps).
    """
    from .agreement import random_partition

    n = check_configs("configs", n)
    rng = np.random.default_rng(seed)
    progs = draw_programs(rng, programs, buckets)
    out: list[tuple[Program, list]] = []
    total = 0
    while total < n:
        prog = progs[len(out) % len(progs)] if len(out) < len(progs) else progs[int(rng.integers(len(progs)))]
        model, hardware = str(rng.choice(models)), str(rng.choice(MESHES_FOR_BUCKET[prog.stages]))
        # the bucket's stage count or one fewer: an odd count leaves a static pairing's middle stage alone
        stages = prog.stages - int(rng.random() < 0.5)
        if not weights_fit(model, hardware, stages):
            continue
        pairing = {"none": "none", "dynamic": "dynamic"}.get(prog.mode) or str(rng.choice(["cross-half",
                                                                                            "head-to-tail"]))
        placement = _placement(rng, hardware, stages, pairing, searched)
        p1 = 0.0 if rng.random() < 0.7 else float(rng.uniform(0.0, 0.3))
        p2 = 0.85 if rng.random() < 0.3 else float(rng.uniform(max(p1, 0.5), 0.98))
        overlap = 0.5 if rng.random() < 0.3 else float(rng.uniform(0.0, 1.0))
        batches_overlap = prog.release == "request" and prog.admission == "streaming" and prog.num_batches > 1
        group = []
        for _ in range(min(group_size, n - total)):
            seq_len = int(round(2 ** rng.uniform(*seq_log2)))
            partition = random_partition(rng, seq_len, int(rng.integers(2, K_PAD + 1)))
            # streaming under the request policy, the next batch's first chunks overlap the last ones
            scale = 1 / (1 + min(stages - 1, len(partition)) / len(partition)) if batches_overlap else 1.0
            batch = fill_batch(model, hardware, stages, partition, scale * rng.uniform(*fill))
            group.append(AgreementConfig(
                model=model, hardware=hardware, seq_len=seq_len, scheme="mbkr", batch=batch, partition=partition, release=prog.release, admission=prog.admission,
                num_batches=prog.num_batches, placement=placement, pairing=pairing, p1=p1, p2=p2,
                read_overlap=overlap, spill=prog.spill))
        out.append((prog, group))
        total += len(group)
    return out


def vectorised_group(group: list[AgreementConfig], dtype: str, group_size: int) -> dict[str, np.ndarray]:
    """One ``simulate_batch`` call over a group (padded to ``group_size`` points: one compiled program)."""
    from ..api import simulate_batch

    c = group[0]
    pts = list(group) + [group[-1]] * (group_size - len(group))
    part = np.zeros((len(pts), K_PAD), np.int64)
    for i, p in enumerate(pts):
        part[i, : len(p.partition)] = p.partition
    out = simulate_batch(c.model, c.hardware, np.array([p.seq_len for p in pts]), "mbkr",
                         batch=np.array([p.batch for p in pts]), partition=part, release=c.release,
                         admission=c.admission, num_batches=c.num_batches, stages=len(c.placement),
                         placement=list(c.placement), dtype=dtype, block_size=group_size, k_pad=K_PAD,
                         pairing=c.pairing, p1=c.p1, p2=c.p2, read_overlap=c.read_overlap, spill=c.spill,
                         fields=PROGRAM_FIELDS)
    return {k: np.asarray(v)[: len(group)] for k, v in out.items()}


def mbkr_errors(vec: dict[str, Any], ref) -> dict[str, Any]:
    """Relative errors of one point: batch-0 latency (also where a side calls it infeasible), the
    largest per-stage peak memory error, the largest per-stage peak KV error over the largest
    reference KV peak, feasibility match, and whether the reference spilled."""
    n = len(ref.placement)
    peak = np.asarray(vec["peak_mem_bytes_per_stage"], np.float64)[:n]
    kv = np.asarray(vec["kv_peak_bytes_per_stage"], np.float64)[:n]
    return dict(latency=abs(float(vec["raw_latency_s"]) - ref.raw_latency_s) / ref.raw_latency_s,
                peak_mem=float(np.max(np.abs(peak - ref.peak_mem_bytes_per_stage) / ref.peak_mem_bytes_per_stage)),
                kv_peak=float(np.max(np.abs(kv - ref.kv_peak_bytes_per_stage))
                              / max(float(ref.kv_peak_bytes_per_stage.max()), 1.0)),
                feasible_match=bool(vec["feasible"]) == bool(ref.feasible), spilled=ref.spilled_bytes > 0,
                ref_feasible=bool(ref.feasible), vec_feasible=bool(vec["feasible"]))


def _summary(rows: list[dict]) -> dict[str, Any]:
    stat = lambda key: (float(np.mean([r[key] for r in rows])), float(np.max([r[key] for r in rows]))) \
        if rows else (0.0, 0.0)
    (lm, lx), (pm, px), (km, kx) = stat("latency"), stat("peak_mem"), stat("kv_peak")
    return dict(configs=len(rows), spilling=sum(r["spilled"] for r in rows),
                feasible_mismatches=sum(not r["feasible_match"] for r in rows),
                latency_rel_err_mean=lm, latency_rel_err_max=lx, peak_mem_rel_err_mean=pm, peak_mem_rel_err_max=px,
                kv_peak_rel_err_mean=km, kv_peak_rel_err_max=kx)


def run_mbkr_agreement(configs: int = 1000, seed: int = 0, dtype: str = "float64", group_size: int = 10,
                       keep_rows: bool = False, **sample_kw) -> dict[str, Any]:
    """The array program's MBKR against the reference over random configurations near the memory limit.

    Args:
      configs: configurations; seed: seed of the generator; dtype: the array program's precision.
      group_size: points per ``simulate_batch`` call.
      keep_rows: also return each configuration's errors (``rows``).
      **sample_kw: passed to :func:`sample_mbkr_configs` (``programs``, ``buckets``, ``fill``, ...).

    Returns:
      ``configs``, ``spilling`` (the reference spilled) and ``spilling_share``, ``infeasible``
      (reference), ``feasible_mismatches`` and ``mismatched`` (up to 10), the mean and max relative
      errors of latency, peak memory and peak KV (over every configuration; ``spilling_*`` over those
      that spill, ``feasible_*`` over those both sides call feasible, with their ``*_configs`` counts),
      ``by_pairing`` and ``by_spill`` breakdowns, ``worst_latency`` and
      ``worst_peak_mem`` (descriptions), ``programs``, ``target_mean``, ``target_max``,
      ``within_target``, and wall times.
    """
    check_dtype(dtype)
    t0 = time.perf_counter()
    groups = sample_mbkr_configs(configs, seed, group_size, **sample_kw)
    rows = []
    ref_wall = vec_wall = 0.0
    for _, group in groups:
        t1 = time.perf_counter()
        vec = vectorised_group(group, dtype, group_size)
        t2 = time.perf_counter()
        for i, cfg in enumerate(group):
            rows.append(dict(mbkr_errors({k: v[i] for k, v in vec.items()}, reference(cfg)), cfg=cfg))
        vec_wall += t2 - t1
        ref_wall += time.perf_counter() - t2
    out = _summary(rows)
    for subset, keep in (("spilling", lambda r: r["spilled"]),
                         ("feasible", lambda r: r["ref_feasible"] and r["vec_feasible"])):
        part = _summary([r for r in rows if keep(r)])
        out.update({f"{subset}_{k}": v for k, v in part.items() if k.endswith(("_mean", "_max"))})
        out[f"{subset}_configs"] = part["configs"]
    out.update(
        dtype=dtype, seed=seed, spilling_share=out["spilling"] / max(len(rows), 1),
        infeasible=sum(not r["ref_feasible"] for r in rows),
        mismatched=[f"{r['cfg'].describe()} (array feasible={r['vec_feasible']}, reference {r['ref_feasible']})"
                    for r in rows if not r["feasible_match"]][:10],
        by_pairing={p: _summary([r for r in rows if r["cfg"].pairing == p])
                    for p in ("cross-half", "head-to-tail", "dynamic", "none") if any(r["cfg"].pairing == p for r in rows)},
        by_spill={s: _summary([r for r in rows if r["cfg"].spill == s]) for s in ("overflow", "eager")},
        worst_latency=max(rows, key=lambda r: r["latency"])["cfg"].describe() if rows else "",
        worst_peak_mem=max(rows, key=lambda r: r["peak_mem"])["cfg"].describe() if rows else "",
        programs=len({p for p, _ in groups}), target_mean=TARGET_MEAN, target_max=TARGET_MAX,
        within_target=bool(out["latency_rel_err_mean"] <= TARGET_MEAN and out["latency_rel_err_max"] <= TARGET_MAX
                           and out["peak_mem_rel_err_mean"] <= TARGET_MEAN
                           and out["peak_mem_rel_err_max"] <= TARGET_MAX),
        reference_wall_s=ref_wall, vectorised_wall_s=vec_wall, wall_s=time.perf_counter() - t0)
    if keep_rows:
        out["rows"] = rows
    return out


__all__ = ["K_PAD", "PROGRAM_FIELDS", "Program", "TARGET_MAX", "TARGET_MEAN", "draw_programs", "mbkr_errors",
           "run_mbkr_agreement", "sample_mbkr_configs", "vectorised_group"]
