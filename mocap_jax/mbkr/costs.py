"""What MBKR's spills cost: the spill write, remote reads, migrations and creditor blocking.

* **Spill write**: the moved bytes cross the route to the host once, on the debtor's item:
  ``hops x link_latency + bytes / (route bandwidth x eff_link)``.
* **Remote read**: an item whose group already spilled ``R`` bytes from its stage reads them back
  from the host over the same route; the part not hidden behind ``read_overlap`` of the item's
  local attention time lengthens the item.
* **Migration** (dynamic pairing): spilled KV moved from the old host to the new one, on the item
  whose start changed the partner.
* **Creditor blocking**: the host spends ``R / (hbm_bandwidth x eff_hbm)`` serving each read,
  from the debtor item's start: that delays the host's item in progress, or, if the host is idle,
  occupies it, so only the part overlapping its next item's start delays anything.

Shapes ``[E, N]`` (timeline items, stages).  Units: bytes, seconds.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ..costs import pytree
from ..schedule.prefix import count_sorted, prefix_sum
from .pairing import MBKRParams
from .spills import Spills

Array = Any


@pytree
class SpillCosts:
    """Seconds MBKR adds to each item on each stage, ``[E, N]`` each, and the read volume.

    Fields: ``write``, ``read`` (whole remote read), ``read_extra`` (its unhidden part),
    ``migrate``, ``block`` (creditor blocking charged to the host's item), ``read_bytes``.
    """

    write: Array
    read: Array
    read_extra: Array
    migrate: Array
    block: Array
    read_bytes: Array

    @property
    def extra(self):
        """Everything added to the item times: write + unhidden read + migration + blocking."""
        return self.write + self.read_extra + self.migrate + self.block


def _transfer(nbytes, hops, bandwidth, link_latency_s, eff_link):
    return jnp.where(nbytes > 0, hops * link_latency_s + nbytes / (bandwidth * eff_link), 0.0)


def creditor_blocking(serve, start, finish, host, stage_host=None):
    """Blocking ``[E, N]`` charged to the hosts' items by reads whose serving takes ``serve`` seconds.

    Each read is charged to its host's item in progress when the debtor's item starts (the first
    host item not finished by then); if that item has not started yet, only the part of the
    serving that overlaps its start; if the host has finished all its items, nothing (an idle
    host with no next item delays no one).  Padded items repeat the previous finish, so the
    first unfinished slot is always a real item; the host's finished items are counted in its sorted
    finish times (:func:`mocap_jax.schedule.prefix.count_sorted`).  ``stage_host [N]`` (static pairs)
    lets every item of a stage count in the same host's times; otherwise ``host [E, N]`` gives each
    item's host.
    """
    E, N = start.shape
    stage = jnp.arange(N)
    if stage_host is not None:
        c = jnp.where(stage_host >= 0, stage_host, stage)
        done = jax.vmap(count_sorted, in_axes=(1, 1), out_axes=1)(finish[:, c], start)
        creditor = jnp.broadcast_to(c, (E, N))
    else:
        creditor = jnp.where(host >= 0, host, stage[None, :])
        done = jax.vmap(jax.vmap(count_sorted))(finish.T[creditor], start)
    slot = jnp.minimum(done, E - 1)
    next_start = start[slot, creditor]
    charge = jnp.where(next_start <= start, serve, jnp.clip(start + serve - next_start, 0.0, serve))
    charged = (serve > 0) & (host >= 0) & (done < E)
    target = jnp.where(charged, creditor, N)
    return jnp.zeros((E, N + 1), serve.dtype).at[slot, target].add(jnp.where(charged, charge, 0.0))[:, :N]


def spill_costs(sp: Spills, start, finish, attention, group_first, mb: MBKRParams, link_latency_s, eff_link,
                hbm_bandwidth, eff_hbm, static_hosts=None) -> SpillCosts:
    """The costs of one configuration's spills on the timeline ``start``/``finish`` ``[E, N]``.

    Args:
      attention: ``[E, N]`` local attention seconds of each item (what can hide a read).
      group_first: ``[E]`` timeline slot of the first item of each item's group.
      static_hosts: ``[N]`` each stage's fixed partner (static pairs), or None (dynamic).
    """
    N = start.shape[1]
    stage = jnp.arange(N)[None, :]
    cum = prefix_sum(sp.moved)
    before = cum - sp.moved
    read_bytes = before - before[group_first]
    h = jnp.where(sp.host >= 0, sp.host, stage)
    stage_hops, stage_bandwidth = jnp.asarray(mb.stage_hops), jnp.asarray(mb.stage_bandwidth)
    hops, bandwidth = stage_hops[stage, h], stage_bandwidth[stage, h]
    read = _transfer(read_bytes, hops, bandwidth, link_latency_s, eff_link)
    write = _transfer(sp.moved, hops, bandwidth, link_latency_s, eff_link)
    m = jnp.where(sp.migrated_from >= 0, sp.migrated_from, stage)
    migrate = _transfer(sp.migrated, stage_hops[m, h], stage_bandwidth[m, h], link_latency_s, eff_link)
    serve = read_bytes / (hbm_bandwidth * eff_hbm)
    block = creditor_blocking(serve, start, finish, sp.host, static_hosts)
    return SpillCosts(write=write, read=read, read_extra=jnp.maximum(read - mb.read_overlap * attention, 0.0),
                      migrate=migrate, block=block, read_bytes=read_bytes)
