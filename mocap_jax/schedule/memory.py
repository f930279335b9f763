"""KV release and memory resolved in time, per stage.

A stage's memory at time t is ``weights + KV held at t + workspace of the item in flight at t``,
where an item's workspace is the KV it is writing plus its activation buffers
(:func:`mocap_jax.costs.stage.item_activation_bytes`).  An item's KV is held from its finish
until its group's release (:func:`release_times`); an item whose release equals its finish never
holds any.  Memory rises only when an item starts, so the peak is the largest value at an item's
start: ``weights + held(start_k) + kv_k + act_k``, with ``held(start_k)`` the KV of earlier items
not yet released at that instant (:func:`peak_memory`).  Adding the largest workspace to the
largest KV holding instead would only bound the peak from above, and count the last chunk's KV
twice.

An item's KV is its tokens (prompt tokens x requests) times a stage's bytes per token, so the
running sums over items that resolve the held KV run over the ``[E]`` token counts and scale by
the ``[N]`` bytes per token at the end (exact while the counts stay below 2^24 in float32),
instead of summing ``[E, N]`` byte tables.

Shapes: ``E`` items of the timeline (batches x item slots, in item order), ``N`` stages, ``G``
group slots of the timeline.  Units: seconds, bytes, tokens.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ..costs.computed_once import computed_once
from .shape import Release
from .prefix import count_sorted, prefix_max, prefix_sum

Array = Any


def group_ends(last, groups: int):
    """Slots of the first ``groups`` group ends of one batch's items, ``[G]`` int (-1 for unused slots)."""
    (ends,) = jnp.nonzero(last, size=groups, fill_value=-1)
    return ends.astype(jnp.int32)


def timeline_groups(ends, items: int, batches: int):
    """Group ends of ``batches`` consecutive batches in timeline item numbering, ``[batches * G]``."""
    offsets = jnp.arange(batches, dtype=jnp.int32)[:, None] * items
    return jnp.where(ends[None, :] >= 0, ends[None, :] + offsets, -1).reshape(-1)


def release_times(finish, ends, policy: Release):
    """When each group's KV is freed on each stage, ``[G, N]`` seconds (``+inf`` for unused group slots).

    ``stage``: when the stage finishes the group's last item; ``request``: when the group's last
    item leaves the last stage.
    """
    at = finish[jnp.maximum(ends, 0)]                                            # [G, N]
    if policy == Release.REQUEST:
        at = jnp.broadcast_to(at[:, -1:], at.shape)
    return jnp.where((ends >= 0)[:, None], at, jnp.inf)


def item_release_times(release, group_of_item):
    """Release time of each item's KV, ``[E, N]``: its group's (``group_of_item [E]`` group slot of each item)."""
    return release[group_of_item]


def held_before_start(start, tokens, per_token, ends, release, group_first=None, policy: Release = Release.REQUEST):
    """KV each stage holds just before each item starts (releases at that instant applied), ``[E, N]``
    bytes; item ``k`` writes ``tokens[k] * per_token[s]`` bytes on stage ``s``.

    Groups are released in order and their items are consecutive, so the released KV at any time is
    the cumulative KV through the last released group: a running maximum over the groups released
    by then.  Unused group slots repeat their predecessor, which keeps release times sorted.

    Under the ``stage`` policy a group is released when the stage finishes its last item, before
    the stage starts any item of the next group, so a stage holds only the KV of the earlier items
    of the starting item's own group (``group_first [E]``: the slot of each item's group's first
    item): no timeline is needed.
    """
    through = prefix_sum(tokens)                                         # [E] tokens through each item
    before = through - tokens
    if policy == Release.STAGE and group_first is not None:
        return (before - before[group_first])[:, None] * per_token[None, :]
    used = ends >= 0
    rel = prefix_max(jnp.where(used[:, None], release, -jnp.inf))                # [G, N]
    released_through = prefix_max(jnp.where(used, through[jnp.maximum(ends, 0)], 0.0))   # [G] tokens
    # every start is compared with every group's release: stored once, not recomputed per comparison
    start, rel, released_through = computed_once((start, rel, released_through))
    G = ends.shape[0]
    if G <= 64:
        released = jnp.max(jnp.where(rel[None, :, :] <= start[:, None, :], released_through[None, :, None], 0.0),
                           axis=1)
    else:
        count = jax.vmap(count_sorted, in_axes=(1, 1), out_axes=1)(rel, start)        # [E, N] groups released
        released = jnp.concatenate([jnp.zeros_like(released_through[:1]), released_through])[count]
    return (before[:, None] - released) * per_token[None, :]


def peak_memory(start, tokens, per_token, activation, weights, ends, release, valid, group_first=None,
                policy: Release = Release.REQUEST):
    """Peak memory of each stage and its parts, resolved in time (no MBKR).

    Args:
      start: ``[E, N]`` start time of each item on each stage (s).
      tokens: ``[E]`` KV tokens each item writes (prompt tokens x requests; 0 for padding).
      per_token: ``[N]`` KV bytes per token on each stage.
      activation: ``[E, N]`` activation bytes of each item while it runs.
      weights: ``[N]`` weight bytes of each stage.
      ends: ``[G]`` timeline slots of the group ends (-1 unused); release: ``[G, N]`` their release times.
      valid: ``[E]`` real items.
      group_first, policy: see :func:`held_before_start`.

    Returns:
      ``(peak [N], kv_peak [N], memory_at_start [E, N])``: the largest memory, the largest KV
      (held + being written), and the memory when each item starts (bytes).
    """
    held = held_before_start(start, tokens, per_token, ends, release, group_first, policy)
    kv_now = jnp.where(valid[:, None], held + tokens[:, None] * per_token[None, :], 0.0)
    at_start = jnp.where(valid[:, None], weights[None, :] + kv_now + activation, 0.0)
    peak = jnp.maximum(weights, jnp.max(at_start, axis=0))
    return peak, jnp.max(kv_now, axis=0), at_start


def occupancy(start, finish, kv, activation, item_release, times, xp=jnp):
    """KV held and activation bytes of each stage just after each time in ``times`` (one configuration).

    Args:
      start, finish, kv, activation, item_release: ``[E, N]`` per item and stage.
      times: ``[T]`` query times (s).
      xp: array module, ``jax.numpy`` or ``numpy`` (on the host, where ``T`` changes from call to
        call and each length would be a program of its own).

    Returns:
      ``(kv [T, N], activation [T, N])`` bytes: KV held or being written, and the in-flight item's
      activation buffers (0 when the stage is idle).
    """
    at = times[:, None, None]
    running = (start[None] <= at) & (at < finish[None])
    holding = running | ((finish[None] <= at) & (at < item_release[None]))
    return (xp.sum(xp.where(holding, kv[None], 0.0), axis=1),
            xp.sum(xp.where(running, activation[None], 0.0), axis=1))
