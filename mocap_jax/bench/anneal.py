"""``mocap-jax bench anneal``: LBCP annealing under the full MBKR objective, each candidate at its own B'."""

from __future__ import annotations

import time

import numpy as np

from ..api.config import resolve
from ..api.search import largest_feasible_batch
from ..partition.dp import check_granularity
from ..partition.objectives import PartitionContext, PartitionProblem
from ..search.anneal import anneal, evaluate_states
from ..specs import LIMITS, checks
from .machine import host, local_devices


def bench_anneal(model="llama3-70b", hardware="mocap-4x4", seq_len=65536, chunks=16, granularity=256, chains=1024,
                 steps=2000, num_batches=1, max_batch=256, seed=1, progress=None) -> dict:
    """Wall time of annealing ``chains`` x ``steps`` with MOCAP's objective (prefill seconds per request at each
    candidate's own largest batch B', MBKR with cross-half pairs, one batch), compile and placement search included.

    ``progress``: optional callable given ``(steps taken, steps)`` (:func:`mocap_jax.search.anneal.anneal`).

    Returns a dict with ``total_s`` and its parts, ``steps_per_s`` (chain-steps per second of the step loop), and the
    uniform and best objectives.
    """
    machine = host()
    t0 = time.perf_counter()
    checks.integer("chains", chains, 1, LIMITS["chains"], above=" Each chain holds its partition and its objective's "
                   "evaluations (a few KB): use fewer chains.")
    checks.integer("steps", steps, 1, LIMITS["steps"])
    U = check_granularity(seq_len, chunks, granularity)
    base, extra = divmod(U, chunks)
    uniform = base + (np.arange(chunks) < extra).astype(np.int64)
    cfg = resolve(model, hardware, seq_len, "mbkr", partition=uniform * granularity, batch=1, num_batches=num_batches)
    placement_s = time.perf_counter() - t0
    hint = max(largest_feasible_batch(cfg, max_batch), 1)
    problem = PartitionProblem(shape=cfg.shape(chunks), objective="prefill", batch_search=True, max_batch=max_batch)
    ctx = PartitionContext(point=cfg.with_batch(hint).point(chunks), granularity=np.int32(granularity),
                           batch=np.int32(hint), arrivals=np.zeros(1, cfg.dtype))
    t1 = time.perf_counter()
    init = np.broadcast_to(uniform, (chains, chunks))
    # compiles the search's step program, its first step scoring the uniform partition
    uniform_objective = float(np.min(evaluate_states(problem, init, ctx, steps=steps)[0]))
    compile_s = time.perf_counter() - t1
    t2 = time.perf_counter()
    res = anneal(problem, ctx, init, seed, steps=steps, progress=progress)
    anneal_s = time.perf_counter() - t2
    return {"benchmark": "anneal", "model": model, "hardware": hardware, "seq_len": seq_len, "chunks": chunks,
            "granularity": granularity, "chains": chains, "steps": steps, "num_batches": num_batches,
            "objective": "prefill seconds per request at each candidate's own B' (MBKR, cross-half)",
            "uniform_batch": hint, "total_s": time.perf_counter() - t0, "placement_and_batch_s": placement_s,
            "compile_s": compile_s, "anneal_s": anneal_s, "steps_per_s": chains * steps / anneal_s,
            "uniform_objective_s": uniform_objective, "best_objective_s": res.objective,
            "accept_rate": res.accept_rate, **local_devices(), **machine}
