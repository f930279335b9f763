"""Many configurations at once: ``jit(vmap(evaluate))`` in blocks, sharded over the local devices.

:func:`evaluate_points` takes a :class:`~mocap_jax.prefill.evaluate.Point` whose leaves are
either shared by every configuration or stacked along a leading axis of ``P`` configurations
(``axes`` says which), evaluates them block by block (a fixed block size, so one compiled
program serves every block of a bucket; the last block is padded), shards each block's
configurations over the local devices, and returns only the fields asked for (XLA then drops
the work nothing reads).

MBKR buckets first evaluate every configuration without MBKR; only a block in which some
configuration does not fit runs the spill passes (with the ``overflow`` policy a configuration
that fits spills nothing, so its result is its plain result exactly).
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from ..schedule.shape import MBKRMode, SimShape, Spill, bucket
from .evaluate import Evaluation, Point, evaluate

Array = Any

#: every field of :class:`Evaluation`
ALL_FIELDS = tuple(Evaluation.__dataclass_fields__)
#: the scalar summaries sweeps keep
SUMMARY_FIELDS = ("prefill_latency_s", "raw_latency_s", "feasible", "throughput_rps", "period_s", "bubble_fraction",
                  "overflow", "remote_read_s", "spill_write_s", "migrate_s")


def _fields(ev: Evaluation, fields: Sequence[str]) -> dict:
    return {f: getattr(ev, f) for f in fields}


def evaluate_many(points: Point, shape: SimShape, axes, fields: Sequence[str] = ALL_FIELDS) -> dict:
    """``vmap(evaluate)`` over the batched leaves of ``points`` (``axes``: a :class:`Point` of 0 / None),
    returning ``fields``.  Traceable; :func:`evaluate_points` compiles it."""
    one = lambda p, sh: _fields(evaluate(p, sh), fields)
    if shape.mbkr == MBKRMode.OFF:
        return jax.vmap(lambda p: one(p, shape), in_axes=(axes,))(points)
    plain = jax.vmap(lambda p: one(p, shape._replace(mbkr=MBKRMode.OFF)), in_axes=(axes,))(points)
    spilled = jax.vmap(lambda p: one(p, shape), in_axes=(axes,))
    if shape.spill == Spill.EAGER:
        return spilled(points)
    fits = plain["feasible"] if "feasible" in plain else jax.vmap(
        lambda p: evaluate(p, shape._replace(mbkr=MBKRMode.OFF)).feasible, in_axes=(axes,))(points)
    return jax.lax.cond(jnp.all(fits), lambda: plain, lambda: spilled(points))


@functools.lru_cache(maxsize=128)
def _program(shape: SimShape, fields: tuple, axes_leaves: tuple, treedef, devices: tuple):
    axes = jax.tree_util.tree_unflatten(treedef, axes_leaves)
    fn = functools.partial(evaluate_many, shape=shape, axes=axes, fields=fields)
    if len(devices) == 1:
        return jax.jit(fn), None, None
    mesh = jax.make_mesh((len(devices),), ("points",), axis_types=(AxisType.Auto,), devices=devices)
    rows = NamedSharding(mesh, PartitionSpec("points"))
    shared = NamedSharding(mesh, PartitionSpec())
    return jax.jit(fn, out_shardings=rows), rows, shared


def batch_axes(points: Point, batched_leaf) -> Point:
    """``axes`` for :func:`evaluate_points`: 0 where ``batched_leaf(leaf)`` is true, else None."""
    return jax.tree_util.tree_map(lambda x: 0 if batched_leaf(x) else None, points)


def evaluate_points(points: Point, shape: SimShape, axes, count: int, fields: Sequence[str] = ALL_FIELDS,
                    block: int = 4096, devices: Sequence | None = None) -> dict[str, np.ndarray]:
    """Evaluate ``count`` configurations; returns NumPy arrays with a leading axis ``count``.

    Args:
      points: host-side :class:`Point` whose batched leaves (``axes`` 0) have a leading axis ``count``.
      shape: the bucket's static structure.
      axes: a :class:`Point` of 0 (batched) / None (shared) leaves.
      fields: :class:`Evaluation` fields to return.
      block: configurations per compiled call (bounds memory); fewer configurations than a block
        are padded to a power of two (at least 8), so counts inside a bucket share programs.
      devices: devices to shard each block over (default every local device, when they divide it).
    """
    local = list(devices) if devices is not None else jax.local_devices()
    size = block if count > block else min(bucket(count, 8), block)
    nd = len(local) if size % len(local) == 0 else 1
    leaves, treedef = jax.tree_util.tree_flatten(axes, is_leaf=lambda x: x is None)
    program, rows, shared = _program(shape, tuple(fields), tuple(leaves), treedef, tuple(local[:nd]))
    flat_points = jax.tree_util.tree_leaves(points)
    outs = []
    for lo in range(0, count, size):
        hi = min(count, lo + size)
        block_leaves = []
        for leaf, ax in zip(flat_points, leaves):
            x = np.asarray(leaf)
            if ax is None:
                block_leaves.append(x if shared is None else jax.device_put(x, shared))
                continue
            x = x[lo:hi]
            if len(x) < size:
                x = np.concatenate([x, np.repeat(x[-1:], size - len(x), axis=0)])
            block_leaves.append(x if rows is None else jax.device_put(x, rows))
        out = jax.device_get(program(jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(points), block_leaves)))
        outs.append({k: np.asarray(v)[: hi - lo] for k, v in out.items()})
    out = outs[0] if len(outs) == 1 else {k: np.concatenate([o[k] for o in outs]) for k in outs[0]}
    check_honest(out)
    return out


class DishonestResult(RuntimeError):
    """An evaluation broke an invariant every result must keep (a bug, never a published number)."""


def check_honest(out: dict) -> None:
    """Every feasible point has a finite, positive latency and throughput and non-negative, finite memory;
    no value is NaN.  A violation raises :class:`DishonestResult` naming the first offending point."""
    P = len(next(iter(out.values())))
    bad = np.zeros(P, bool)
    why = np.full(P, "", object)

    def flag(mask, reason):
        new = mask & ~bad
        why[new] = reason
        bad[:] |= mask

    for k, v in out.items():
        if v.dtype.kind == "f":
            flag(np.isnan(v).reshape(P, -1).any(1), f"{k} is NaN")
    feasible = out.get("feasible")
    if feasible is not None:
        for k in ("prefill_latency_s", "raw_latency_s", "throughput_rps", "period_s"):
            if k in out:
                flag(feasible & ~(np.isfinite(out[k]) & (out[k] > 0)), f"feasible with {k} = non-positive or infinite")
        for k in ("peak_mem_bytes_per_stage", "kv_peak_bytes_per_stage", "weight_bytes_per_stage"):
            if k in out:
                v = out[k].reshape(P, -1)
                flag(feasible & ~(np.isfinite(v).all(1) & (v >= 0).all(1)), f"feasible with {k} negative or infinite")
    if bad.any():
        i = int(np.argmax(bad))
        raise DishonestResult(f"point {i} of this evaluation: {why[i]}; values: "
                              + ", ".join(f"{k}={np.asarray(v[i]).ravel()[:4].tolist()}" for k, v in out.items()
                                          if k in ("feasible", "prefill_latency_s", "throughput_rps")))
