"""LBCP: latency-balanced chunk partitioning (DESIGN §7).

1. :func:`proxy_dp` solves the TeraPipe proxy exactly: minimise
   ``sum_i t_i + (N - 1) * max_i t_i`` over partitions of ``S`` into ``M`` chunks of
   multiples of ``g`` (``t_i`` the bottleneck-stage time of chunk i after its prefix).
   For a cap ``T`` on ``max t``, a DP over (chunks used, tokens covered) minimises
   ``sum t``; caps are evaluated as one vmapped batch at a time, in ascending order,
   until no larger cap can win (``dp_inf + (N-1) T >= best``), so the result is exact.
   :func:`terapipe_dp` is TeraPipe's own partitioning of one group of requests: the same
   proxy with the number of chunks free (:mod:`mocap_jax.partition.terapipe` also splits
   a batch into groups).
2. :func:`anneal` refines a partition under any batched objective: one-boundary moves
   by multiples of ``g``, Metropolis acceptance, geometric cooling, thousands of
   chains as one vmapped program, deterministic for a seed.

Units: partitions in tokens at the API, in units of ``g`` inside (``U = S / g``).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from . import chunked_prefill, costs
from .costs import HardwareParams, ModelParams, StageLayout


def check_granularity(seq_len: int, chunks: int | None, granularity: int) -> int:
    """Validate (S, M, g); return ``U = S / g``."""
    if isinstance(granularity, bool) or not isinstance(granularity, (int, np.integer)) or granularity <= 0:
        raise ValueError(f"granularity must be a positive integer number of tokens, got {granularity!r}")
    if seq_len % granularity:
        raise ValueError(f"granularity g={granularity} does not divide seq_len {seq_len}; choose g dividing S "
                         f"(e.g. {np.gcd(seq_len, 256)}) or a sequence length that is a multiple of g")
    U = seq_len // granularity
    if chunks is not None and chunks > U:
        raise ValueError(f"M={chunks} chunks of at least g={granularity} tokens need S >= {chunks * granularity}, "
                         f"but S={seq_len}; use fewer chunks or a smaller g")
    return U


def chunk_cost_matrix(model: ModelParams, hw: HardwareParams, layout: StageLayout, units: int, granularity,
                      batch, n_pad: int):
    """``C[y, x]``: bottleneck-stage seconds of a chunk covering units ``[y, x)``; ``inf`` where ``x <= y``.

    Shape ``[U + 1, U + 1]``.  The chunk ending at ``U`` carries the LM head.
    """
    dt = model.hidden.dtype
    y = jnp.arange(units + 1)[:, None]
    x = jnp.arange(units + 1)[None, :]
    c = ((x - y) * granularity).astype(dt)
    p = jnp.broadcast_to(y * granularity, c.shape).astype(dt)
    b = jnp.full(c.shape, batch, dt)
    last = jnp.broadcast_to(x == units, c.shape)
    t = costs.stage_times(model, hw, layout, jnp.maximum(c, 0), p, b, last, n_pad)
    C = jnp.max(t, axis=-1)
    return jnp.where(x > y, C, jnp.inf)


chunk_cost_matrix_jit = jax.jit(chunk_cost_matrix, static_argnums=(3, 6))
"""``chunk_cost_matrix`` compiled once per (U, N_pad); g and the batch are traced."""


def _dp_fixed(C, chunks: int, cap):
    """min sum t over partitions of [0, U] into ``chunks`` chunks with every t <= cap; and backpointers."""
    Cc = jnp.where(C <= cap, C, jnp.inf)
    U1 = C.shape[0]
    dp0 = jnp.full((U1,), jnp.inf, C.dtype).at[0].set(0.0)

    def step(dp, _):
        tot = dp[:, None] + Cc                      # [y, x]
        return jnp.min(tot, axis=0), jnp.argmin(tot, axis=0)

    dp, back = jax.lax.scan(step, dp0, None, length=chunks)
    return dp[-1], back


def free_slicing_dp(C, cap):
    """TeraPipe's slicing: min sum t over partitions of [0, U] into any number of chunks with every t <= cap.

    ``C [U + 1, U + 1]`` a cost table, ``cap`` scalar seconds.  Returns ``(min_sum, back[U + 1])``
    with ``back[x]`` the start of the last chunk of the best partition of ``[0, x)``.  The cap masks one
    column per step, so a vmap over caps (and tables) never holds a masked copy of the whole table.
    """
    U1 = C.shape[0]

    def step(dp, x):
        cand = dp + jnp.where(C[:, x] <= cap, C[:, x], jnp.inf)
        return dp.at[x].set(jnp.where(x == 0, 0.0, jnp.min(cand))), jnp.argmin(cand)

    dp, back = jax.lax.scan(step, jnp.full((U1,), jnp.inf, C.dtype), jnp.arange(U1))
    return dp[-1], back


_dp_fixed_caps = jax.jit(jax.vmap(_dp_fixed, in_axes=(None, None, 0)), static_argnums=1)
_dp_fixed_one = jax.jit(_dp_fixed, static_argnums=1)
_dp_free_caps = jax.jit(jax.vmap(free_slicing_dp, in_axes=(None, 0)))
_dp_free_one = jax.jit(free_slicing_dp)


class DPResult(NamedTuple):
    """Exact proxy optimum: ``partition`` (tokens), ``objective`` (s), ``cap`` (s), caps evaluated."""

    partition: np.ndarray
    objective: float
    cap: float
    caps_evaluated: int


def _search_caps(C: np.ndarray, solve_caps, num_stages: int, batch_caps: int):
    vals = np.unique(C[np.isfinite(C)])
    inf_sum = float(np.asarray(solve_caps(jnp.asarray(C), jnp.asarray([np.inf], C.dtype)))[0])
    if not np.isfinite(inf_sum):
        raise ValueError("no partition exists for these S, M and g")
    best, best_cap, evaluated = np.inf, np.inf, 0
    # skip caps too small to be feasible: bisection over the sorted candidates (vectorised rounds)
    lo, hi = 0, len(vals) - 1
    while hi - lo > batch_caps:
        probe = np.linspace(lo, hi, batch_caps).astype(int)
        ok = np.isfinite(np.asarray(solve_caps(jnp.asarray(C), jnp.asarray(vals[probe]))))
        evaluated += len(probe)
        first = int(np.argmax(ok)) if ok.any() else len(probe) - 1
        hi = probe[first]
        lo = probe[max(first - 1, 0)]
    i = lo
    while i < len(vals):
        if inf_sum + (num_stages - 1) * vals[i] >= best:
            break
        caps = vals[i: i + batch_caps]
        sums = np.asarray(solve_caps(jnp.asarray(C), jnp.asarray(caps)))
        evaluated += len(caps)
        obj = sums + (num_stages - 1) * caps
        j = int(np.argmin(obj))
        if obj[j] < best:
            best, best_cap = float(obj[j]), float(caps[j])
        i += batch_caps
    return best, best_cap, evaluated


def proxy_dp(C: np.ndarray, chunks: int, num_stages: int, granularity: int, batch_caps: int = 64) -> DPResult:
    """Exact minimiser of ``sum t + (N-1) max t`` over partitions into ``chunks`` chunks (multiples of g)."""
    C = np.asarray(C)
    U = C.shape[0] - 1
    best, cap, evaluated = _search_caps(C, lambda c, caps: _dp_fixed_caps(c, chunks, caps)[0], num_stages, batch_caps)
    _, back = _dp_fixed_one(jnp.asarray(C), chunks, jnp.asarray(cap, C.dtype))
    back = np.asarray(back)
    bounds = [U]
    for m in range(chunks - 1, -1, -1):
        bounds.append(int(back[m, bounds[-1]]))
    bounds = bounds[::-1]
    part = np.diff(bounds) * granularity
    return DPResult(part.astype(np.int64), best, cap, evaluated)


def terapipe_dp(C: np.ndarray, num_stages: int, granularity: int, batch_caps: int = 64) -> DPResult:
    """TeraPipe's partitioning: the proxy optimum over any number of chunks."""
    C = np.asarray(C)
    best, cap, evaluated = _search_caps(C, lambda c, caps: _dp_free_caps(c, caps)[0], num_stages, batch_caps)
    _, back = _dp_free_one(jnp.asarray(C), jnp.asarray(cap, C.dtype))
    return DPResult(slicing_from_back(np.asarray(back), granularity), best, cap, evaluated)


