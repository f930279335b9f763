"""KV memory scheduler across the wafer's DRAM: budgets, location priorities, the greedy rule.

When a request finishes prefill, its KV cache must be stored somewhere until its decode
instance has generated the last token.  The WSC-LLM *memory scheduler* places it greedily:

1. candidate dies by **location priority** for the request's (prefill instance p,
   decode instance q) pair (:func:`priority_table`):

   * 0 -- dies of the decode instance q (read locally while decoding);
   * 1 -- dies on a shortest path between p and q (inside the bounding box of the
     two centre dies), the prefill instance's own dies included;
   * 2 -- dies next to those paths (one hop outside the box);
   * 3 -- not allowed;

2. within a priority level, dies with **more free capacity** first;
3. fill dies in that order until the request's KV is placed (it may be split);
4. if the allowed dies together cannot hold it, the request is not placed and its
   prefill instance **pauses** (head-of-line: later requests of that instance wait
   behind it) until decode completions free memory.

``local`` (only priority 0: KV stays on the decode instance, Splitwise style) is the
comparison policy; the LP optimum is in :mod:`mocap_jax.wsc.memory_optimal` and the timed
simulation of the policies in :mod:`mocap_jax.wsc.memory_sim`.

Free capacity per die = usable DRAM - resident weights - iteration workspace, and on
prefill dies also the KV of one longest prompt in flight (:func:`die_budget`).

Everything is in bytes and seconds.  :func:`greedy_allocate` is written against an
array namespace (``numpy`` or ``jax.numpy``), :func:`greedy_allocate_pairwise` is its
sort-free form for the serving scan, and :func:`greedy_schedule` is a jitted ``lax.scan``.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from ..specs import ModelSpec, SpecError
from . import perf
from .geometry import hop_matrix
from .hardware import WaferParams, WaferSpec
from .layout import Layout
from .plan import InstanceConfig, model_params, tp_plan

NOT_ALLOWED = 3
POLICIES = ("greedy", "local")


# --------------------------------------------------------------------------- capacities and priorities


@dataclass
class DieBudget:
    """Per-die DRAM budget ``[D]`` (bytes)."""

    capacity: np.ndarray     # physical DRAM
    usable: np.ndarray       # usable share
    resident: np.ndarray     # weights + workspace + prefill in-flight KV reserve
    free: np.ndarray         # usable - resident (>= 0), what the scheduler may fill with KV
    instance: np.ndarray     # instance index in layout.instances, -1 for idle dies


def die_budget(model: ModelSpec, wafer: WaferSpec, layout: Layout, prefill: InstanceConfig,
               decode: InstanceConfig, chunk_tokens: int = 2048, max_batch: int = 512,
               reserve_prompt_tokens: float = 0.0) -> DieBudget:
    """DRAM budget of every die given the instances placed on it.

    Args:
      prefill, decode: instance configs (shape up to rotation, and TP strategy) of the layout's instances.
      chunk_tokens, max_batch: iteration sizes for the activation workspace.
      reserve_prompt_tokens: prompt tokens of in-flight prefill KV each prefill instance keeps (e.g. the
        workload's longest prompt).

    Raises:
      SpecError: an instance's weights do not fit its dies.
    """
    mp = model_params(model, jnp.float64 if jax.config.jax_enable_x64 else jnp.float32)
    hw = WaferParams.from_spec(wafer, np.float64)
    d = wafer.num_dies
    usable = np.full(d, wafer.dram_capacity * wafer.usable_dram_fraction)
    resident = np.zeros(d)
    occ = layout.occupancy().ravel()
    for kind, cfg, tokens, reserve in (("prefill", prefill, chunk_tokens, reserve_prompt_tokens),
                                       ("decode", decode, max_batch, 0.0)):
        plan = tp_plan(model, wafer, cfg, np.float64)
        need = float(perf.weight_bytes_per_die(mp, hw, plan)) + float(perf.workspace_bytes(mp, hw, float(tokens))) \
            + reserve * float(perf.kv_bytes_per_token_per_die(mp, hw, plan))
        if need > usable[0]:
            raise SpecError(f"{kind} instance {cfg.label} needs {need / 1e9:.1f} GB per die but {wafer.name} dies have "
                            f"{usable[0] / 1e9:.1f} GB usable; use larger instances or dies with more DRAM")
        for i, inst in enumerate(layout.instances):
            if inst.kind != kind:
                continue
            if {inst.rows, inst.cols} != {cfg.rows, cfg.cols} or inst.rows * inst.cols != cfg.dies:
                raise SpecError(f"layout {kind} instance {inst.rows}x{inst.cols} does not match config {cfg.label}")
            resident[occ == i] = need
    return DieBudget(capacity=np.full(d, float(wafer.dram_capacity)), usable=usable, resident=resident,
                     free=np.maximum(usable - resident, 0.0), instance=occ.copy())


def priority_table(wafer: WaferSpec, layout: Layout, policy: str = "greedy") -> np.ndarray:
    """Location priority ``[P, Q, D]`` (0..2, 3 = not allowed) of every die for each (prefill, decode) pair."""
    if policy not in POLICIES:
        raise SpecError(f"unknown memory policy {policy!r}; choose from {', '.join(POLICIES)}")
    pre, dec = layout.prefill, layout.decode
    cols = wafer.cols
    rr, cc = np.divmod(np.arange(wafer.num_dies), cols)
    table = np.full((len(pre), len(dec), wafer.num_dies), NOT_ALLOWED, dtype=np.int32)
    for q, dq in enumerate(dec):
        in_q = np.zeros(wafer.num_dies, bool)
        for r, c in dq.cells():
            in_q[r * cols + c] = True
        for p, dp in enumerate(pre):
            t = table[p, q]
            if policy == "greedy":
                (r0, c0), (r1, c1) = dp.centre, dq.centre
                lo_r, hi_r, lo_c, hi_c = min(r0, r1), max(r0, r1), min(c0, c1), max(c0, c1)
                outside = np.maximum(lo_r - rr, 0) + np.maximum(rr - hi_r, 0) + np.maximum(lo_c - cc, 0) \
                    + np.maximum(cc - hi_c, 0)
                t[outside == 1] = 2
                t[outside == 0] = 1
                for r, c in dp.cells():
                    t[r * cols + c] = min(t[r * cols + c], 1)
            t[in_q] = 0
    return table


def decode_hops(wafer: WaferSpec, layout: Layout) -> np.ndarray:
    """``[Q, D]`` hops from each die to the nearest die of each decode instance (0 on the instance)."""
    hm = hop_matrix(wafer)
    out = np.zeros((len(layout.decode), wafer.num_dies), dtype=np.int64)
    for q, dq in enumerate(layout.decode):
        ids = [r * wafer.cols + c for r, c in dq.cells()]
        out[q] = hm[:, ids].min(axis=1)
    return out


def remote_kv(wafer: WaferSpec, layout: Layout, decode_index: int, kv_tokens_per_die, dtype=jnp.float32) -> perf.RemoteKV:
    """The KV a decode instance reads from other dies, as :class:`~mocap_jax.wsc.perf.RemoteKV`.

    Args:
      decode_index: which instance of ``layout.decode``.
      kv_tokens_per_die: ``[D]`` KV tokens of that instance's batch held on each die
        (bytes / KV bytes per token); entries on the instance itself are local.

    Returns:
      RemoteKV with one location per die (``[D]``, zero tokens on the instance and where
      nothing is held), hops to the instance, and the instance's real ingress links
      (directed links from outside dies into it, wafer edges excluded).
    """
    if not 0 <= decode_index < len(layout.decode):
        raise SpecError(f"decode_index {decode_index} out of range: the layout has {len(layout.decode)} decode instances")
    kv = np.asarray(kv_tokens_per_die, dtype=float)
    if kv.shape != (wafer.num_dies,) or np.any(kv < 0):
        raise SpecError(f"kv_tokens_per_die must be {wafer.num_dies} non-negative numbers, one per die")
    hops = decode_hops(wafer, layout)[decode_index]
    inst = layout.decode[decode_index]
    cells = set(inst.cells())
    ingress = 0
    for r, c in cells:
        for rr, cc in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
            if 0 <= rr < wafer.rows and 0 <= cc < wafer.cols and (rr, cc) not in cells:
                ingress += 1
    return perf.RemoteKV(tokens=np.where(hops > 0, kv, 0.0).astype(dtype), hops=hops.astype(dtype),
                         internode=np.zeros(wafer.num_dies, dtype), ingress_links=np.asarray(ingress, dtype))


# --------------------------------------------------------------------------- the greedy rule


def greedy_allocate(free, need, priority, xp=jnp):
    """Place ``need`` bytes on dies by (priority, most free first); all or nothing.

    Args:
      free: ``[D]`` free bytes per die.
      need: scalar bytes to place.
      priority: ``[D]`` location priority (``NOT_ALLOWED`` = 3 excludes the die).

    Returns:
      (alloc ``[D]`` bytes taken from each die (zeros if not placed), placed bool).
    """
    allowed = priority < NOT_ALLOWED
    f = xp.where(allowed, free, 0.0)
    order = xp.lexsort((-f, priority))
    fs = f[order]
    before = xp.cumsum(fs) - fs
    take = xp.clip(need - before, 0.0, fs)
    placed = xp.sum(f) >= need
    take = xp.where(placed, take, 0.0)
    alloc = take[xp.argsort(order)]
    return alloc, placed


def greedy_allocate_pairwise(free, need, priority):
    """:func:`greedy_allocate` without sorting (same rule, same result up to rounding), in ``jax.numpy``.

    Dies are taken in the order (priority, most free first, lowest index); the bytes
    before die ``d`` in that order are summed from an ``[D, D]`` comparison instead of a
    cumulative sum over a sorted copy, which compiles much faster inside a scan.  Row ``d`` of the
    comparison holds the dies before ``d``, so each sum runs along contiguous memory (summed down
    the columns, XLA:CPU splits a wafer's 54 rows into windows; docs/wsc_llm.md, "Performance").  A
    sum may differ from the sorted cumulative sum in its last float32 bit.

    Args:
      free: ``[D]`` free bytes.  need: bytes to place.  priority: ``[D]`` (3 = not allowed).

    Returns:
      (alloc ``[D]`` bytes, placed bool); all or nothing.
    """
    allowed = priority < NOT_ALLOWED
    f = jnp.where(allowed, free, 0.0)
    idx = jnp.arange(f.shape[0])
    pj, pd = priority[None, :], priority[:, None]                     # [d, j]: die j before die d?
    fj, fd = f[None, :], f[:, None]
    before = (pj < pd) | ((pj == pd) & ((fj > fd) | ((fj == fd) & (idx[None, :] < idx[:, None]))))
    taken_before = jnp.sum(jnp.where(before, fj, 0.0), axis=1)
    placed = jnp.sum(f) >= need
    take = jnp.clip(need - taken_before, 0.0, f)
    return jnp.where(placed, take, 0.0), placed


@jax.jit
def greedy_schedule(free, prefill, decode, need, table):
    """Greedy placement of a sequence of requests with no releases (``lax.scan``).

    Args:
      free: ``[D]`` free bytes per die at the start.
      prefill, decode: ``[R]`` int instance indices of each request.
      need: ``[R]`` KV bytes of each request (0 = padding).
      table: ``[P, Q, D]`` location priorities.

    Returns:
      (alloc ``[R, D]``, placed ``[R]`` bool, paused ``[R]`` bool, free after ``[D]``).
      A request whose KV does not fit pauses its prefill instance; later requests of a
      paused instance are paused too (not placed).
    """
    n_pre = table.shape[0]

    def step(carry, x):
        free, paused_inst = carry
        p, q, b = x
        blocked = paused_inst[p]
        alloc, ok = greedy_allocate(free, b, table[p, q], jnp)
        ok = ok & ~blocked
        alloc = jnp.where(ok, alloc, 0.0)
        paused = ~ok & (b > 0)
        return (free - alloc, paused_inst.at[p].set(paused_inst[p] | paused)), (alloc, ok & (b > 0), paused)

    (free, _), (alloc, placed, paused) = jax.lax.scan(step, (free, jnp.zeros(n_pre, bool)), (prefill, decode, need))
    return alloc, placed, paused, free


__all__ = ["NOT_ALLOWED", "POLICIES", "DieBudget", "die_budget", "priority_table", "decode_hops", "remote_kv",
           "greedy_allocate", "greedy_allocate_pairwise", "greedy_schedule"]
