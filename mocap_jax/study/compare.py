"""Schemes and ablations through one interface, compared on the same hardware, model, length and load.

=============  ==========================================  =====  ==========================
scheme         partition                                   MBKR   allowed to choose
=============  ==========================================  =====  ==========================
gpipe          whole requests in microbatches              no     microbatch size, batch
terapipe       M uniform chunks                            no     batch
terapipe-dp    TeraPipe's planner: batch split into        no     groups, slicing, chunk
               request groups, each sliced on its own             count, batch
mbkr           M uniform chunks                            yes    batch
lbcp           proxy DP + annealing (own B' per candidate) no     partition, chunk count*, batch
mocap          proxy DP + annealing (own B' per candidate) yes    partition, chunk count*, batch
=============  ==========================================  =====  ==========================

(* the chunk count is searched over ``PlanSettings.chunk_counts`` unless fixed.)  Every scheme
runs at the largest batch B' its choices admit; the comparison records, per scheme, what it
chose.  GPipe's microbatch size is searched the way a GPipe user would pick it: the one with the
highest saturation throughput at its own B' (ties to the smaller microbatch).  TeraPipe's planner
is run at the batch it runs: the largest batch B whose plan (made for B) fits at B.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np

from ..api.config import Config, resolve
from ..api.search import largest_feasible_batch, largest_true, max_feasible_seq_len
from ..api.simulate import run
from ..partition.dp import check_granularity
from ..partition.plan import PlanSettings, plan_partition
from ..partition.terapipe import TABLE_BATCH, check_table_size, cost_setting, plan_batches, terapipe_items
from ..prefill.points import MBKRSettings
from ..schedule.shape import bucket
from ..serving.arrivals import ARRIVALS, arrival_times
from ..serving.e2e import ServingShape, check_clock, e2e_latency_jit
from ..specs import LIMITS, SpecError, checks, get_hardware, get_model

ALL_SCHEMES = ("gpipe", "terapipe", "terapipe-dp", "mbkr", "lbcp", "mocap")
DEFAULT_LOAD_FRACTION = 0.5
DEFAULT_REQUESTS = 256
GPIPE_MICROBATCHES = (1, 2, 4, 8, 16, 32)


@dataclass
class CompareSettings:
    """The common setting of a comparison (validated on construction).

    Attributes:
      chunks: M of the uniform chunked schemes (terapipe, mbkr).
      plan: LBCP / MOCAP search settings (their ``chunks=None`` searches the chunk count).
      microbatches: GPipe microbatch sizes tried.
      max_batch: upper end of every B' search.
      requests, arrivals, seed: the serving workload.
      release, admission, num_batches: policies and batches of the prefill evaluation.
      mbkr: MBKR settings of mbkr and mocap.
      dtype: float32 or float64.
      tp: dies (GPUs) per pipeline stage group, for every scheme.
      with_max_seq: also find each scheme's longest feasible sequence (one request).
    """

    chunks: int = 16
    plan: PlanSettings = field(default_factory=PlanSettings)
    microbatches: tuple = GPIPE_MICROBATCHES
    max_batch: int = 256
    requests: int = DEFAULT_REQUESTS
    arrivals: str = "poisson"
    seed: int = 0
    release: str = "stage"
    admission: str = "streaming"
    num_batches: int = 2
    mbkr: MBKRSettings = field(default_factory=MBKRSettings)
    dtype: str = "float32"
    tp: int = 1
    with_max_seq: bool = True

    def __post_init__(self):
        self.chunks = checks.integer("chunks", self.chunks, 1, LIMITS["chunks"])
        self.max_batch = checks.integer("max_batch", self.max_batch, 1, LIMITS["batch"])
        self.requests = checks.integer("requests", self.requests, 1, LIMITS["requests"])
        self.tp = checks.integer("tp", self.tp, 1, LIMITS["dies"])
        self.seed = checks.integer("seed", self.seed, 0, LIMITS["seed"])
        self.with_max_seq = checks.flag("with_max_seq", self.with_max_seq)
        self.microbatches = tuple(checks.integer("microbatch", m, 1, LIMITS["batch"]) for m in self.microbatches)
        checks.choice("arrival process", self.arrivals, ARRIVALS)


@dataclass
class SchemePlan:
    """What a scheme runs: its configuration at B', the partition E2E batches use, and its choices."""

    scheme: str
    config: Config | None                 # None if nothing fits
    items: object | None                  # an item table that is not a uniform/annealed partition (TeraPipe plans)
    partition: np.ndarray                 # chunk sizes of a (partial) batch in serving; [S] for GPipe
    chose: dict