def slicing_from_back(back: np.ndarray, granularity: int) -> np.ndarray:
    """Chunk sizes (tokens, ``int64 [M]``) of the best partition of ``[0, U]`` from the backpointers
    ``back[U + 1]`` of :func:`free_slicing_dp`."""
    bounds = [back.shape[0] - 1]
    while bounds[-1] > 0:
        bounds.append(int(back[bounds[-1]]))
    return (np.diff(bounds[::-1]) * granularity).astype(np.int64)


def proxy_objective(C: np.ndarray, partition_units, num_stages: int) -> np.ndarray:
    """Proxy value of partitions given in units, ``[..., M] -> [...]`` (for checks and brute force)."""
    pu = np.asarray(partition_units)
    b = np.concatenate([np.zeros(pu.shape[:-1] + (1,), np.int64), np.cumsum(pu, -1)], -1)
    t = C[b[..., :-1], b[..., 1:]]
    return t.sum(-1) + (num_stages - 1) * t.max(-1)


# --------------------------------------------------------------------------- annealing


class AnnealResult(NamedTuple):
    """Best partition (units of g) over all chains, its objective, and per-chain bests."""

    partition_units: np.ndarray
    objective: float
    chain_best: np.ndarray
    accept_rate: float


#: steps queued ahead of the running one: with all of them queued at once the loop ran 20-80% slower
#: (and unsteadily) on a 2-core CPU; waiting every few steps still hides the dispatch and keeps the
#: step time steady (1 to 32 measured alike)
DISPATCH_AHEAD = 8
PENALTY = 1e6   # relative objective of an infeasible partition


