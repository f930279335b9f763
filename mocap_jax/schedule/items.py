"""Work items: what flows through the pipeline stages, one table per batch.

An item is a chunk of tokens of a *request group* (the requests that travel together): for
chunked schemes (TeraPipe, MBKR, LBCP, MOCAP) one group holds the whole batch and its items are
the chunks of the partition; for GPipe each microbatch of whole requests is a group of one item;
a TeraPipe plan with batch splitting has several groups per batch, each sliced on its own.
Every table is built by :func:`item_table`, host-side with NumPy or traced with ``jax.numpy``,
with any leading batch axes.

Shapes: ``[..., K]`` with ``K`` item slots; padded slots have ``tokens == 0``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..costs import pytree
from ..specs import LIMITS, checks
from .prefix import prefix_max, prefix_sum

Array = Any


@pytree
class ItemTable:
    """The items of one batch, padded to ``K`` slots.

    Fields (each ``[..., K]``):
      tokens: int, prompt tokens per request in the item (a chunk size; S for GPipe); 0 = padding.
      prefix: int, tokens of the same requests processed before the item.
      requests: int, requests the item carries (0 for padding).
      group_last: int, slot of the last item of the item's group (its own slot for padding).
      last: bool, the item ends its group (its requests' LM head runs on the last stage).
      valid: bool, a real item.
    """

    tokens: Array
    prefix: Array
    requests: Array
    group_last: Array
    last: Array
    valid: Array


def _xp(x):
    return np if isinstance(x, np.ndarray) else jnp


def _cummax(x, xp):
    return np.maximum.accumulate(x, axis=-1) if xp is np else prefix_max(x, axis=x.ndim - 1)


def _cummin_reverse(x, xp):
    if xp is np:
        return np.minimum.accumulate(x[..., ::-1], axis=-1)[..., ::-1]
    return -prefix_max(-x[..., ::-1], axis=x.ndim - 1)[..., ::-1]


def _cumsum(x, xp):
    return np.cumsum(x, axis=-1) if xp is np else prefix_sum(x, axis=x.ndim - 1)


def item_table(tokens, requests, group) -> ItemTable:
    """The one builder of item tables.

    Args:
      tokens: ``[..., K]`` int tokens per request of each item (0 = padding; padding only after
        the real items).
      requests: ``[..., K]`` int requests each item carries.
      group: ``[..., K]`` int request group of each item, nondecreasing along the items (items of a
        group are consecutive).

    Returns:
      :class:`ItemTable` of NumPy arrays (NumPy inputs) or traced arrays (JAX inputs).
    """
    xp = _xp(tokens) if isinstance(tokens, (np.ndarray, jax.Array)) else np
    tokens = xp.asarray(tokens)
    group = xp.asarray(group)
    K = tokens.shape[-1]
    valid = tokens > 0
    slot = xp.broadcast_to(xp.arange(K), tokens.shape)
    shifted = xp.concatenate([group[..., :1] - 1, group[..., :-1]], axis=-1)
    first = _cummax(xp.where(group != shifted, slot, 0), xp)
    nxt = xp.concatenate([group[..., 1:], group[..., -1:] + 1], axis=-1)
    nxt_valid = xp.concatenate([valid[..., 1:], xp.zeros_like(valid[..., :1])], axis=-1)
    last = valid & ((nxt != group) | ~nxt_valid)
    group_last = _cummin_reverse(xp.where(last | ~valid, slot, K), xp)
    group_last = xp.where(valid, group_last, slot)
    total = _cumsum(tokens, xp)
    before_group = xp.take_along_axis(total - tokens, first, axis=-1)
    prefix = xp.where(valid, total - tokens - before_group, 0)
    return ItemTable(tokens=tokens.astype(np.int32), prefix=prefix.astype(np.int32),
                     requests=xp.where(valid, requests, 0).astype(np.int32), group_last=group_last.astype(np.int32),
                     last=last, valid=valid)


def chunked_items(partition, batch) -> ItemTable:
    """Items of a chunked batch: every chunk carries all ``batch`` requests (one group).

    Args:
      partition: ``[..., K]`` int chunk sizes, zeros after the last chunk.
      batch: int (or ``[...]``) requests in the batch.
    """
    xp = _xp(partition) if isinstance(partition, (np.ndarray, jax.Array)) else np
    partition = xp.asarray(partition)
    requests = xp.broadcast_to(xp.asarray(batch)[..., None], partition.shape)
    return item_table(partition, requests, xp.zeros(partition.shape, np.int32))


@pytree
class Chunks:
    """Chunked batches before their item tables are built: one request group each, so a table
    follows from the chunk sizes and the batch alone.  Evaluating programs build the table
    inside the compiled program (:meth:`table`), so many configurations cross to the device as two
    small arrays and the host builds nothing.

    Fields:
      sizes: ``[..., K]`` int chunk tokens per request, zeros after the last chunk.
      requests: ``[...]`` int requests in the batch.
    """

    sizes: Array
    requests: Array

    @classmethod
    def padded(cls, sizes, requests, slots: int) -> "Chunks":
        """Host-side chunks of ``[P, M]`` chunk sizes (zeros only as right padding) and ``[P]``
        batches in ``slots`` item slots: zero columns added, or trailing zero columns dropped."""
        sizes = np.asarray(sizes)
        P, M = sizes.shape
        if np.any(sizes[:, slots:]):
            raise ValueError(f"cannot pad {M} chunks into {slots} slots")
        out = np.zeros((P, slots), np.int32)
        out[:, :min(M, slots)] = sizes[:, :slots]
        return cls(sizes=out, requests=np.broadcast_to(np.asarray(requests, np.int32), (P,)).copy())

    def table(self) -> ItemTable:
        """The :class:`ItemTable` of :func:`chunked_items`."""
        return chunked_items(self.sizes, self.requests)


def gpipe_items(seq_len, batch, microbatch, slots: int, xp=np) -> ItemTable:
    """Items of a GPipe batch: microbatches of ``microbatch`` whole requests, each its own group.

    Args:
      seq_len, batch, microbatch: ints (or ``[...]`` arrays) S, B and requests per microbatch.
      slots: static number of item slots (>= ceil(B / microbatch)).
    """
    seq_len, batch, microbatch = (xp.asarray(v)[..., None] for v in (seq_len, batch, microbatch))
    k = xp.arange(slots)
    requests = xp.clip(batch - k * microbatch, 0, microbatch)
    tokens = xp.where(requests > 0, seq_len, 0)
    tokens, requests = xp.broadcast_arrays(tokens, requests)
    return item_table(tokens, requests, xp.broadcast_to(k, tokens.shape))


def uniform_partition(seq_len: int, chunks: int) -> np.ndarray:
    """TeraPipe-style equal chunks: ``S // M`` tokens each, the first ``S % M`` one more (``[M]`` int64)."""
    M = checks.integer("chunks", chunks, 1, LIMITS["chunks"])
    S = checks.integer("seq_len", seq_len, M, LIMITS["seq_len"], f" {M} chunks need at least {M} tokens.")
    base, extra = divmod(S, M)
    return base + (np.arange(M) < extra).astype(np.int64)


def uniform_partitions(seq_len: np.ndarray, chunks: int) -> np.ndarray:
    """:func:`uniform_partition` of each sequence length, ``[P] -> [P, M]``."""
    base, extra = np.divmod(np.asarray(seq_len, np.int64), int(chunks))
    return base[:, None] + (np.arange(int(chunks))[None, :] < extra[:, None])


def pad_items(items: ItemTable, slots: int) -> ItemTable:
    """Host-side table padded on the right to ``slots`` item slots (padding: no tokens, own slot as group end)."""
    K = items.tokens.shape[-1]
    if slots == K:
        return items
    if slots < K:
        raise ValueError(f"cannot pad {K} items into {slots} slots")
    pad = lambda x, v: np.concatenate([x, np.full(x.shape[:-1] + (slots - K,), v, x.dtype)], axis=-1)
    extra = np.broadcast_to(np.arange(K, slots), items.tokens.shape[:-1] + (slots - K,)).astype(np.int32)
    return ItemTable(tokens=pad(items.tokens, 0), prefix=pad(items.prefix, 0), requests=pad(items.requests, 0),
                     group_last=np.concatenate([items.group_last, extra], axis=-1), last=pad(items.last, False),
                     valid=pad(items.valid, False))