@dataclass
class SchemeResult:
    """One scheme's numbers in a comparison (seconds, requests/s, tokens)."""

    scheme: str
    chose: dict
    batch: int
    partition: list
    feasible: bool
    prefill_latency_s: float
    e2e_latency_mean_s: float
    e2e_latency_p50_s: float
    e2e_latency_p99_s: float
    throughput_rps: float
    load_throughput_rps: float
    bubble_fraction: float
    max_seq_len: int
    stage_utilisation: list
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def _base(model, hardware, S, scheme, st: CompareSettings, **changes) -> Config:
    m = st.mbkr
    args = dict(chunks=st.chunks, batch=1, release=st.release, admission=st.admission, num_batches=st.num_batches,
                dtype=st.dtype, tp=st.tp, pairing=m.pairing, p1=m.p1, p2=m.p2, read_overlap=m.read_overlap, spill=m.spill)
    args.update(changes)
    return resolve(model, hardware, S, scheme, **args)


def _fits_with_items(cfg: Config, items, slots: int) -> bool:
    return run(cfg, timeline=False, items=(items, slots)).feasible


def plan_scheme(model, hardware, S: int, scheme: str, st: CompareSettings, plan: dict | None = None,
                progress=None, load: float | None = None) -> SchemePlan:
    """Choose what ``scheme`` runs (see the module table).  ``progress``: optional callable given
    ``(annealing steps taken, steps)`` while an ``lbcp`` or ``mocap`` partition is annealed;
    ``load``: the request rate (requests/s) the ``e2e`` objective scores partitions at."""
    checks.choice("scheme", scheme, ALL_SCHEMES)
    if scheme == "gpipe":
        best = None
        for micro in st.microbatches:
            if micro > st.max_batch:
                continue
            cfg = _base(model, hardware, S, "gpipe", st, microbatch=micro)
            B = largest_feasible_batch(cfg, min(st.max_batch, micro * LIMITS["chunks"]))
            if B <= 0:
                continue
            r = run(cfg.with_batch(B), timeline=False)
            if best is None or r.throughput_rps > best[0] * (1 + 1e-9):
                best = (r.throughput_rps, cfg.with_batch(B), micro)
        if best is None:
            return SchemePlan("gpipe", None, None, np.array([S]), {"microbatch": None, "batch": 0})
        return SchemePlan("gpipe", best[1], None, np.array([S]), {"microbatch": best[2], "batch": best[1].batch})
    if scheme in ("terapipe", "mbkr"):
        cfg = _base(model, hardware, S, scheme, st)
        B = largest_feasible_batch(cfg, st.max_batch)
        return SchemePlan(scheme, cfg.with_batch(B) if B else None, None, cfg.partition,
                          {"chunks": st.chunks, "batch": B})
    if scheme == "terapipe-dp":
        return _plan_terapipe(model, hardware, S, st)
    p = plan or plan_partition(model, hardware, S, scheme, settings=st.plan, release=st.release,
                               admission=st.admission, num_batches=st.num_batches, mbkr=st.mbkr, dtype=st.dtype,
                               tp=st.tp, progress=progress, load=load if st.plan.objective == "e2e" else None,
                               requests=st.requests)
    part = np.asarray(p["partition"])
    cfg = _base(model, hardware, S, "mbkr" if scheme == "mocap" else "terapipe", st, chunks=None, partition=part)
    B = int(p["batch"])
    chose = {"chunks": p["chunks"], "chunk_count_searched": p["chose"]["chunks"], "partition": "annealed"
             if p["per_chunks"] and any(r["best"] == "annealed" for r in p["per_chunks"]) else "dp/uniform", "batch": B,
             "plan": p}
    return SchemePlan(scheme, cfg.with_batch(B) if B else None, None, part, chose)