def _many(objective, units, ctx):
    """``objective`` of ``units[C, M]``: its own batched form (``objective.many``) if it has one."""
    many = getattr(objective, "many", None)
    if many is None:
        return jax.vmap(objective, in_axes=(0, None))(units, ctx)
    return many(units, ctx)


def _relative(values, reference, xp=jnp):
    """Objectives relative to ``reference``, ``PENALTY`` where infeasible (``xp``: jnp or np)."""
    return xp.where(xp.isfinite(values), values / reference, xp.asarray(PENALTY, values.dtype))


def _call(objective, units, ctx):
    return objective(units, ctx)


objective_jit = jax.jit(_call, static_argnums=0)
"""``objective(units[M], ctx)`` compiled once per (hashable) objective and shape."""

objective_many_jit = jax.jit(_many, static_argnums=0)
"""``objective`` of ``units[P, M]`` (its batched form if it has one), compiled once per objective and shape."""


class _Chains(NamedTuple):
    """State of the annealing chains between steps (``C`` chains, ``M`` chunks, units of g).

    Fields:
      part: ``[C, M]`` current partitions.
      value: ``[C]`` their objectives relative to the reference (``PENALTY`` if infeasible).
      best, best_value: ``[C, M]`` / ``[C]`` best partition each chain has visited.
      accepted: ``[C]`` int moves accepted by each chain.
      proposal: ``[C, M]`` partitions to evaluate in the next step.
      valid: ``[C]`` whether each proposal is a legal move.
      row: int scalar, the number of the next step (0: the starting step); it picks the step's
        random bits and temperature out of their slab.
    """

    part: jax.Array
    value: jax.Array
    best: jax.Array
    best_value: jax.Array
    accepted: jax.Array
    proposal: jax.Array
    valid: jax.Array
    row: jax.Array


#: annealing steps whose random numbers are drawn together (one ``[DRAW_SLAB, 4, C]`` array per slab)
DRAW_SLAB = 64


