"""Schemes and ablations through one interface, and the comparison researchers quote (DESIGN §7, §8).

Schemes:

=============  ============================  =====
scheme         partition                     MBKR
=============  ============================  =====
gpipe          whole requests (microbatches)  no
terapipe       uniform M chunks               no
terapipe-dp    TeraPipe's DP (free chunk count) no
mbkr           uniform M chunks               yes
lbcp           proxy DP + annealing           no
mocap          proxy DP + annealing           yes
=============  ============================  =====

Each chunked scheme runs at its largest feasible batch B' (vectorised search); GPipe
runs one request per microbatch with streaming admission, so its batch size does not
matter under load.  :func:`plan_partition` returns the uniform, DP and annealed
partitions of a configuration with their objective values; :func:`compare` evaluates
every scheme at one load.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np

from . import api, lbcp
from .api import MBKRConfig, _point, mbkr_mode
from .costs import HardwareParams, ModelParams, StageLayout
from .evaluate import E2EObjective, PartitionContext, PrefillObjective, evaluate_prefill
from .schedule import SimShape, bucket, evaluate_one
from .serving import ServingShape, arrival_times, e2e_latency_jit
from .specs import get_hardware, get_model

ALL_SCHEMES = ("gpipe", "terapipe", "terapipe-dp", "mbkr", "lbcp", "mocap")
PARTITIONED = ("lbcp", "mocap")
OBJECTIVES = ("prefill", "e2e", "throughput")
DEFAULT_LOAD_FRACTION = 0.5
DEFAULT_REQUESTS = 256


@dataclass
class PlanSettings:
    """Knobs of the LBCP search (validated)."""

    chunks: int = 16
    granularity: int = 256
    chains: int = 256
    steps: int = 600
    max_shift: int = 4
    objective: str = "prefill"
    seed: int = 0

    def __post_init__(self):
        for name in ("chunks", "granularity", "chains", "steps", "max_shift"):
            api._positive_int(name, getattr(self, name))
        api._choice("objective", self.objective, OBJECTIVES)


def _context(point, g, batch, arrivals):
    return PartitionContext(point=point, granularity=np.asarray(g, np.int32), batch=np.asarray(batch, np.int32),
                            arrivals=np.asarray(arrivals, point.model.hidden.dtype))


def _uniform_units(U: int, M: int) -> np.ndarray:
    base, extra = divmod(U, M)
    return np.array([base + (1 if k < extra else 0) for k in range(M)], np.int64)


def plan_partition(model, hardware, seq_len: int, scheme: str = "mocap", *, settings: PlanSettings | None = None,
                   batch: int | str = "auto", load: float | None = None, release: str = "stage",
                   admission: str = "streaming", num_batches: int = 2, requests: int = DEFAULT_REQUESTS,
                   mbkr: MBKRConfig | None = None, placement=None, dtype="float32") -> dict:
    """Chunk sizes for ``lbcp``/``mocap``: uniform, proxy-DP and annealed, with objective values.

    The batch is fixed during annealing: ``batch="auto"`` uses B' of the DP partition.
    Returns a dict with ``uniform``, ``dp``, ``annealed`` (each: ``partition`` in tokens,
    ``objective_s``), ``proxy_dp_s``, ``batch``, ``objective``, ``anneal`` statistics.
    """
    settings = settings or PlanSettings()
    mbkr = mbkr or MBKRConfig()
    api._choice("scheme", scheme, PARTITIONED)
    m, hw = get_model(model), get_hardware(hardware)
    S = api._positive_int("seq_len", seq_len)
    g, M = settings.granularity, settings.chunks
    U = lbcp.check_granularity(S, M, g)
    use_mbkr = scheme == "mocap"
    sim_scheme = "mbkr" if use_mbkr else "terapipe"
    if settings.objective == "e2e" and (load is None or not load > 0):
        raise ValueError(f"objective 'e2e' needs a positive load in requests/s, got {load!r}")
    cfg = api._resolve(m, hw, S, sim_scheme, M, 1, None, release, admission, num_batches, 1, placement, None, dtype,
                       api.DEFAULT_MAX_BATCH, mbkr.pairing)
    dt, n, pl = cfg["dtype"], cfg["stages"], cfg["placement"]
    n_pad = bucket(n)
    mp, hp = ModelParams.from_spec(m, dt), HardwareParams.from_spec(hw, dt)
    layout = StageLayout.from_placement(hw, pl, n_pad, dt)

    # 1. proxy DP at a provisional batch (B' of the uniform partition), then B' of the DP partition
    uni = _uniform_units(U, M) * g
    kw = dict(release=release, admission=admission, num_batches=num_batches, placement=pl, dtype=dt,
              pairing=mbkr.pairing, p1=mbkr.p1, p2=mbkr.p2, read_overlap=mbkr.read_overlap)
    b0 = batch if batch != "auto" else max(api.max_feasible_batch(m, hw, S, sim_scheme, partition=uni, **kw), 1)
    C = np.asarray(lbcp.chunk_cost_matrix_jit(mp, hp, layout, U, g, b0, n_pad))
    dp = lbcp.proxy_dp(C, M, n, g)
    B = batch if batch != "auto" else max(api.max_feasible_batch(m, hw, S, sim_scheme, partition=dp.partition, **kw), 1)

    # 2. annealing under the full evaluator at batch B
    mb_cfg = mbkr
    mode = mbkr_mode(sim_scheme, mb_cfg)
    shape = SimShape(k_pad=M, n_pad=n_pad, num_batches=num_batches, mbkr=mode)
    point = _point(m, hw, api.chunked_item_table(dp.partition, B, M), pl, n_pad, admission, release, dt, mb_cfg, mode)
    arrivals = arrival_times("poisson", load, requests, settings.seed) if settings.objective == "e2e" else np.zeros(1)
    ctx = _context(point, g, B, arrivals)
    if settings.objective == "e2e":
        objective = E2EObjective(shape, ServingShape(k_pad=M, n_pad=n_pad, requests=requests,
                                                     synchronous=admission == "synchronous"))
    else:
        objective = PrefillObjective(shape, settings.objective)
    dp_units = dp.partition // g
    uni_units = _uniform_units(U, M)
    val = lambda u: float(np.asarray(lbcp.objective_jit(objective, jnp.asarray(u, jnp.int32), ctx)))
    key = jax.random.PRNGKey(settings.seed)
    # half the chains start from the DP partition, half from the uniform one
    init = np.stack([dp_units if c % 2 == 0 else uni_units for c in range(settings.chains)])
    t0 = time.perf_counter()
    res = lbcp.anneal(objective, ctx, init, key, chains=settings.chains, steps=settings.steps,
                      max_shift=settings.max_shift, reference=None)
    wall = time.perf_counter() - t0
    best_units = res.partition_units
    candidates = [(val(dp_units), dp_units), (val(uni_units), uni_units), (res.objective, best_units)]
    best_val, best_units = min(candidates, key=lambda c: c[0])
    return {
        "scheme": scheme, "model": m.name, "hardware": hw.name, "seq_len": S, "chunks": M, "granularity": g,
        "batch": int(B), "objective": settings.objective, "load_rps": load,
        "uniform": {"partition": (uni_units * g).tolist(), "objective_s": val(uni_units)},
        "dp": {"partition": dp.partition.tolist(), "objective_s": val(dp_units), "proxy_s": dp.objective,
               "cap_s": dp.cap, "caps_evaluated": dp.caps_evaluated},
        "annealed": {"partition": (np.asarray(best_units) * g).tolist(), "objective_s": best_val},
        "anneal": {"chains": settings.chains, "steps": settings.steps, "accept_rate": res.accept_rate,
                   "wall_s": wall, "seed": settings.seed},
        "placement": np.asarray(pl).tolist(),
    }


def terapipe_dp_partition(model, hardware, seq_len: int, granularity: int = 256, batch: int = 1,
                          dtype="float32") -> np.ndarray:
    """TeraPipe's own partitioning (free number of chunks) at a batch, in tokens."""
    m, hw = get_model(model), get_hardware(hardware)
    U = lbcp.check_granularity(seq_len, None, granularity)
    dt = api._dtype(dtype)
    n = api.check_stages(m, hw, None)
    n_pad = bucket(n)
    layout = StageLayout.snake(hw, n, n_pad, dt)
    C = np.asarray(lbcp.chunk_cost_matrix_jit(
        ModelParams.from_spec(m, dt), HardwareParams.from_spec(hw, dt), layout, U, granularity, batch, n_pad))
    return lbcp.terapipe_dp(C, n, granularity).partition


