"""Many configurations at once: ``jit(vmap(evaluate))`` in blocks, sharded over the local devices.

:func:`evaluate_points` takes a :class:`~mocap_jax.prefill.evaluate.Point` whose leaves are
either shared by every configuration or stacked along a leading axis of ``P`` configurations
(``axes`` says which), evaluates them block by block (a fixed block size, so one compiled
program serves every block of a bucket; the last block is padded), shards each block's
configurations over the local devices, and returns only the fields asked for (XLA then drops
the work nothing reads).

MBKR buckets first evaluate every configuration without MBKR; only the configurations that do
not fit run the spill passes (with the ``overflow`` policy a configuration that fits spills
nothing, so its result is its plain result exactly).  :func:`spill_compacted` moves them to the
front of the block, so the steps that hold none of them skip the spill program.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from ..costs.computed_once import COMPILE_BOUND_OPTIONS, COMPILER_OPTIONS
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


def evaluate_vmapped(points: Point, shape: SimShape, axes, fields: Sequence[str] = ALL_FIELDS) -> dict:
    """``vmap(evaluate)`` over the batched leaves of ``points`` (``axes``: a :class:`Point` of 0 / None),
    returning ``fields``; every configuration runs the program of ``shape`` (with MBKR: the spill passes)."""
    return jax.vmap(lambda p: _fields(evaluate(p, shape), fields), in_axes=(axes,))(points)


def spills_needed(shape: SimShape) -> bool:
    """Whether a configuration that fits without MBKR may be told apart from one that needs the spill
    passes (MBKR on, ``overflow`` policy: a configuration that fits keeps its plain result)."""
    return shape.mbkr != MBKRMode.OFF and shape.spill == Spill.OVERFLOW


def plain_shape(shape: SimShape) -> SimShape:
    """The same structure without MBKR."""
    return shape._replace(mbkr=MBKRMode.OFF)


def flatten_axes(axes) -> tuple:
    """``axes`` (a :class:`Point` of 0 / None) as ``(leaves, treedef)``: a tuple in leaf order, None kept."""
    leaves, treedef = jax.tree_util.tree_flatten(axes, is_leaf=lambda x: x is None)
    return tuple(leaves), treedef


def join_point(treedef, axes_leaves: tuple, rows: Sequence, shared: Sequence) -> Point:
    """The :class:`Point` whose batched leaves are ``rows`` and shared leaves ``shared``, each in
    ``axes_leaves`` order (the inverse of splitting a point's leaves by their axis)."""
    it_rows, it_shared = iter(rows), iter(shared)
    return jax.tree_util.tree_unflatten(treedef, [next(it_shared) if ax is None else next(it_rows)
                                                  for ax in axes_leaves])


def evaluate_many(points: Point, shape: SimShape, axes, fields: Sequence[str] = ALL_FIELDS) -> dict:
    """:func:`evaluate_vmapped`, running the spill passes only on the configurations that do not fit
    without them, a compaction step at a time (:func:`spill_compacted`).  Traceable (the B' search of
    the annealing objective runs it inside its loop); :func:`evaluate_points` compiles it."""
    if not spills_needed(shape):
        return evaluate_vmapped(points, shape, axes, fields)
    leaves = jax.tree_util.tree_leaves(points)
    axes_leaves, treedef = flatten_axes(axes)
    rows = [x for x, ax in zip(leaves, axes_leaves) if ax is not None]
    shared = [x for x, ax in zip(leaves, axes_leaves) if ax is None]
    P = rows[0].shape[0]
    run = lambda block_rows, sh: evaluate_vmapped(join_point(treedef, axes_leaves, block_rows, shared), sh, axes,
                                                  tuple(fields) + ("feasible",))

    plain = run(rows, plain_shape(shape))
    out = spill_compacted(rows, plain["feasible"], plain, lambda r: run(r, shape), compaction_step(shape, P))
    return {f: out[f] for f in fields}


#: item-stage cells of one step of the spill passes inside a traced evaluation (:func:`evaluate_many`):
#: half a plain step's, so that a few configurations that do not fit run the passes almost alone.
#: Measured on the annealing benchmark's B' search (1,024 configurations of 16 items x 16 stages on
#: one device, medians of 9 calls, three rounds alternated): 256 configurations per step took 48-53 ms
#: where every configuration needed the passes and 13-16 ms where one in 16 did; one step of all
#: 1,024, 62-67 ms either way; 64 per step, 61-64 and 6-8 ms.
SPILL_STEP_CELLS = 1 << 16


def compaction_step(shape: SimShape, count: int) -> int:
    """Configurations per step of :func:`evaluate_many`'s spill passes: about :data:`SPILL_STEP_CELLS`
    item-stage cells, a power of two that divides ``count``."""
    return min(_power_of_two_step(shape, SPILL_STEP_CELLS), count & -count)


def spill_compacted(rows, fits, plain: dict, spilled, step: int) -> dict:
    """``plain`` where a configuration fits, ``spilled(rows)`` where it does not; the spill program
    runs only on the steps that hold a configuration that does not fit.

    ``rows``: a pytree of ``[P, ...]`` leaves (P a multiple of ``step``); ``fits [P]``; ``plain``:
    the fields of every configuration without MBKR (``[P, ...]``); ``spilled``: a step of ``step``
    rows -> the same fields, shapes and dtypes.  The configurations that do not fit are moved to
    the front in their order (a counting sort: ``rank`` is each configuration's new position and
    undoes the move), so ``ceil(count / step)`` steps run the spill passes and the rest return
    zeros, unused.
    """
    P = fits.shape[0]
    fits_i = fits.astype(jnp.int32)
    count = P - jnp.sum(fits_i)
    rank = jnp.where(fits, count + jnp.cumsum(fits_i) - 1, jnp.cumsum(1 - fits_i) - 1)
    order = jnp.zeros(P, jnp.int32).at[rank].set(jnp.arange(P, dtype=jnp.int32), unique_indices=True)
    moved = jax.tree_util.tree_map(lambda x: x[order].reshape((P // step, step) + x.shape[1:]), rows)
    skipped = {k: jnp.zeros((step,) + a.shape[1:], a.dtype) for k, a in plain.items()}

    def one(args):
        j, r = args
        return jax.lax.cond(j * step < count, lambda: spilled(r), lambda: skipped)

    out = jax.lax.map(one, (jnp.arange(P // step), moved))
    back = lambda a: a.reshape((P,) + a.shape[2:])[rank]
    pick = lambda a, b: jnp.where(fits.reshape((P,) + (1,) * (a.ndim - 1)), a, back(b))
    return {k: pick(plain[k], out[k]) for k in plain}


def in_steps(rows, step: int, plain, spilled=None) -> dict:
    """``plain`` over ``rows`` (a pytree of ``[P, ...]`` leaves, P a multiple of ``step``), ``step``
    rows at a time (``lax.map``); with ``spilled``, the rows whose ``plain(...)["feasible"]`` is
    false then get ``spilled``'s fields instead (:func:`spill_compacted`)."""
    P = jax.tree_util.tree_leaves(rows)[0].shape[0]
    steps = jax.tree_util.tree_map(lambda x: x.reshape((P // step, step) + x.shape[1:]), rows)
    out = jax.tree_util.tree_map(lambda a: a.reshape((P,) + a.shape[2:]), jax.lax.map(plain, steps))
    return out if spilled is None else spill_compacted(rows, out["feasible"], out, spilled, step)


#: item-stage cells of one vectorised step: a step's arrays then stay in the CPU caches (measured:
#: 256 chunked pipelines of 32 items x 16 stages per step run about twice as fast per point as 4,096)
STEP_CELLS = 1 << 17


def step_size(shape: SimShape) -> int:
    """Configurations per vectorised step of a block: a power of two in [8, 4096], about
    :data:`STEP_CELLS` item-stage cells."""
    return _power_of_two_step(shape, STEP_CELLS)


def _power_of_two_step(shape: SimShape, cells: int) -> int:
    """The power of two in [8, 4096] configurations nearest below ``cells`` item-stage cells."""
    per = shape.items * shape.batches * shape.stages
    return int(min(4096, max(8, 1 << max(0, (cells // per).bit_length() - 1))))


def evaluate_steps(batched: list, shared: list, treedef, axes_leaves: tuple, shape: SimShape, fields: tuple,
                   step: int) -> dict:
    """:func:`evaluate_many` of a block, ``step`` configurations at a time (``lax.map``; the block's
    length is a multiple of ``step`` or smaller than it); with MBKR, every step first without it, then
    the spill passes for the configurations that do not fit (:func:`spill_compacted`).
    ``batched`` / ``shared``: the block's leaves with and without the configuration axis, in
    ``axes_leaves`` order."""
    axes = jax.tree_util.tree_unflatten(treedef, axes_leaves)
    run = lambda rows, evaluate_fn, sh, fs: evaluate_fn(join_point(treedef, axes_leaves, rows, shared), sh, axes, fs)

    if batched[0].shape[0] <= step:
        return run(batched, evaluate_many, shape, fields)
    if not spills_needed(shape):
        return in_steps(batched, step, lambda r: run(r, evaluate_vmapped, shape, fields))
    with_fits = tuple(fields) + ("feasible",)
    out = in_steps(batched, step, lambda r: run(r, evaluate_vmapped, plain_shape(shape), with_fits),
                   lambda r: run(r, evaluate_vmapped, shape, with_fits))
    return {f: out[f] for f in fields}


#: configurations per compiled call, by default (bounds memory)
BLOCK = 16384
#: a block's work, in item-stage cells (an MBKR cell counting :data:`MBKR_CELL_WEIGHT`), below which it
#: runs on one device: on CPU, sharding a call over several devices costs a fixed few milliseconds
#: (measured on 2 cores: 6.7 against 1.6 ms for 8 TeraPipe configurations of 32 items x 16 stages;
#: one device stayed faster up to about 6,000 of them, and up to about 64 such MBKR configurations)
SHARD_CELLS = 1 << 21
#: an MBKR configuration's work relative to a plain one of the same cells (its spill passes; measured
#: 26x at 32 items, every configuration spilling)
MBKR_CELL_WEIGHT = 32


def _block_size(count: int, block: int) -> int:
    """Configurations per compiled call before rounding to whole steps: ``block``, or fewer configurations
    padded to a power of two (at least 8), so counts inside a bucket share programs."""
    return block if count > block else min(bucket(count, 8), block)


def _block_cells(shape: SimShape, size: int) -> int:
    """A block's work in item-stage cells, an MBKR cell counting :data:`MBKR_CELL_WEIGHT`."""
    weight = MBKR_CELL_WEIGHT if shape.mbkr != MBKRMode.OFF else 1
    return size * shape.items * shape.batches * shape.stages * weight


def block_devices(shape: SimShape, count: int, block: int = BLOCK, devices: Sequence | None = None) -> list:
    """The devices :func:`evaluate_points` shards each block of ``count`` configurations over.

    ``devices`` (default: every local device, if a block's work reaches :data:`SHARD_CELLS`), or the
    first alone when they do not divide the block.
    """
    size = _block_size(count, block)
    local = list(devices) if devices is not None else jax.local_devices()
    if size % len(local) or (devices is None and _block_cells(shape, size) < SHARD_CELLS):
        return local[:1]
    return local


def block_options(shape: SimShape, count: int, block: int = BLOCK) -> dict:
    """Compile options of the block program for ``count`` configurations: a block whose work is below
    :data:`SHARD_CELLS` is compiled as a single configuration's program is
    (:data:`~mocap_jax.costs.computed_once.COMPILE_BOUND_OPTIONS`), its call being almost all compilation."""
    small = _block_cells(shape, _block_size(count, block)) < SHARD_CELLS
    return COMPILE_BOUND_OPTIONS if small else COMPILER_OPTIONS


@functools.lru_cache(maxsize=128)
def _program(shape: SimShape, fields: tuple, axes_leaves: tuple, treedef, devices: tuple, step: int,
             options: tuple):
    """The compiled block program: ``(batched leaves, shared leaves) -> fields``, each device taking
    its share of the block's configurations (``shard_map``); ``options``: compile options as items."""
    fn = functools.partial(evaluate_steps, treedef=treedef, axes_leaves=axes_leaves, shape=shape, fields=fields,
                           step=step)
    options = dict(options)
    if len(devices) == 1:
        return jax.jit(fn, compiler_options=options), None, None
    mesh = jax.make_mesh((len(devices),), ("points",), axis_types=(AxisType.Auto,), devices=devices)
    rows = NamedSharding(mesh, PartitionSpec("points"))
    shared = NamedSharding(mesh, PartitionSpec())
    mapped = jax.shard_map(fn, mesh=mesh, in_specs=(PartitionSpec("points"), PartitionSpec()),
                           out_specs=PartitionSpec("points"), check_vma=False)
    return jax.jit(mapped, compiler_options=options), rows, shared


def batch_axes(points: Point, batched_leaf) -> Point:
    """``axes`` for :func:`evaluate_points`: 0 where ``batched_leaf(leaf)`` is true, else None."""
    return jax.tree_util.tree_map(lambda x: 0 if batched_leaf(x) else None, points)


def evaluate_points(points: Point, shape: SimShape, axes, count: int, fields: Sequence[str] = ALL_FIELDS,
                    block: int = BLOCK, devices: Sequence | None = None) -> dict[str, np.ndarray]:
    """Evaluate ``count`` configurations; returns NumPy arrays with a leading axis ``count``.

    Args:
      points: host-side :class:`Point` whose batched leaves (``axes`` 0) have a leading axis ``count``.
      shape: the bucket's static structure.
      axes: a :class:`Point` of 0 (batched) / None (shared) leaves.
      fields: :class:`Evaluation` fields to return.
      block: configurations per compiled call (bounds memory); fewer configurations than a block
        are padded to a power of two (at least 8), so counts inside a bucket share programs.
        Inside a call the configurations run :func:`step_size` at a time.
      devices: devices to shard each block over, when they divide it (default: every local device, for
        blocks whose work pays for sharding; :func:`block_devices`).
    """
    size = _block_size(count, block)
    local = block_devices(shape, count, block, devices)
    nd = len(local)
    step = min(step_size(shape), size // nd)
    size = -(-size // (step * nd)) * step * nd
    leaves, treedef = flatten_axes(axes)
    options = tuple(block_options(shape, count, block).items())
    program, rows, shared = _program(shape, tuple(fields), leaves, treedef, tuple(local), step, options)
    flat_points = jax.tree_util.tree_leaves(points)
    shared_leaves = [np.asarray(x) for x, ax in zip(flat_points, leaves) if ax is None]
    if shared is not None:
        shared_leaves = [jax.device_put(x, shared) for x in shared_leaves]
    outs, pending = [], None

    def fetch(first, n, o):
        """A block's fields on the host, checked (while the next block runs)."""
        out = {k: np.asarray(v)[:n] for k, v in jax.device_get(o).items()}
        check_honest(out, first)
        return out

    for lo in range(0, count, size):
        hi = min(count, lo + size)
        block_rows = []
        for leaf, ax in zip(flat_points, leaves):
            if ax is None:
                continue
            x = np.asarray(leaf)[lo:hi]
            if len(x) < size:
                x = np.concatenate([x, np.repeat(x[-1:], size - len(x), axis=0)])
            block_rows.append(x if rows is None else jax.device_put(x, rows))
        running = (lo, hi - lo, program(block_rows, shared_leaves))
        if pending is not None:                  # fetch the previous block while this one runs
            outs.append(fetch(*pending))
        pending = running
    outs.append(fetch(*pending))
    return outs[0] if len(outs) == 1 else {k: np.concatenate([o[k] for o in outs]) for k in outs[0]}


class DishonestResult(RuntimeError):
    """An evaluation broke an invariant every result must keep (a bug, never a published number)."""


def check_honest(out: dict, first: int = 0) -> None:
    """Every feasible point has a finite, positive latency and throughput and non-negative, finite memory;
    no value is NaN.  A violation raises :class:`DishonestResult` naming the first offending point
    (``first``: the index of ``out``'s first point among those of the call)."""
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
        raise DishonestResult(f"point {first + i} of this evaluation: {why[i]}; values: "
                              + ", ".join(f"{k}={np.asarray(v[i]).ravel()[:4].tolist()}" for k, v in out.items()
                                          if k in ("feasible", "prefill_latency_s", "throughput_rps")))
