"""LBCP planning: the exact proxy DP as a start, annealing under the full evaluator, the chunk count searched.

:func:`plan_partition` returns, for the ``lbcp`` (no MBKR) or ``mocap`` (with MBKR) scheme, the
uniform, proxy-DP and annealed partitions of each candidate chunk count with their objective
values (:mod:`mocap_jax.partition.objectives`) and their own largest batch B', and the best of
all of them.  Half of the chains start from the DP partition, half from the uniform one; the
result is never worse than either start.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..api.config import check_dtype, resolve
from ..api.search import largest_feasible_batch
from ..mbkr.pairing import PAIRINGS
from ..prefill.points import MBKRSettings
from ..search.anneal import anneal, evaluate_states
from ..serving.arrivals import arrival_times
from ..serving.e2e import check_clock, clock_resolved
from ..specs import LIMITS, SpecError, checks
from .dp import check_granularity, chunk_cost_matrix_jit, proxy_dp
from .objectives import OBJECTIVES, PartitionContext, PartitionProblem

PARTITIONED = ("lbcp", "mocap")
DEFAULT_REQUESTS = 256


@dataclass
class PlanSettings:
    """Knobs of the LBCP search (validated on construction).

    Attributes:
      chunks: the chunk count M, or None to search ``chunk_counts`` (best wins).
      chunk_counts: candidate chunk counts when ``chunks`` is None (those that fit S / g units).
      granularity: g, tokens per unit (chunk sizes are multiples of it).
      chains, steps, max_shift: annealing chains, steps per chain, largest boundary shift (units).
      objective: ``prefill``, ``throughput`` or ``e2e`` (:mod:`mocap_jax.partition.objectives`).
      seed: PRNG seed (a fixed seed gives the same plan).
      max_batch: upper end of each candidate's B' search.
    """

    chunks: int | None = 16
    chunk_counts: tuple = (4, 8, 16, 32)
    granularity: int = 256
    chains: int = 256
    steps: int = 600
    max_shift: int = 4
    objective: str = "prefill"
    seed: int = 0
    max_batch: int = 256

    def __post_init__(self):
        if self.chunks is not None:
            self.chunks = checks.integer("chunks", self.chunks, 1, LIMITS["chunks"])
        self.chunk_counts = tuple(checks.integer("chunk count", m, 1, LIMITS["chunks"]) for m in self.chunk_counts)
        if not self.chunk_counts:
            raise SpecError("chunk_counts must name at least one chunk count")
        for name in ("granularity", "steps", "max_shift", "max_batch"):
            setattr(self, name, checks.integer(name, getattr(self, name), 1, 1 << 24))
        self.chains = checks.integer("chains", self.chains, 1, LIMITS["chains"], above=" Each chain holds its partition and "
                                     "its objective's evaluations (a few KB): use fewer chains.")
        self.seed = checks.integer("seed", self.seed, 0, LIMITS["seed"])
        checks.choice("objective", self.objective, OBJECTIVES)

    def counts(self, units: int) -> tuple:
        return (self.chunks,) if self.chunks is not None else tuple(m for m in self.chunk_counts if m <= units)


def _uniform_units(U: int, M: int) -> np.ndarray:
    base, extra = divmod(U, M)
    return base + (np.arange(M) < extra).astype(np.int64)


def plan_chunk_count(cfg, M: int, settings: PlanSettings, batch, arrivals, use_mbkr: bool, progress=None,
                     before_search=None) -> dict:
    """Uniform, DP and annealed partitions of one chunk count, with objectives and B' (``progress``: as
    :func:`mocap_jax.search.anneal.anneal`'s; ``before_search``: optional callable given the best
    objective of the chains' starting partitions before the search runs, which the result can only
    lower)."""
    g = settings.granularity
    U = cfg.seq_len // g
    uni = _uniform_units(U, M)
    cfg_m = cfg.__class__(**{**cfg.__dict__, "partition": uni * g, "scheme": "mbkr" if use_mbkr else "terapipe"})
    search = batch == "auto"
    B0 = max(largest_feasible_batch(cfg_m, settings.max_batch), 1) if search else int(batch)
    point = cfg_m.with_batch(B0).point(M)
    n = cfg.stages
    C = np.asarray(chunk_cost_matrix_jit(point.model, point.hardware, point.layout, U, g, B0, point.layout.handoff_hops.shape[0]))
    dp = proxy_dp(C, M, n, g)
    shape = cfg_m.shape(M)
    problem = PartitionProblem(shape=shape, objective=settings.objective, batch_search=search,
                               max_batch=settings.max_batch, max_shift=settings.max_shift,
                               requests=len(arrivals) if settings.objective == "e2e" else 0)
    ctx = PartitionContext(point=point, granularity=np.int32(g), batch=np.int32(B0),
                           arrivals=np.asarray(arrivals, cfg.dtype))
    dp_units = dp.partition // g
    init = np.stack([dp_units if c % 2 == 0 else uni for c in range(settings.chains)])
    if before_search is not None:
        before_search(float(np.min(evaluate_states(problem, init, ctx, steps=settings.steps)[0])))
    t0 = time.perf_counter()
    res = anneal(problem, ctx, init, settings.seed, steps=settings.steps, progress=progress)
    wall = time.perf_counter() - t0
    starts = np.stack([uni, dp_units, res.x])
    # scored by the search's own compiled program: as many rows as it has chains
    rows = np.concatenate([starts, np.broadcast_to(res.x, (max(settings.chains - 3, 0), M))])
    values, batches = (v[:3] for v in evaluate_states(problem, rows, ctx, steps=settings.steps))
    best = int(np.argmin(values))
    batches = [int(b) for b in batches]
    label = ("uniform", "dp", "annealed")
    return {
        "chunks": M, "batch_hint": B0,
        **{k: {"partition": (starts[i] * g).tolist(), "objective_s": float(values[i]), "batch": batches[i]}
           for i, k in enumerate(label)},
        "proxy_dp_s": dp.objective, "best": label[best], "objective_s": float(values[best]),
        "partition": (starts[best] * g).tolist(), "batch": batches[best],
        "anneal": {"chains": settings.chains, "steps": settings.steps, "accept_rate": res.accept_rate,
                   "wall_s": wall, "seed": settings.seed},
    }


def plan_partition(model, hardware, seq_len: int, scheme: str = "mocap", *, settings: PlanSettings | None = None,
                   batch: int | str = "auto", load: float | None = None, release: str = "stage",
                   admission: str = "streaming", num_batches: int = 2, requests: int = DEFAULT_REQUESTS,
                   mbkr: MBKRSettings | None = None, placement=None, dtype="float32", tp: int = 1,
                   progress=None) -> dict:
    """Chunk sizes for ``lbcp`` / ``mocap``: per chunk count the uniform, DP and annealed partitions.

    ``batch="auto"`` scores every candidate at its own B'; an int fixes the batch; ``tp`` dies per
    stage group (as in :func:`mocap_jax.simulate`).  Returns a dict
    with ``per_chunks`` (one entry per chunk count tried), the winner's ``chunks``, ``partition``,
    ``batch``, ``objective_s``, and what the scheme was allowed to choose.  ``progress``: optional
    callable given ``(annealing steps taken, steps)`` over all the chunk counts.
    """
    settings = settings or PlanSettings()
    mbkr = mbkr or MBKRSettings()
    checks.choice("scheme", scheme, PARTITIONED)
    if not (isinstance(batch, str) and batch == "auto"):
        batch = checks.integer("batch", batch, 1, LIMITS["batch"])
    S = checks.integer("seq_len", seq_len, 1, LIMITS["seq_len"])
    U = check_granularity(S, settings.chunks, settings.granularity)
    counts = settings.counts(U)
    if not counts:
        raise SpecError(f"none of the chunk counts {settings.chunk_counts} fits S / g = {U} units; "
                        f"use a smaller granularity")
    if settings.objective == "e2e":
        if load is None:
            raise SpecError("the e2e objective scores a partition by its end-to-end latency at a request rate: "
                            "give a load (requests/s; --load on the command line, load in a sweep)")
        arrivals = arrival_times("poisson", load, requests, settings.seed)
    elif load is not None:
        raise SpecError(f"a load ({load!r} requests/s) is the request rate of the e2e objective; the "
                        f"{settings.objective} objective does not use one: choose objective 'e2e' "
                        f"(--objective e2e) or leave the load out")
    else:
        arrivals = np.zeros(1)
    use_mbkr = scheme == "mocap"
    cfg = resolve(model, hardware, S, "mbkr" if use_mbkr else "terapipe", chunks=counts[0], batch=1,
                  release=release, admission=admission, num_batches=num_batches, placement=placement, dtype=dtype,
                  pairing=checks.choice("pairing", mbkr.pairing, PAIRINGS), p1=mbkr.p1, p2=mbkr.p2,
                  read_overlap=mbkr.read_overlap, spill=mbkr.spill, tp=tp)
    check_dtype(dtype)
    total = settings.steps * len(counts)

    def clock_before_search(upper_s: float) -> None:
        """Refuse before the search when the clock is too coarse even at the last arrival for the
        starting partitions' mean end-to-end latency: the result's latency is no longer, so its
        clock (at the last arrival plus that latency) is no finer, and :func:`check_clock` would
        refuse it after the search."""
        if np.isfinite(upper_s) and not clock_resolved(arrivals[-1], upper_s, upper_s, 0.0, cfg.dtype)[0]:
            check_clock("e2e objective (its starting partitions, which the search can only improve on)", load,
                        requests, arrivals[-1], upper_s, upper_s, 0.0, cfg.dtype, "--dtype float64")

    per = [plan_chunk_count(cfg, M, settings, batch, arrivals, use_mbkr,
                            None if progress is None else
                            (lambda done, _, k=k: progress(k * settings.steps + done, total)),
                            clock_before_search if settings.objective == "e2e" else None)
           for k, M in enumerate(counts)]
    win = min(per, key=lambda r: r["objective_s"])
    if settings.objective == "e2e" and np.isfinite(win["objective_s"]):     # inf: nothing fits, no clock to judge
        mean = win["objective_s"]
        check_clock("e2e objective", load, requests, arrivals[-1], mean, mean, mean, cfg.dtype, "--dtype float64")
    return {"scheme": scheme, "model": cfg.model.name, "hardware": cfg.hardware.name, "seq_len": S,
            "granularity": settings.granularity, "objective": settings.objective, "load_rps": load,
            "chunks": win["chunks"], "partition": win["partition"], "batch": win["batch"],
            "objective_s": win["objective_s"], "per_chunks": per, "placement": cfg.placement.tolist(),
            "chose": {"chunks": settings.chunks is None, "partition": True, "batch": batch == "auto"}}