@dataclass
class SchemeResult:
    """One scheme's numbers in a comparison (seconds, requests/s, tokens)."""

    scheme: str
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
        for k, v in list(d.items()):
            if isinstance(v, float) and not math.isfinite(v):
                d[k] = None
        return d


def _scaled_partitions(fractions: np.ndarray, seqs: np.ndarray) -> np.ndarray:
    """Partition fractions scaled to each sequence length (rows sum exactly; chunks >= 1 token)."""
    raw = np.outer(seqs, fractions)
    part = np.maximum(np.floor(raw).astype(np.int64), 1)
    part[:, -1] += seqs - part.sum(1)
    return part


def _max_seq_for_partition(m, hw, scheme_sim: str, fractions, batch: int, kw: dict, granularity: int) -> int:
    """Longest S (multiple of g) feasible with the partition's chunk fractions at ``batch``."""
    M = len(fractions)

    def feasible(units):
        seqs = np.maximum(units * granularity, M)
        out = api.simulate_batch(m, hw, seqs, scheme_sim, batch=batch, partition=_scaled_partitions(fractions, seqs),
                                 k_pad=bucket(M), **kw)
        return out["feasible"]

    return max(api._largest_true(feasible, max(1, -(-M // granularity)), (1 << 24) // granularity), 0) * granularity


def evaluate_scheme(model, hardware, seq_len: int, scheme: str, *, load: float | None, chunks: int = 16,
                    granularity: int = 256, arrivals: str = "poisson", requests: int = DEFAULT_REQUESTS,
                    release: str = "stage", admission: str = "streaming", num_batches: int = 2,
                    mbkr: MBKRConfig | None = None, settings: PlanSettings | None = None, dtype="float32",
                    seed: int = 0, max_batch: int = 256, with_max_seq: bool = True, plan: dict | None = None) -> SchemeResult:
    """EvaluatePrefill (B', prefill latency) and EvaluateE2E (at ``load``) of one scheme."""
    api._choice("scheme", scheme, ALL_SCHEMES)
    m, hw = get_model(model), get_hardware(hardware)
    mbkr = mbkr or MBKRConfig()
    settings = settings or PlanSettings(chunks=chunks, granularity=granularity, seed=seed)
    S = seq_len
    sim_scheme = {"gpipe": "gpipe", "terapipe": "terapipe", "terapipe-dp": "terapipe", "mbkr": "mbkr",
                  "lbcp": "terapipe", "mocap": "mbkr"}[scheme]
    kw = dict(release=release, admission=admission, num_batches=num_batches, dtype=dtype, pairing=mbkr.pairing,
              p1=mbkr.p1, p2=mbkr.p2, read_overlap=mbkr.read_overlap)
    extra = {}
    if scheme == "gpipe":
        partition = np.array([S])
        B = 1
    elif scheme in ("terapipe", "mbkr"):
        partition = api.uniform_partition(S, chunks)
    elif scheme == "terapipe-dp":
        b1 = max(api.max_feasible_batch(m, hw, S, "terapipe", chunks=chunks, max_batch=max_batch, **kw), 1)
        partition = terapipe_dp_partition(m, hw, S, granularity, b1, dtype)
    else:
        plan = plan or plan_partition(m, hw, S, scheme, settings=settings, load=load, release=release,
                                      admission=admission, num_batches=num_batches, mbkr=mbkr, dtype=dtype)
        partition = np.asarray(plan["annealed"]["partition"])
        extra["plan"] = plan
    if scheme != "gpipe":
        B = api.max_feasible_batch(m, hw, S, sim_scheme, partition=partition, max_batch=max_batch, **kw)
    feasible = B > 0
    B = max(B, 1)
    r = api.simulate(m, hw, S, sim_scheme, partition=None if scheme == "gpipe" else partition, batch=B,
                     timeline=False, **kw)
    # E2E at the load
    cfg_mode = mbkr_mode(sim_scheme, mbkr)
    n = r.num_stages
    n_pad = bucket(n)
    k_pad = bucket(len(partition)) if scheme != "gpipe" else bucket(max(B, 1))
    point = _point(m, hw, api._items(sim_scheme, S, B, partition, 1, k_pad), r.placement, n_pad, admission, release,
                   api._dtype(dtype), mbkr, cfg_mode)
    mbkr_extra = np.zeros((k_pad, n_pad), api._dtype(dtype))
    if cfg_mode != "off":
        mbkr_extra[: len(partition), :n] = r.extra["mbkr_extra_times"][0]
    part_pad = np.zeros(k_pad, np.int32)
    if scheme != "gpipe":
        part_pad[: len(partition)] = partition
    rate = load if load is not None else r.throughput_rps * DEFAULT_LOAD_FRACTION
    arr = arrival_times(arrivals, rate, requests, seed)
    sshape = ServingShape(k_pad=k_pad, n_pad=n_pad, requests=requests, gpipe=scheme == "gpipe",
                          synchronous=admission == "synchronous")
    e2e = jax.device_get(e2e_latency_jit(point, part_pad, S, B, jnp.asarray(arr, api._dtype(dtype)),
                                         jnp.asarray(mbkr_extra), sshape))
    max_seq = 0
    if with_max_seq:
        if scheme == "gpipe":
            max_seq = api.max_feasible_seq_len(m, hw, "gpipe", batch=1, granularity=granularity, **kw)
        else:
            max_seq = _max_seq_for_partition(m, hw, sim_scheme, partition / partition.sum(), 1, kw, granularity)
    if cfg_mode != "off":
        extra.update({k: r.extra[k] for k in ("spilled_bytes", "remote_read_s", "blocking_s")})
    ok = feasible and r.feasible
    return SchemeResult(
        scheme=scheme, batch=int(B) if ok else 0, partition=np.asarray(partition).tolist(), feasible=ok,
        prefill_latency_s=r.prefill_latency_s if ok else math.inf,
        e2e_latency_mean_s=float(e2e["mean_s"]) if ok else math.inf,
        e2e_latency_p50_s=float(e2e["p50_s"]) if ok else math.inf,
        e2e_latency_p99_s=float(e2e["p99_s"]) if ok else math.inf,
        throughput_rps=r.throughput_rps if ok else 0.0,
        load_throughput_rps=float(e2e["throughput_rps"]) if ok else 0.0,
        bubble_fraction=r.bubble_fraction, max_seq_len=int(max_seq),
        stage_utilisation=r.stage_utilisation.tolist(), extra={**extra, "load_rps": rate},
    )


def compare(model, hardware, seq_len: int, *, load: float | None = None, schemes=ALL_SCHEMES, chunks: int = 16,
            granularity: int = 256, requests: int = DEFAULT_REQUESTS, arrivals: str = "poisson",
            settings: PlanSettings | None = None, mbkr: MBKRConfig | None = None, dtype="float32", seed: int = 0,
            with_max_seq: bool = True, release: str = "stage", admission: str = "streaming") -> dict:
    """Evaluate every scheme on the same hardware, model, sequence length and load.

    Without ``load`` the default is ``DEFAULT_LOAD_FRACTION`` (0.5) x the smallest
    saturation throughput among the schemes, a load at which every scheme is stable.
    """
    if load is not None and not (isinstance(load, (int, float)) and load > 0):
        raise ValueError(f"load must be a positive request rate in requests/s, got {load!r}")
    for s in schemes:
        api._choice("scheme", s, ALL_SCHEMES)
    m, hw = get_model(model), get_hardware(hardware)
    S = api._positive_int("seq_len", seq_len)
    lbcp.check_granularity(S, chunks, granularity)
    settings = settings or PlanSettings(chunks=chunks, granularity=granularity, seed=seed)
    mbkr = mbkr or MBKRConfig()
    common = dict(chunks=chunks, granularity=granularity, requests=requests, arrivals=arrivals, mbkr=mbkr,
                  settings=settings, dtype=dtype, seed=seed, release=release, admission=admission)
    t0 = time.perf_counter()
    plans = {}
    if load is None:   # saturation throughputs first (prefill only), then the common load
        sat = {}
        for s in schemes:
            r = evaluate_scheme(m, hw, S, s, load=1.0, with_max_seq=False, requests=8,
                                **{k: v for k, v in common.items() if k != "requests"})
            sat[s] = r.throughput_rps
            if "plan" in r.extra:
                plans[s] = r.extra["plan"]
        stable = [v for v in sat.values() if v > 0]
        load = DEFAULT_LOAD_FRACTION * min(stable) if stable else 1.0
    results = [evaluate_scheme(m, hw, S, s, load=load, with_max_seq=with_max_seq, plan=plans.get(s), **common)
               for s in schemes]
    base = {r.scheme: r for r in results}

    def rel(r, ref, key):
        if ref not in base:
            return None
        a, b = getattr(r, key), getattr(base[ref], key)
        return a / b if (b and math.isfinite(a) and math.isfinite(b)) else None

    rows = []
    for r in results:
        d = r.to_dict()
        d.pop("extra")
        for ref in ("gpipe", "terapipe"):
            d[f"e2e_mean_vs_{ref}"] = rel(r, ref, "e2e_latency_mean_s")
            d[f"throughput_vs_{ref}"] = rel(r, ref, "throughput_rps")
            d[f"max_seq_len_vs_{ref}"] = rel(r, ref, "max_seq_len")
        d.update({k: v for k, v in r.extra.items() if k in ("spilled_bytes", "remote_read_s", "blocking_s")})
        rows.append(d)
    return {"model": m.name, "hardware": hw.name, "seq_len": S, "load_rps": load, "requests": requests,
            "arrivals": arrivals, "chunks": chunks, "granularity": granularity, "schemes": rows,
            "wall_s": time.perf_counter() - t0}