def _plan_terapipe(model, hardware, S: int, st: CompareSettings) -> SchemePlan:
    """TeraPipe's plan at the batch it runs: the largest B whose own plan fits at B."""
    g = st.plan.granularity
    units = check_granularity(S, None, g)
    cfg = _base(model, hardware, S, "terapipe", st)
    check_table_size(units, TABLE_BATCH, bucket(cfg.stages), g, S)   # before any search compiles
    cap = max(largest_feasible_batch(cfg, st.max_batch), 1)
    upper = min(st.max_batch, 2 * cap)
    setting = cost_setting(cfg.model, cfg.hardware, S, upper, g, cfg.stages, cfg.dtype, cfg.placement)
    plans: dict = {}

    def fits(batches):
        # one search over caps plans every candidate of the round
        new = [int(b) for b in batches if int(b) not in plans]
        if new:
            plans.update(zip(new, plan_batches(setting.tables, new, setting.stages, g)))
        out = []
        for b in batches:
            plan = plans[int(b)]
            k = bucket(sum(len(x) for x in plan.slicings))
            out.append(_fits_with_items(cfg.with_batch(int(b)), terapipe_items(plan, k), k))
        return np.array(out)

    B = largest_true(lambda c: fits(np.unique(c))[np.searchsorted(np.unique(c), c)], 1, upper, grid=8)
    if B <= 0:
        return SchemePlan("terapipe-dp", None, None, cfg.partition, {"batch": 0})
    plan = plans[B]
    k = bucket(sum(len(x) for x in plan.slicings))
    largest = int(np.argmax(plan.groups))
    chose = {"groups": [int(x) for x in plan.groups], "slices": [len(x) for x in plan.slicings], "batch": B,
             "objective_s": plan.objective}
    return SchemePlan("terapipe-dp", cfg.with_batch(B), (terapipe_items(plan, k), k), plan.slicings[largest], chose)


