"""Simulated annealing over thousands of chains at once: the one annealer of the package.

A search is a hashable *problem* (evosax style: static structure in the object, numbers in a
``ctx`` pytree) with two methods:

* ``propose(bits, x, ctx) -> (x_new, valid)`` -- one move of one chain's state ``x`` (an int
  vector, e.g. chunk sizes in units, or a die permutation) from ``bits``, :data:`PROPOSAL_WORDS`
  random uint32 words (:func:`uniform` and :func:`randint` turn them into numbers);
* ``evaluate(xs, ctx, aux) -> (values, aux)`` -- the objective of ``[C, D]`` states at once
  (lower is better, ``inf`` = infeasible), given and returning one int of auxiliary state per
  chain (``aux [C]``: what the problem knows about each chain's current state that helps
  evaluate its neighbours, e.g. its largest feasible batch; kept only for accepted moves).

:func:`init` builds chains whose first :func:`step` evaluates the starting states themselves
(so one compiled program serves the whole search); every later step proposes one move per
chain, evaluates all proposals in one batched call and accepts each with the Metropolis rule at a
temperature cooled geometrically from ``t_start`` to ``t_end`` (relative to a reference
objective); :func:`anneal` runs the steps.  Chain c's random words at step i are a counter-based hash of
(seed, c, i, word) (:func:`random_words`), so a chain's path does not depend on how the chains
are split over devices, and a fixed seed gives the same answer; the hash is a few integer
operations, where a threefry key split per chain and step made the step program several times
slower to compile.  With several local devices the chains are
split over them (``shard_map``, no collectives: every device evaluates and updates its own chains).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from ..costs import pytree
from ..costs.computed_once import COMPILE_BOUND_OPTIONS, COMPILER_OPTIONS

Array = Any

#: relative objective of an infeasible state (far above any feasible one)
PENALTY = 1e6
#: steps queued ahead of the running one: queueing thousands at once ran 20-80% slower on a 2-core
#: CPU; waiting every few steps still hides the dispatch
DISPATCH_AHEAD = 8
#: a search of fewer chain steps (chains x steps) compiles its step program with the options of a
#: program whose call is almost all compilation (XLA:CPU's loop emitters: a shorter compile, but an
#: objective's MBKR spill passes several times slower per step; docs/performance.md, "Programs whose
#: call is almost all compilation")
LOOP_EMITTERS_BELOW_CHAIN_STEPS = 2048


def compile_bound(chain_steps: int) -> bool:
    """Whether a search of ``chain_steps`` chain steps compiles with the compile-bound options
    (:data:`LOOP_EMITTERS_BELOW_CHAIN_STEPS`)."""
    return chain_steps < LOOP_EMITTERS_BELOW_CHAIN_STEPS


@pytree
class Chains:
    """State of ``C`` annealing chains over ``D``-long int states.

    Fields:
      x: ``[C, D]`` current states.
      value: ``[C]`` their objectives relative to the reference (``PENALTY`` if infeasible).
      best: ``[C, D]`` best state each chain has visited; best_value: ``[C]`` its relative objective.
      accepted: ``[C]`` moves accepted.
      aux: ``[C]`` int auxiliary state of each chain's current state (see ``evaluate``).
      index: ``[C]`` int global chain numbers (they pick each chain's random numbers).
      step: int scalar, steps taken.
    """

    x: Array
    value: Array
    best: Array
    best_value: Array
    accepted: Array
    aux: Array
    index: Array
    step: Array


@pytree
class Schedule:
    """Cooling schedule (traced scalars): temperature ``t_start * (t_end / t_start) ** (i / (steps - 1))``
    at step i, relative to ``reference`` (objective units)."""

    t_start: Array
    t_end: Array
    steps: Array
    reference: Array


class AnnealResult(NamedTuple):
    """Best state over all chains, its objective, per-chain best objectives, the acceptance rate
    and each chain's best state (``[C, D]``)."""

    x: np.ndarray
    objective: float
    chain_best: np.ndarray
    accept_rate: float
    chain_states: np.ndarray


#: random uint32 words a proposal receives
PROPOSAL_WORDS = 4


def _mix(h):
    """MurmurHash3's 32-bit finaliser: a bijection of uint32 that spreads every input bit."""
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def random_words(seed, chain, step, count: int):
    """``[count]`` uint32 words of chain ``chain`` at step ``step`` (a counter-based hash)."""
    base = _mix(jnp.uint32(seed) ^ _mix(jnp.asarray(chain, jnp.uint32) * jnp.uint32(0x9E3779B9)
                                        + jnp.asarray(step, jnp.uint32) * jnp.uint32(0x632BE5AB)))
    return _mix(base + jnp.arange(count, dtype=jnp.uint32) * jnp.uint32(0x7F4A7C15))


def uniform(word):
    """A float in [0, 1) from a uint32 word (its top 24 bits, exact in float32)."""
    return (word >> 8).astype(jnp.float32) * jnp.float32(2.0 ** -24)


def randint(word, low, high):
    """An int in ``[low, high)`` from a uint32 word (modulo the range; bias below 1e-5 for ranges under 40,000)."""
    span = jnp.maximum(jnp.asarray(high) - jnp.asarray(low), 1).astype(jnp.uint32)
    return (jnp.asarray(low) + (word % span).astype(jnp.int32)).astype(jnp.int32)


def relative(values, reference):
    """Objectives relative to ``reference``, ``PENALTY`` where infeasible."""
    return jnp.where(jnp.isfinite(values), values / reference, PENALTY)


def init(x0, aux) -> Chains:
    """Chains at ``x0 [C, D]`` with auxiliary states ``aux [C]``, not yet evaluated: their first
    :func:`step` evaluates ``x0`` (``step = -1``)."""
    x0 = np.asarray(x0, np.int32)
    C = x0.shape[0]
    unknown = np.full((C,), PENALTY, np.float32)
    # every field its own buffer: the step donates its input chains
    return Chains(x=x0.copy(), value=unknown.copy(), best=x0.copy(), best_value=unknown.copy(),
                  accepted=np.zeros((C,), np.int32), aux=np.asarray(aux, np.int32).copy(),
                  index=np.arange(C, dtype=np.int32), step=np.full((), -1, np.int32))


def step(problem, chains: Chains, seed, schedule: Schedule, ctx) -> Chains:
    """One move of every chain: propose, evaluate all proposals at once, accept by the Metropolis
    rule.  The first step (``chains.step == -1``) evaluates and takes the current states instead."""
    starting = chains.step < 0
    words = jax.vmap(lambda c: random_words(seed, c, chains.step, PROPOSAL_WORDS + 1))(chains.index)
    proposal, valid = jax.vmap(lambda w, x: problem.propose(w, x, ctx))(words[:, :PROPOSAL_WORDS], chains.x)
    proposal = jnp.where(starting, chains.x, proposal)
    raw, aux = problem.evaluate(proposal, ctx, chains.aux)
    values = relative(raw, schedule.reference)
    frac = jnp.maximum(chains.step, 0).astype(jnp.float32) / jnp.maximum(schedule.steps - 1, 1).astype(jnp.float32)
    temperature = schedule.t_start * (schedule.t_end / schedule.t_start) ** frac
    u = uniform(words[:, PROPOSAL_WORDS])
    accept = starting | (valid & ((values <= chains.value) | (u < jnp.exp(-(values - chains.value) / temperature))))
    x = jnp.where(accept[:, None], proposal, chains.x)
    value = jnp.where(accept, values, chains.value)
    better = starting | (value < chains.best_value)
    return Chains(x=x, value=value, best=jnp.where(better[:, None], x, chains.best),
                  best_value=jnp.where(better, value, chains.best_value),
                  accepted=chains.accepted + (accept & ~starting).astype(jnp.int32),
                  aux=jnp.where(accept, aux, chains.aux), index=chains.index, step=chains.step + 1)


def rescale(chains: Chains, reference: float) -> Chains:
    """Chains whose objectives were taken relative to 1, expressed relative to ``reference``."""
    scale = lambda v: np.where(v >= PENALTY, PENALTY, np.asarray(v) / reference).astype(np.float32)
    return Chains(x=chains.x, value=scale(chains.value), best=chains.best, best_value=scale(chains.best_value),
                  accepted=chains.accepted, aux=chains.aux, index=chains.index, step=chains.step)


def chain_devices(chains: int, devices: int | None = None) -> tuple:
    """Local devices the chains are split over: every local CPU device when they divide the chains."""
    local = jax.local_devices()
    if devices is None:
        devices = len(local) if local[0].platform == "cpu" and chains % len(local) == 0 else 1
    if devices < 1 or devices > len(local) or chains % devices:
        raise ValueError(f"cannot split {chains} chains over {devices} of the {len(local)} local devices; "
                         "choose a device count that divides the chains")
    return tuple(local[:devices])


@functools.lru_cache(maxsize=64)
def _programs(problem, devices: tuple, steps_per_call: int, short: bool):
    """The compiled step program (one step per call, or ``count`` steps in a loop when
    ``steps_per_call > 1``) for chains split over ``devices``, and where to put inputs; ``short``:
    compiled with the compile-bound options (:func:`compile_bound`)."""
    options = COMPILE_BOUND_OPTIONS if short else COMPILER_OPTIONS
    def fn(chains, seed, schedule, ctx, count):
        if steps_per_call == 1:
            return step(problem, chains, seed, schedule, ctx)
        return jax.lax.fori_loop(0, count, lambda _, c: step(problem, c, seed, schedule, ctx), chains)

    if len(devices) == 1:
        return jax.jit(fn, donate_argnums=(0,), compiler_options=options), None, None
    mesh = jax.make_mesh((len(devices),), ("chains",), axis_types=(AxisType.Auto,), devices=devices)
    rows, shared = PartitionSpec("chains"), PartitionSpec()
    chain_spec = Chains(x=rows, value=rows, best=rows, best_value=rows, accepted=rows, aux=rows, index=rows,
                        step=shared)
    stepped = jax.shard_map(fn, mesh=mesh, in_specs=(chain_spec, shared, shared, shared, shared),
                            out_specs=chain_spec, check_vma=False)
    place_rows = jax.tree_util.tree_map(lambda spec: NamedSharding(mesh, spec), chain_spec,
                                        is_leaf=lambda x: isinstance(x, PartitionSpec))
    program = jax.jit(stepped, donate_argnums=(0,), compiler_options=options)
    return program, place_rows, NamedSharding(mesh, shared)


class _Run(NamedTuple):
    """A search's compiled step program and its inputs placed on the chains' devices."""

    stepped: Any
    put: Any
    rows: Any
    shared: Any
    seed: Any
    ctx: Any


def _first_step(problem, x0, aux, ctx, seed: int, devices, steps_per_call: int, steps: int) -> tuple[Chains, _Run]:
    """Chains at ``x0 [C, D]`` after their first step, which evaluates ``x0`` itself (objectives
    relative to 1; the cooling schedule does not enter it), and the run that took it: the program of
    a search of ``steps`` steps."""
    C = x0.shape[0]
    stepped, rows, shared = _programs(problem, chain_devices(C, devices), steps_per_call, compile_bound(C * steps))
    put = (lambda x, where: jax.device_put(x, where)) if rows is not None else (lambda x, where: x)
    run = _Run(stepped, put, rows, shared, put(np.uint32(seed), shared), put(ctx, shared))
    first = Schedule(t_start=np.float32(1.0), t_end=np.float32(1.0), steps=np.int32(1), reference=np.float32(1.0))
    chains = stepped(put(init(x0, aux), rows), run.seed, put(first, shared), run.ctx, put(np.int32(1), shared))
    return chains, run


def evaluate_states(problem, xs, ctx, aux=None, devices: int | None = None,
                    steps: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """``problem.evaluate`` of ``xs [C, D]`` (auxiliary states ``aux [C]``, default the problem's
    ``initial_aux``): ``(values [C], aux [C])``, values ``inf`` where infeasible (or at least
    :data:`PENALTY`).

    It runs the annealer's own step program (whose first step evaluates the states it starts
    from), so scoring as many states over the same devices as a search of ``steps`` steps compiles
    nothing beside that search.
    """
    xs = np.asarray(xs, np.int32)
    aux = np.asarray(problem.initial_aux(ctx, xs.shape[0]) if aux is None else aux, np.int32)
    chains, _ = _first_step(problem, xs, aux, ctx, 0, devices, 1, steps)
    values = np.asarray(chains.value)
    return np.where(values >= PENALTY, np.inf, values), np.asarray(chains.aux)


def anneal(problem, ctx, x0, seed: int, steps: int = 2000, t_start: float = 0.02, t_end: float = 1e-4,
           reference: float | None = None, devices: int | None = None, steps_per_call: int = 1,
           progress=None) -> AnnealResult:
    """Simulated annealing of ``C`` chains from ``x0 [C, D]``.

    Args:
      problem: hashable object with ``propose`` and ``evaluate`` (see the module docstring).
      ctx: pytree of numbers the problem reads (traced; new values reuse the compiled program).
      x0: ``[C, D]`` starting states (every one valid).
      seed: int seed of the chains' random words (a fixed seed gives identical results).
      steps: moves per chain.
      t_start, t_end: temperatures relative to ``reference`` (default: the best starting objective).
      devices: local devices to split the chains over (default every CPU device when they divide
        the chains); the result does not depend on it.
      steps_per_call: steps run inside one compiled call (many for a cheap objective, whose steps
        would otherwise be dominated by dispatch; 1 for an objective that loops internally, which
        ran several times slower nested in another loop on CPU).  Must divide ``steps``.  XLA
        compiles the objective inside the loop differently, so a floating-point objective may
        differ in its last bits from one step per call, and a Metropolis decision that hinges on
        them may differ too: compare searches at the same ``steps_per_call``.
      progress: optional callable given ``(steps taken, steps)`` once the inputs are checked (before
        the first evaluation, which compiles, so a bar shows while it does) and as the steps complete
        (every :data:`DISPATCH_AHEAD` calls and at the end), e.g. to advance a progress bar; the
        result does not depend on it.

    Returns:
      :class:`AnnealResult` (objective in the problem's units, ``inf`` if nothing feasible was found).
    """
    x0 = np.asarray(x0, np.int32)
    C = x0.shape[0]
    if steps % steps_per_call:
        raise ValueError(f"steps_per_call={steps_per_call} must divide steps={steps}")
    aux = np.asarray(problem.initial_aux(ctx, C), np.int32)
    chain_devices(C, devices)
    if progress is not None:
        progress(0, steps)
    # the first step evaluates the starting states (objectives relative to 1), which fix the reference
    chains, run = _first_step(problem, x0, aux, ctx, seed, devices, steps_per_call, steps)
    stepped, put, rows, shared = run.stepped, run.put, run.rows, run.shared
    values = np.asarray(chains.value)
    finite = values[values < PENALTY]
    if reference is None:
        reference = float(finite.min()) if finite.size and finite.min() > 0 else 1.0
    chains = put(rescale(jax.device_get(chains), reference), rows)
    cooling = put(Schedule(t_start=np.float32(t_start), t_end=np.float32(t_end), steps=np.int32(steps),
                           reference=np.float32(reference)), shared)
    many = put(np.int32(steps_per_call), shared)
    # the step loop runs in Python around one compiled program (objectives that loop internally ran
    # several times slower nested inside an XLA while loop on CPU); dispatch runs a few steps ahead
    calls = steps // steps_per_call
    for i in range(calls):
        chains = stepped(chains, run.seed, cooling, run.ctx, many)
        if (i + 1) % DISPATCH_AHEAD == 0 or i + 1 == calls:
            chains.value.block_until_ready()
            if progress is not None:
                progress((i + 1) * steps_per_call, steps)
    best_value = np.asarray(chains.best_value) * reference
    i = int(np.argmin(best_value))
    objective = float(best_value[i]) if best_value[i] < PENALTY * reference else float("inf")
    best = np.asarray(chains.best)
    return AnnealResult(best[i], objective, best_value, float(np.asarray(chains.accepted).sum()) / (C * max(steps, 1)),
                        best)