class _Draws:
    """Random bits and temperatures of the annealing steps, handed to the step one slab of
    ``DRAW_SLAB`` steps at a time (so no step transfers anything): bits ``[DRAW_SLAB, 4, C]`` uint32
    (rows: boundary, shift, direction, acceptance), drawn on the host from the key (NumPy's PCG64),
    and temperatures ``[DRAW_SLAB]``; step r (r = 0: the starting step) reads row ``r % DRAW_SLAB``
    of slab ``r // DRAW_SLAB``.

    Each chain's numbers are its own column, so the chains see the same numbers however many
    devices they are split over; drawing them outside the step keeps the step program small
    (threefry unrolled inside it was about a fifth of its compile time, and 5% of its run time).
    """

    def __init__(self, key, chains: int, temps, placement: _Placement):
        if jnp.issubdtype(jnp.asarray(key).dtype, jax.dtypes.prng_key):
            key = jax.random.key_data(key)
        self._rng = np.random.default_rng(np.asarray(key, np.uint32).ravel().tolist())
        self._chains = chains
        slabs = -(-len(temps) // DRAW_SLAB)
        self._temps = np.pad(np.asarray(temps, np.float32), (0, slabs * DRAW_SLAB - len(temps)), constant_values=1)
        self._placement = placement
        self._next = 0

    def slab(self):
        """The next slab ``(bits, temperatures)``, placed for the step."""
        bits = self._rng.integers(0, 2 ** 32, (DRAW_SLAB, 4, self._chains), dtype=np.uint32)
        temps = self._temps[self._next * DRAW_SLAB: (self._next + 1) * DRAW_SLAB]
        self._next += 1
        return jax.device_put(bits, self._placement.columns), jax.device_put(temps, self._placement.replicated)


def _uniform(bits):
    """Floats in [0, 1) from uint32 bits (their top 24 bits: exact in float32)."""
    return (bits >> 8).astype(jnp.float32) * np.float32(2.0 ** -24)


def _propose(part, bits, max_shift):
    """One-boundary moves of chains ``part[c, M]`` from their random ``bits[3, c]``: ``(proposal, valid)``.

    A move shifts boundary ``b`` (between chunks b and b+1; uniform) by 1..``max_shift`` units
    (uniform) either way; it is valid if both chunks keep at least one unit.  Integers are bits
    modulo the range (bias below 1e-8 for these ranges).
    """
    M = part.shape[1]
    bnd = (bits[0] % max(M - 1, 1)).astype(jnp.int32)
    mag = (bits[1] % jnp.asarray(max_shift, jnp.uint32)).astype(jnp.int32) + 1
    delta = jnp.where(bits[2] >> 31 == 1, mag, -mag)
    rows = jnp.arange(part.shape[0])
    left = part[rows, bnd] + delta
    right = part[rows, bnd + 1] - delta
    ok = (left >= 1) & (right >= 1) & (M > 1)
    prop = part.at[rows, bnd].set(jnp.where(ok, left, part[rows, bnd]))
    prop = prop.at[rows, bnd + 1].set(jnp.where(ok, right, part[rows, bnd + 1]))
    return prop, ok


def _step(objective, state: _Chains, draws, temps, reference, max_shift, ctx):
    """One annealing step of (this device's) chains: evaluate the pending proposals, accept or reject
    them (Metropolis at temperature ``temps[i]``, relative to ``reference``), draw the next proposals
    (shifts of 1..``max_shift`` units) from the random bits ``draws[i]`` (``draws [S, 4, c]``, ``temps [S]``,
    ``i = state.row % S``).

    Returns ``(state, values)`` with ``values [c]`` the proposals' objectives in seconds.
    """
    i = state.row % draws.shape[0]
    bits = jax.lax.dynamic_index_in_dim(draws, i, 0, keepdims=False)                 # [4, c]
    temp = temps[i]
    values = _many(objective, state.proposal, ctx)
    pv = _relative(values, reference)
    accept = state.valid & ((pv <= state.value) | (_uniform(bits[3]) < jnp.exp(-(pv - state.value) / temp)))
    part = jnp.where(accept[:, None], state.proposal, state.part)
    value = jnp.where(accept, pv, state.value)
    better = value < state.best_value
    best = jnp.where(better[:, None], part, state.best)
    best_value = jnp.where(better, value, state.best_value)
    prop, ok = _propose(part, bits, max_shift)
    return _Chains(part, value, best, best_value, state.accepted + accept.astype(jnp.int32), prop, ok,
                   state.row + 1), values


class _Placement(NamedTuple):
    """Where the step's arguments live (all None on one device): ``state`` a :class:`_Chains` of
    shardings (rows split over the devices, ``row`` replicated), ``replicated`` for scalars and the
    context, ``columns`` for the random bits ``[S, 4, C]``."""

    state: _Chains | None = None
    replicated: object = None
    columns: object = None


@functools.lru_cache(maxsize=32)
def _step_program(objective, chains: int, devices: tuple):
    """The compiled annealing step for ``chains`` chains split over ``devices`` and its
    :class:`_Placement`.  No collectives: each device
    evaluates and updates its own chains (a first version whose acceptance summed across devices
    deadlocked in XLA:CPU's rendezvous after ~1,000 queued steps)."""
    nd = len(devices)
    fn = functools.partial(_step, objective)
    options = chunked_prefill.COMPILER_OPTIONS
    if nd == 1:
        return jax.jit(fn, donate_argnums=(0,), compiler_options=options), _Placement()
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    mesh = jax.make_mesh((nd,), ("chains",), axis_types=(AxisType.Auto,), devices=devices)
    rows, columns = P("chains"), P(None, None, "chains")
    state_spec = _Chains(*([rows] * (len(_Chains._fields) - 1)), row=P())
    sharded = jax.shard_map(fn, mesh=mesh, in_specs=(state_spec, columns, P(), P(), P(), P()),
                            out_specs=(state_spec, rows), check_vma=False)
    state = jax.tree_util.tree_map(lambda spec: NamedSharding(mesh, spec), state_spec,
                                   is_leaf=lambda x: isinstance(x, P))
    return (jax.jit(sharded, donate_argnums=(0,), compiler_options=options),
            _Placement(state, NamedSharding(mesh, P()), NamedSharding(mesh, columns)))


def _anneal_devices(chains: int, devices: int | None) -> tuple:
    """Devices the chains are split over: every local CPU device when they divide the chains."""
    local = jax.local_devices()
    if devices is None:
        devices = len(local) if local[0].platform == "cpu" and chains % len(local) == 0 else 1
    if devices < 1 or devices > len(local) or chains % devices:
        raise ValueError(f"cannot split {chains} chains over {devices} of the {len(local)} local devices; "
                         "choose a device count that divides the chains")
    return tuple(local[:devices])


def _program(objective, ctx, chains: int, devices: int | None):
    """The compiled step for ``chains`` chains (shared by everything with the same objective, chain
    count and devices), its :class:`_Placement`, and ``ctx`` placed for it."""
    step, placement = _step_program(objective, chains, _anneal_devices(chains, devices))
    return step, placement, jax.device_put(ctx, placement.replicated)


def _scalars(placement: _Placement, reference: float, max_shift: int):
    """The step's scalar arguments (reference seconds, largest shift in units), placed for it once:
    numbers passed as Python or NumPy scalars would be copied to the devices at every step (and
    compile the step a second time when mixed with placed ones)."""
    return jax.device_put((np.float32(reference), np.int32(max_shift)), placement.replicated)


def _start(units, placement: _Placement):
    """Chains about to evaluate ``units[C, M]``: every proposal valid and better than the current
    value (+inf), so the step accepts them all."""
    chains = units.shape[0]
    units = np.asarray(units, np.int32)
    inf = lambda: np.full((chains,), np.inf, np.float32)
    # every field its own buffer (host copies, placed once): the step donates its input state
    state = _Chains(units.copy(), inf(), units.copy(), inf(), np.zeros((chains,), np.int32), units.copy(),
                    np.ones((chains,), bool), np.int32(0))
    return jax.device_put(state, placement.state)


def evaluate_partitions(objective, ctx, units, devices: int | None = None) -> np.ndarray:
    """``objective`` of ``units[C, M]`` partitions (units of g), ``[C]`` seconds, through the
    compiled annealing step for C chains: an :func:`anneal` with as many chains afterwards (same
    objective, any context values of the same shapes) compiles nothing more.
    """
    if hasattr(objective, "specialise"):
        objective = objective.specialise(ctx)
    units = np.asarray(units, np.int32)
    chains = units.shape[0]
    step, placement, ctx = _program(objective, ctx, chains, devices)
    draws, temps = _Draws(0, chains, [1.0], placement).slab()
    _, values = step(_start(units, placement), draws, temps, *_scalars(placement, 1.0, 1), ctx)
    return np.asarray(values)


def anneal(objective, ctx, init_units, key, chains: int = 1024, steps: int = 2000, max_shift: int = 4,
           t_start: float = 0.02, t_end: float = 1e-4, reference: float | None = None,
           devices: int | None = None) -> AnnealResult:
    """Simulated annealing over partitions in units of ``g``.

    Args:
      objective: hashable callable ``(units[M] int, ctx) -> seconds`` to minimise
        (``inf`` = infeasible); vmapped over chains, unless it has a batched form
        ``many(units[C, M], ctx)``; ``objective.specialise(ctx)`` (if defined) is applied
        first, with ``ctx`` still on the host.
      ctx: pytree of traced numbers the objective needs.
      init_units: ``[M]`` or ``[chains, M]`` starting partitions (every chunk >= 1 unit).
      key: PRNG key (a fixed key gives identical results).
      max_shift: a move shifts one boundary by 1..max_shift units, either way.
      t_start, t_end: temperatures relative to ``reference`` (default: the objective of
        the first starting partition), cooled geometrically over ``steps``.
      devices: local devices to split the chains over (default: every CPU device when they
        divide the chains, else one); the result does not depend on it.

    Returns:
      :class:`AnnealResult` (objective in seconds, ``inf`` if no chain found a feasible partition).
    """
    if hasattr(objective, "specialise"):
        objective = objective.specialise(ctx)           # static structure read from the host-side context
    init = np.asarray(init_units, np.int32)
    if init.ndim == 1:
        init = np.broadcast_to(init, (chains, init.shape[0]))
    chains = init.shape[0]
    step, placement, ctx = _program(objective, ctx, chains, devices)
    # temperatures of steps 0 (the starting step: any) to ``steps``: geometric cooling from t_start to t_end
    temps = np.concatenate([[1.0], t_start * (t_end / t_start) ** (np.arange(steps) / max(steps - 1, 1))])
    inputs = _Draws(key, chains, temps, placement)
    draws, temps = inputs.slab()
    # the first step evaluates the starting partitions as "proposals" every chain accepts, then
    # draws the first real proposals; values are made relative once the reference is known
    state, init_values = step(_start(init, placement), draws, temps, *_scalars(placement, 1.0, max_shift), ctx)
    if reference is None:
        reference = float(np.asarray(init_values)[0])
    if not np.isfinite(reference) or reference <= 0:
        reference = 1.0
    # on the host (small), so the first call compiles no eager operations
    value = _relative(np.asarray(init_values, np.float32), np.float32(reference), np)
    state = state._replace(value=value, best_value=value.copy(), accepted=np.zeros((chains,), np.int32))
    state = jax.device_put(state, placement.state)
    ref, shift = _scalars(placement, reference, max_shift)
    # the step loop runs in Python around one compiled program (objectives that scan internally ran
    # several times slower nested inside an XLA while loop on CPU); dispatch is asynchronous, a few
    # steps ahead, and every argument is already on the devices
    for row in range(1, steps + 1):
        if row % DRAW_SLAB == 0:
            draws, temps = inputs.slab()
        state, _ = step(state, draws, temps, ref, shift, ctx)
        if row % DISPATCH_AHEAD == 0:
            state.value.block_until_ready()
    best_val = np.asarray(state.best_value) * reference
    i = int(np.argmin(best_val))
    val = float(best_val[i]) if best_val[i] < PENALTY * reference else float("inf")
    accepted = int(np.asarray(state.accepted).sum())
    return AnnealResult(np.asarray(state.best)[i], val, best_val, accepted / (chains * steps))