def _e2e(plan: SchemePlan, result, load: float, st: CompareSettings) -> dict:
    """EvaluateE2E of a planned scheme at ``load`` requests/s."""
    cfg = plan.config
    arrivals = arrival_times(st.arrivals, load, st.requests, st.seed)
    gpipe = plan.scheme == "gpipe"
    if gpipe:
        k = bucket(-(-cfg.batch // cfg.microbatch))
        partition = np.zeros(k, np.int32)
    else:
        part = np.asarray(plan.partition, np.int32)
        k = bucket(len(part))
        partition = np.concatenate([part, np.zeros(k - len(part), np.int32)])
    shape = cfg.shape(k)._replace(batches=1)
    # the serving program rebuilds each batch's items from ``partition``: only the point's numbers are
    # used, and they do not depend on the slot count (a TeraPipe plan may have fewer slices than cfg)
    point = cfg.point()
    extra = np.zeros((k, shape.stages), cfg.dtype)
    plain_cap = cfg.batch
    if "mbkr_extra_times" in result.extra and plan.items is None:
        k1 = cfg.items_per_batch
        extra[:k1, :cfg.stages] = result.extra["mbkr_extra_times"][:k1]
        plain = resolve_plain(cfg)
        plain_cap = largest_feasible_batch(plain, cfg.batch) if plain is not None else cfg.batch
    out = jax.device_get(e2e_latency_jit(point, jnp.asarray(partition), cfg.seq_len, cfg.microbatch, cfg.batch,
                                         jnp.asarray(arrivals, cfg.dtype), jnp.asarray(extra), plain_cap,
                                         ServingShape(prefill=shape, requests=st.requests, gpipe=gpipe)))
    out = {k: float(out[k]) for k in ("mean_s", "p50_s", "p99_s", "throughput_rps")}
    check_clock(plan.scheme, load, st.requests, arrivals[-1], out["mean_s"], out["p50_s"], out["p99_s"], cfg.dtype,
                "--dtype float64")
    return out


def resolve_plain(cfg: Config) -> Config | None:
    """The same configuration without MBKR."""
    return dataclasses.replace(cfg, scheme="terapipe")


def _max_seq(plan: SchemePlan, st: CompareSettings) -> int:
    """Longest sequence this scheme's choices allow for one request (multiples of the granularity)."""
    cfg = plan.config
    g = st.plan.granularity
    m = st.mbkr
    kw = dict(release=st.release, admission=st.admission, num_batches=1, placement=cfg.placement, dtype=st.dtype, tp=st.tp,
              pairing=m.pairing, p1=m.p1, p2=m.p2, read_overlap=m.read_overlap, spill=m.spill, granularity=g)
    if plan.scheme == "gpipe":
        return max_feasible_seq_len(cfg.model, cfg.hardware, "gpipe", batch=1, **kw)
    part = np.asarray(plan.partition, np.float64)
    sim = "mbkr" if plan.scheme in ("mbkr", "mocap") else "terapipe"
    return max_feasible_seq_len(cfg.model, cfg.hardware, sim, chunks=len(part), batch=1,
                                fractions=part / part.sum(), **kw)


def evaluate_scheme(plan: SchemePlan, load: float | None, st: CompareSettings) -> SchemeResult:
    """EvaluatePrefill at the scheme's B' and EvaluateE2E at ``load`` (default half its saturation throughput)."""
    if plan.config is None:
        inf = math.inf
        return SchemeResult(plan.scheme, plan.chose, 0, np.asarray(plan.partition).tolist(), False, inf, inf, inf, inf,
                            0.0, 0.0, float("nan"), 0, [])
    r = run(plan.config, timeline=False, items=plan.items)
    rate = load if load is not None else r.throughput_rps * DEFAULT_LOAD_FRACTION
    e2e = _e2e(plan, r, rate, st) if r.feasible else {"mean_s": math.inf, "p50_s": math.inf, "p99_s": math.inf,
                                                       "throughput_rps": 0.0}
    max_seq = _max_seq(plan, st) if st.with_max_seq else 0
    extra = {"load_rps": rate}
    for key in ("spilled_bytes", "remote_read_s", "blocking_s", "mbkr_converged", "tensor_parallel"):
        if key in r.extra:
            extra[key] = r.extra[key]
    return SchemeResult(
        scheme=plan.scheme, chose={k: v for k, v in plan.chose.items() if k != "plan"}, batch=plan.config.batch,
        partition=r.partition.tolist(), feasible=r.feasible, prefill_latency_s=r.prefill_latency_s,
        e2e_latency_mean_s=e2e["mean_s"], e2e_latency_p50_s=e2e["p50_s"], e2e_latency_p99_s=e2e["p99_s"],
        throughput_rps=r.throughput_rps, load_throughput_rps=e2e["throughput_rps"],
        bubble_fraction=r.bubble_fraction, max_seq_len=int(max_seq), stage_utilisation=r.stage_utilisation.tolist(),
        extra=extra)


def batch_text(batch: int, max_batch: int) -> str:
    """B' as tables show it: marked where it is the search's upper end, a lower bound of the true B'."""
    return f"{batch} (cap)" if batch == max_batch else str(batch)


def compare(model, hardware, seq_len: int, *, load: float | None = None, schemes=ALL_SCHEMES,
            settings: CompareSettings | None = None, log=None) -> dict:
    """Every scheme on the same hardware, model, sequence length and load.

    Without ``load`` the common load is ``DEFAULT_LOAD_FRACTION`` (0.5) x the smallest saturation
    throughput among the feasible schemes, a load at which every scheme is stable.  ``log``: optional
    callable given a line of progress as each scheme is planned and evaluated, and as the ``lbcp``
    and ``mocap`` annealing starts and passes each quarter of its steps.
    """
    st = settings or CompareSettings()
    if load is not None:
        load = checks.load("load", load)
    schemes = tuple(schemes)
    for s in schemes:
        checks.choice("scheme", s, ALL_SCHEMES)
    if not schemes or len(set(schemes)) != len(schemes):
        raise SpecError(f"schemes must name each scheme once, got {list(schemes)}; choose from {', '.join(ALL_SCHEMES)}")
    m, hw = get_model(model), get_hardware(hardware)
    S = checks.integer("seq_len", seq_len, 1, LIMITS["seq_len"])
    check_granularity(S, st.chunks, st.plan.granularity)
    t0 = time.perf_counter()

    def note(message: str) -> None:
        if log is not None:
            log(f"[{time.perf_counter() - t0:6.1f}s] {message}")

    def annealing(scheme: str):
        # minutes of annealing would otherwise pass without a line: one as it starts, one per quarter
        last = [-1]

        def report(done: int, total: int) -> None:
            quarter = 4 * done // max(total, 1)
            if last[0] < quarter < 4:
                last[0] = quarter
                note(f"{scheme}: annealing, {done:,} of {total:,} steps")
        return report

    plans = {}
    for s in schemes:
        plans[s] = plan_scheme(m, hw, S, s, st, progress=annealing(s) if log is not None else None, load=load)
        config = plans[s].config
        note(f"{s}: planned, " + (f"B' = {config.batch}" if config is not None else "nothing fits"))
    if load is None:
        sat = [run(p.config, timeline=False, items=p.items).throughput_rps for p in plans.values() if p.config]
        sat = [v for v in sat if v > 0]
        load = DEFAULT_LOAD_FRACTION * min(sat) if sat else 1.0
        if load < LIMITS["load_min"]:
            raise SpecError(f"the slowest scheme saturates at {min(sat):.3g} requests/s on {hw.name}, so the default "
                            f"load ({DEFAULT_LOAD_FRACTION:g} x that) is below {LIMITS['load_min']:g} requests/s, where "
                            f"arrivals are not representable; pass a load (--load) or use faster hardware")
    results = []
    for s in schemes:
        results.append(evaluate_scheme(plans[s], load, st))
        note(f"{s}: evaluated at {load:.4g} requests/s" + (" and its longest sequence found" if st.with_max_seq else ""))
    base = {r.scheme: r for r in results}

    def rel(r, ref, key):
        if ref not in base:
            return None
        a, b = getattr(r, key), getattr(base[ref], key)
        return a / b if (b and math.isfinite(a) and math.isfinite(b)) else None

    rows = []
    for r in results:
        d = r.to_dict()
        extra = d.pop("extra")
        for ref in ("gpipe", "terapipe"):
            d[f"e2e_mean_vs_{ref}"] = rel(r, ref, "e2e_latency_mean_s")
            d[f"throughput_vs_{ref}"] = rel(r, ref, "throughput_rps")
            d[f"max_seq_len_vs_{ref}"] = rel(r, ref, "max_seq_len")
        d.update({k: v for k, v in extra.items() if k != "load_rps"})
        rows.append(d)
    return {"model": m.name, "hardware": hw.name, "seq_len": S, "load_rps": load, "requests": st.requests,
            "arrivals": st.arrivals, "chunks": st.chunks, "granularity": st.plan.granularity, "tp": st.tp,
            "admission": st.admission, "release": st.release, "with_max_seq": st.with_max_seq,
            "max_batch": st.max_batch, "schemes": rows,
            "wall_s": time.perf_counter() - t0,
            "plans": {s: p.chose.get("plan") for s, p in plans.items() if "plan" in p.chose}}
