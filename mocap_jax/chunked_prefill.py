"""Prefill of many chunked partitions of one batch at once: the LBCP annealing hot path.

:func:`prefill_many` evaluates ``C`` partitions (annealing chains, candidate batches)
of one configuration and returns what :func:`mocap_jax.schedule.evaluate` returns for
each of them -- prefill latency, feasibility, period -- for the case the annealer
needs: one batch (``num_batches == 1``), every item a real chunk (``k_pad == M``),
MBKR off or with a static pairing.  The numbers are the same as ``evaluate``'s (the
tests check both paths against each other in float64, and ``evaluate`` against the
event-driven reference); the program is arranged for speed:

* every array keeps the configurations on its **last** axis (``[K, N, C]``), so the
  §5 wavefront scan runs on it directly, without the transposes ``vmap`` adds;
* the MBKR spill decisions of a static pair are computed in **closed form** instead of
  an event scan.  With one request group per batch the pair's state only grows until
  the upstream stage releases its KV, so spills flow one way (from whichever stage
  first has an excess while its partner is a creditor) and the amount moved by each
  addition is a capped prefix sum (:func:`_capped_moves`); after the upstream
  release, the downstream stage may spill into the released stage, again a capped
  prefix sum.  Event order enters only through comparisons of the two stages' event
  times (``[K, K]`` per pair);
* "the KV the other stage added before this event" is a masked sum of integer chunk tokens
  (one fused reduction, exact), scaled to bytes; the creditor-blocking charges use integer
  counts of earlier events (events of a stage are in item order) and running maxima of
  nonnegative prefix sums taken on their bit patterns as integers.  On XLA:CPU, gathers, float
  reductions over ``[K, K]`` (handed to a library that materialises the operand) and unrolled
  masked sums were each measured slower;
* the pass loop carries the next pass's item starts and KV times, so the ``[K, K]``
  comparisons read stored arrays instead of recomputing them ``K`` times;
* the pairing is **static** (:class:`StageStructure`, read from the configuration on
  the host by :func:`stage_structure`), so moving values between partners is slicing,
  not gathering;
* callers evaluate many partitions in blocks of :data:`BLOCK` (``lax.map``), which keeps
  each block's working set in cache.

Shapes: ``K`` chunks (= ``shape.k_pad``), ``N`` = ``shape.n_pad`` stages, ``C``
partitions, ``L`` pair slots (``ceil(N / 2)`` for cross-half and head-to-tail pairs).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import costs
from .mbkr import partner_of
from .pipeline import finish_times_items_first
from .schedule import Point, SimShape, kv_peak


MODES = ("off", "static", "unpaired")
#: partitions evaluated together by :func:`prefill_blocks` (measured fastest on a 2-core CPU: the annealing
#: step took 3.6 ms with 64, 3.5-3.6 with 128, 4.0 with 256 and 4.6 with 512, once the kernel read
#: its tokens in a vectorisable layout)
BLOCK = 64
#: XLA options for programs built on this kernel: 512-bit vectors where the CPU has them (AVX-512),
#: about 12% faster on the annealing benchmark with identical results; a hint other CPUs and
#: backends ignore
COMPILER_OPTIONS = {"xla_cpu_prefer_vector_width": 512}


class StageStructure(NamedTuple):
    """Static stage structure of a configuration (hashable).

    Attributes:
      num_stages: live pipeline stages (``<= N_pad``).
      partner: ``N_pad`` ints, each stage's static MBKR partner (-1: unpaired, padding, or MBKR off).
    """

    num_stages: int
    partner: tuple


def supports(shape: SimShape) -> bool:
    """Whether :func:`prefill_many` covers this bucket (else use ``vmap(evaluate)``)."""
    return shape.num_batches == 1 and shape.mbkr in MODES and not shape.timeline


def stage_structure(point: Point, shape: SimShape) -> StageStructure:
    """The :class:`StageStructure` of a host-side (NumPy) configuration."""
    n = int(np.asarray(point.layout.num_stages))
    code = int(np.asarray(point.mbkr.pairing)) if shape.mbkr == "static" else 0
    partner = partner_of(code, n, shape.n_pad, xp=np)
    partner = np.where(np.arange(shape.n_pad) < n, partner, -1)
    return StageStructure(n, tuple(int(q) for q in partner))


def _cumsum(x):
    """Inclusive prefix sum along axis 0.

    Floats: a product with a lower-triangular matrix of ones (one small matrix
    multiplication; XLA:CPU lowers ``jnp.cumsum`` to a slow reduce-window).  Integers:
    unrolled additions (exact).
    """
    K = x.shape[0]
    if not jnp.issubdtype(x.dtype, jnp.floating):
        out = [x[0]]
        for k in range(1, K):
            out.append(out[-1] + x[k])
        return jnp.stack(out)
    return jnp.tensordot(jnp.tril(jnp.ones((K, K), x.dtype)), x, axes=1)


def _take(table, index):
    """``table[index]`` along axis 0 (``index`` int in ``[0, K)``): a chain of selects over the K entries,
    which XLA fuses into one vectorised loop (a gather along the item axis is several times slower on CPU)."""
    out = jnp.broadcast_to(table[0], index.shape)
    for k in range(1, table.shape[0]):
        out = jnp.where(index >= k, table[k], out)
    return out


def _partner_stages(x, partner: np.ndarray):
    """``x[..., partner[s], :]`` along the stage axis (-2) for every stage ``s`` (zero where ``partner < 0``).

    ``partner`` is static, so this is slicing and stacking, which XLA fuses into consumers for free.
    """
    zero = jnp.zeros(x.shape[:-2] + x.shape[-1:], x.dtype)
    return jnp.stack([x[..., q, :] if q >= 0 else zero for q in partner], axis=-2)


def _capped_moves(amount, cap):
    """Bytes moved by each addition of a debtor into a creditor with a shrinking room.

    Moves follow ``W[i+1] = W[i] + max(0, min(amount[i], cap[i] - W[i]))`` (``W`` the
    bytes moved so far, ``cap`` nonincreasing along axis 0): the running total grows by
    ``amount`` until it first would exceed ``cap``, is clipped there, and stays
    constant afterwards (later caps are no larger).

    Args:
      amount: ``[K, ...]`` nonnegative bytes each addition offers.
      cap: ``[K, ...]`` (or broadcastable) largest total the creditor can host at each addition.

    Returns:
      ``(moved [K, ...], total [...])``.
    """
    inclusive = _cumsum(amount)
    exclusive = inclusive - amount
    # the total is clipped at the first addition that would exceed its cap, to max(exclusive, cap)
    # there; later additions that exceed theirs give no smaller value (inclusive sums grow, caps shrink)
    limit = jnp.min(jnp.where(inclusive > cap, jnp.maximum(exclusive, cap), jnp.inf), axis=0)
    after = jnp.minimum(inclusive, limit)
    before = jnp.minimum(exclusive, limit)
    return after - before, after[-1]


def pair_spills_one_group(kv_time, release, kv, budget, structure: StageStructure, p1, p2, tokens, kv_scale):
    """Spill decisions of static pairs for one request group, in closed form.

    Same semantics as :func:`mocap_jax.mbkr.pair_spills` with one group (docs/semantics.md):
    events in the order (time, releases before adds, stage, item); each stage's additions
    are in item order and its release comes after them.

    Args:
      kv_time: ``[K, N, C]`` time each item adds its KV on each stage.
      release: ``[N, C]`` time the group's KV is freed on each stage.
      kv: ``[K, N, C]`` bytes each item adds.
      budget: ``[N, C]`` KV budget per stage (bytes).
      structure: static stages and partners (partners are an involution on paired stages).
      p1, p2: role thresholds.
      tokens: ``[K, C]`` int chunk tokens of each item; kv_scale: ``[N, C]`` bytes per chunk token
        (``kv == tokens * kv_scale``).

    Returns:
      ``(moved [K, N, C], peak [N, C], overflow [C])``.
    """
    K, N = kv_time.shape[:2]
    dt = kv.dtype
    partner = np.asarray(structure.partner)
    n = structure.num_stages
    stage = np.arange(N)
    # slot s: stage s (side a) with its later partner (side b), or alone; L covers every leader
    active = (stage < n) & ((partner < 0) | (partner > stage))
    L = int(stage[active].max()) + 1 if active.any() else 1
    ok = partner[:L] >= 0
    active = active[:L]
    okc = ok[:, None]                                                                 # [L, 1]
    other = lambda x: _partner_stages(x, partner[:L])                                 # x[..., partner[s], :]
    inf = jnp.asarray(jnp.inf, dt)

    ta = kv_time[:, :L]                                                               # [K, L, C]
    tb = jnp.where(okc, other(kv_time), inf)
    ra = release[:L]                                                                  # [L, C]
    rb = jnp.where(okc, other(release), inf)
    xa = jnp.where(ra > ta, kv[:, :L], 0.0)                                           # KV that outlives its add
    xb = jnp.where(okc & (rb > tb), other(kv), 0.0)
    cap_a = budget[:L]
    cap_b = jnp.where(okc, other(budget), 1.0)
    high_a, high_b = p2 * cap_a, p2 * cap_b
    low_a, low_b = p1 * cap_a, p1 * cap_b

    # interleaving: b's addition j precedes a's addition i iff tb[j] < ta[i] (ties: lower stage, a, first).
    # The KV one stage added before an event of the other is a masked sum over its items, taken over
    # integer chunk tokens (exact, and one fused reduction: XLA:CPU hands float reductions to a
    # library that materialises the [K, K] operand) and scaled to bytes.
    added_a, added_b = _cumsum(xa), _cumsum(xb)
    tok = tokens[:, None, :]
    tok_a = jnp.where(ra > ta, tok, 0)                                                # [K, L, C] int
    tok_b = jnp.where(okc & (rb > tb), tok, 0)
    b_before = jnp.sum(jnp.where(tb[None, :] < ta[:, None], tok_b[None, :], 0), axis=1) * other(kv_scale)
    a_upto = jnp.sum(jnp.where(ta[:, None] <= tb[None, :], tok_a[:, None], 0), axis=0) * kv_scale[:L]
    phase1 = tb < ra[None]                                                            # b's adds before a's release

    # a spills into b (b's room shrinks as b adds its own KV)
    excess_a = jnp.clip(added_a - high_a, 0.0, xa)
    gate_a = b_before >= low_b
    room_a = high_b - b_before
    first_a = jnp.min(jnp.where(okc & (excess_a > 0) & gate_a & (room_a > 0), ta, inf), axis=0)
    # b spills into a before a's release
    excess_b = jnp.clip(added_b - high_b, 0.0, xb)
    gate_b = phase1 & (a_upto >= low_a)
    room_b = high_a - a_upto
    first_b = jnp.min(jnp.where(okc & (excess_b > 0) & gate_b & (room_b > 0), tb, inf), axis=0)
    # the first move decides the direction: afterwards the debtor stays above p2 and is no creditor
    a_leads = (first_a <= first_b) & jnp.isfinite(first_a)
    b_leads = first_b < first_a
    moved_a, spilled_a = _capped_moves(jnp.where(a_leads & gate_a, excess_a, 0.0), room_a)
    moved_b1, spilled_b = _capped_moves(jnp.where(b_leads & gate_b, excess_b, 0.0), room_b)

    # after a's release: a hosts only b's spill; b keeps adding and may spill into a
    added_b1 = jnp.sum(jnp.where(phase1, xb, 0.0), axis=0)
    own_b = added_b1 - spilled_b
    x2 = jnp.where(phase1, 0.0, xb)
    excess_2 = jnp.clip(own_b + _cumsum(x2) - high_b, 0.0, x2)
    gate_2 = okc & (spilled_b >= low_a)
    moved_b2, spilled_2 = _capped_moves(jnp.where(gate_2 & ~phase1, excess_2, 0.0), (high_a - spilled_b)[None])
    moved_b = moved_b1 + moved_b2

    local_a1 = jnp.sum(xa, axis=0) - spilled_a + spilled_b
    local_b1 = added_b1 - spilled_b + spilled_a
    local_a2 = spilled_b + spilled_2
    local_b2 = own_b + jnp.sum(x2, axis=0) - spilled_2
    peak_a = jnp.maximum(local_a1, local_a2)
    peak_b = jnp.where(okc, jnp.maximum(local_b1, local_b2), 0.0)
    over = (peak_a > cap_a * (1 + 1e-6)) | (okc & (peak_b > cap_b * (1 + 1e-6)))
    overflow = jnp.any(active[:, None] & over, axis=0)

    # back to stages: stage x is the leader of slot x, or the follower of slot partner[x]
    leader = np.zeros(N, bool)
    leader[:L] = active
    follower = (partner >= 0) & (partner < stage)
    to_stages = lambda x: jnp.concatenate([x, jnp.zeros(x.shape[:-2] + (N - L,) + x.shape[-1:], x.dtype)], axis=-2) \
        if L < N else x
    moved = jnp.where(leader[:, None], to_stages(moved_a),
                      jnp.where(follower[:, None], _partner_stages(to_stages(moved_b), partner), 0.0))
    peak = jnp.where(leader[:, None], to_stages(peak_a),
                     jnp.where(follower[:, None], _partner_stages(to_stages(peak_b), partner), 0.0))
    return moved, peak, overflow


def _blocking(f, start, serve, has_host, partner: np.ndarray):
    """Creditor blocking ``[K, N, C]``: each remote read's serving time charged to the
    creditor's item in progress when the debtor's item starts (``spill_costs``)."""
    K, N = f.shape[:2]
    fin_h = _partner_stages(f, partner)                                               # [K(q), N, C] on the host
    sta_h = _partner_stages(start, partner)
    # reductions over the creditor's K items (comparisons fused into them, no [K, K, N, C]
    # intermediates).  Finish and start times are sorted along the items, so the creditor items
    # finished by the debtor's start are a prefix of length ``done`` and the next one to start is
    # the earliest unfinished one.
    done = jnp.sum(fin_h[None, :] <= start[:, None], axis=1, dtype=jnp.int32)                # [K(k), N, C]
    slot = jnp.minimum(done, K - 1)
    next_start = _take(sta_h, slot)
    charge = jnp.where(next_start <= start, serve, jnp.clip(start + serve - next_start, 0.0, serve))
    charge = jnp.where(has_host, charge, 0.0)
    # the debtor whose host is stage h is partner[h] (static pairs are involutions)
    slot_d = _partner_stages(slot, partner)
    charge_d = _partner_stages(charge, partner)
    # debtor items are in order and so are their slots: the charges of creditor items up to q are the
    # prefix sum of the debtor's charges up to its last item with slot <= q.  Prefix sums of nonnegative
    # charges grow, so that is a running maximum, taken over the bit patterns of the (nonnegative)
    # floats, which order like the floats as integers: one fused integer reduction
    total = _cumsum(charge_d) + 0.0                                                   # [K(k), N, C], no -0.0
    bits = lax.bitcast_convert_type(total, jnp.int32 if total.dtype == jnp.float32 else jnp.int64)
    q = jnp.arange(K)[None, :, None, None]
    upto = jnp.max(jnp.where(slot_d[:, None] <= q, bits[:, None], 0), axis=0)            # [K(q), N, C]
    charged = lax.bitcast_convert_type(upto, total.dtype)
    return charged - jnp.concatenate([jnp.zeros_like(charged[:1]), charged[:-1]], axis=0)


def _items_first(partition):
    """``[K, C]`` chunk tokens from ``[C, K]`` partitions, materialised in that layout.

    A plain transpose is folded by XLA's layout assignment into its consumers, the ``[K, K]``
    reductions of every MBKR pass among them, which then read the tokens with a stride of K
    in their vectorised loops: ~10% of the kernel.
    """
    partition = jnp.asarray(partition)
    K = partition.shape[1]
    eye = jnp.eye(K, dtype=partition.dtype)
    return jnp.sum(eye[:, None, :] * partition[None, :, :], axis=-1)


def prefill_many(partition, batch, point: Point, shape: SimShape, structure: StageStructure,
                 detail: bool = False) -> dict:
    """EvaluatePrefill of ``C`` chunked partitions of one batch.

    Args:
      partition: ``[C, K]`` int chunk sizes in tokens, every chunk > 0, ``K == shape.k_pad``.
      batch: int scalar or ``[C]`` requests per batch.
      point: the configuration (its item table is ignored); unbatched leaves.
      shape: a bucket with :func:`supports` true.
      structure: :func:`stage_structure` of ``point`` (static; must match its stage count and pairing).
      detail: also return the rest of :func:`mocap_jax.schedule.evaluate`'s keys for MBKR-off
        buckets, with the configurations on the **last** axis (no device-side transposes; a
        host-side ``np.moveaxis(x, -1, 0)`` gives evaluate's layout): ``finish_times``
        ``[1, K, N, C]``, ``stage_times`` and ``handoff_times`` ``[K, N, C]``, per-stage arrays
        ``[N, C]``, scalars ``[C]``.

    Returns:
      dict of ``[C]`` arrays: ``prefill_latency_s`` (inf if infeasible),
      ``raw_latency_s``, ``feasible``, ``period_s`` (saturation period), and
      ``peak_mem_bytes_per_stage`` ``[C, N]``.
    """
    if not supports(shape):
        raise ValueError(f"prefill_many covers one batch with MBKR off or static pairs, not {shape}")
    K, N = shape.k_pad, shape.n_pad
    model, hw, layout = point.model, point.hardware, point.layout
    dt = model.hidden.dtype
    n = layout.num_stages
    items = _items_first(partition)                                                   # [K, C] int tokens
    C = items.shape[1]
    c = items.astype(dt)                                                              # [K, C]
    p = (_cumsum(items) - items).astype(dt)
    b = jnp.broadcast_to(jnp.asarray(batch, dt), (C,))[None, :] * jnp.ones_like(c)
    last = jnp.broadcast_to((jnp.arange(K) == K - 1)[:, None], (K, C))
    t = costs.stage_times(model, hw, layout, c, p, b, last, N, stage_axis=-2)          # [K, N, C]
    d = costs.handoff_time(model, hw, layout, c, b, N, stage_axis=-2)
    stage_live = (jnp.arange(N) < n)[:, None]                                         # [N, 1]
    kv_tok = costs.stage_kv_bytes_per_token(model, hw, n, N, tensor_parallel=layout.tensor_parallel)   # [N]
    tokens = b * c                                                                    # [K, C] request-tokens
    kv = tokens[:, None, :] * kv_tok[None, :, None]                                   # [K, N, C]
    kv_scale = b[0][None, :] * kv_tok[:, None]                                        # [N, C] bytes per chunk token
    workspace = jnp.max(costs.item_workspace_bytes(model, hw, kv_tok, c, b, stage_axis=-2), axis=0)   # [N, C]
    workspace = jnp.where(stage_live, workspace, 0.0)
    weights = costs.stage_weight_bytes(model, hw, n, N, tensor_parallel=layout.tensor_parallel)[:, None]
    capacity = hw.usable_hbm

    f = finish_times_items_first(t, d)                                                # [K, N, C]
    release_request = point.release_request

    def release_of(times):
        return jnp.where(release_request, times[K - 1, N - 1][None], times[K - 1])   # [N, C]

    t_eff = t
    if shape.mbkr == "off":
        latency = f[K - 1, N - 1]
        release = jnp.broadcast_to(release_of(f)[None], f.shape)
        peak_kv = kv_peak(f, kv, release)
        overflow = jnp.zeros((C,), bool)
    else:
        mb = point.mbkr
        budget = jnp.where(stage_live, capacity - weights - workspace, 1.0)
        attention = costs.stage_attention_times(model, hw, layout, c, p, b, N, stage_axis=-2)
        partner = np.asarray(structure.partner)
        stage = np.arange(N)
        route = np.where(partner >= 0, partner, stage)
        hops = jnp.asarray(mb.stage_hops)[stage, route][None, :, None]
        bandwidth = jnp.asarray(mb.stage_bandwidth)[stage, route][None, :, None]

        def one_pass(carry, _):
            """Spills decided on the timeline ``f`` (item starts ``start``, KV added at ``kv_time``),
            their costs, and the timeline they give."""
            f, start, kv_time, _, _, _ = carry
            moved, peak_kv, overflow = pair_spills_one_group(kv_time, release_of(kv_time), kv, budget, structure,
                                                             mb.p1, mb.p2, items, kv_scale)
            read_bytes = _cumsum(moved) - moved                                      # group's KV spilled earlier
            read = jnp.where(read_bytes > 0, hops * hw.link_latency_s + read_bytes / (bandwidth * hw.eff_link), 0.0)
            read_extra = jnp.maximum(read - mb.read_overlap * attention, 0.0)
            write = jnp.where(moved > 0, hops * hw.link_latency_s + moved / (bandwidth * hw.eff_link), 0.0)
            serve = read_bytes / (hw.hbm_bandwidth * hw.eff_hbm)
            has_host = (read_bytes > 0) & (partner >= 0)[None, :, None]
            extra = write + read_extra + _blocking(f, start, serve, has_host, partner)
            f = finish_times_items_first(t + extra, d)
            # start and KV times of the next pass are carried (materialised) rather than recomputed
            # inside every [K, K] comparison that reads them
            return (f, f - (t + extra), f - write, peak_kv, overflow, extra), None

        # the passes run as a loop: its inputs (stage times, KV, budgets) are computed once outside it,
        # where straight-line code let XLA fuse (and so recompute) their formulas into every consumer
        init = (f, f - t, f, jnp.zeros((N, C), f.dtype), jnp.zeros((C,), bool), jnp.zeros_like(f))
        (f, _, _, peak_kv, overflow, extra), _ = lax.scan(one_pass, init, None, length=shape.mbkr_iterations)
        t_eff = t + extra
        latency = f[K - 1, N - 1]
    peak_mem = weights + workspace + peak_kv                                          # [N, C]
    feasible = jnp.all((peak_mem <= capacity) | ~stage_live, axis=0) & ~overflow
    stage_work = jnp.sum(t_eff, axis=0)                                               # [N, C]
    period = jnp.where(point.synchronous, latency, jnp.max(stage_work, axis=0))
    out = dict(prefill_latency_s=jnp.where(feasible, latency, jnp.inf), raw_latency_s=latency, feasible=feasible,
               period_s=period, peak_mem_bytes_per_stage=peak_mem.T)
    if detail:
        if shape.mbkr != "off":
            raise ValueError("prefill_many(detail=True) covers MBKR-off buckets; use schedule.evaluate for MBKR")
        throughput = b[0] / period                                   # each request counted once
        out.update(
            finish_times=f[None], stage_times=t, handoff_times=d, peak_mem_bytes_per_stage=peak_mem,
            throughput_rps=jnp.where(feasible, throughput, 0.0),
            bubble_fraction=1.0 - jnp.sum(stage_work, axis=0) / (n.astype(dt) * latency),
            stage_utilisation=jnp.where(stage_live, stage_work / period, 0.0), kv_peak_bytes_per_stage=peak_kv,
            workspace_bytes_per_stage=workspace, weight_bytes_per_stage=jnp.broadcast_to(weights, (N, C)),
            capacity_bytes=jnp.broadcast_to(capacity, (C,)))
    return out


def prefill_blocks(partition, batch, point: Point, shape: SimShape, structure: StageStructure, block: int = BLOCK,
                   detail: bool = False):
    """:func:`prefill_many` over ``[C, K]`` partitions in blocks of ``block`` (``C`` a multiple of it
    when larger); ``batch`` scalar or ``[C]``.  Same results, evaluated block by block with ``lax.map``
    (``detail`` evaluates all partitions at once, keeping its configurations-last layout)."""
    partition = jnp.asarray(partition)
    C = partition.shape[0]
    if C <= block or detail:
        return prefill_many(partition, batch, point, shape, structure, detail)
    if C % block:
        raise ValueError(f"{C} partitions are not a multiple of the block size {block}")
    batch = jnp.broadcast_to(jnp.asarray(batch), (C,)).reshape(-1, block)
    out = lax.map(lambda xs: prefill_many(xs[0], xs[1], point, shape, structure, detail),
                  (partition.reshape(-1, block, partition.shape[1]), batch))
    return jax.tree_util.tree_map(lambda x: x.reshape((C,) + x.shape[2:]), out)


prefill_many_jit = jax.jit(prefill_blocks, static_argnames=("shape", "structure", "block", "detail"),
                           compiler_options=COMPILER_OPTIONS)
"""``prefill_blocks`` compiled once per bucket, stage structure and number of partitions."""
