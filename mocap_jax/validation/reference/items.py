"""The work items of the reference: what flows through the stages, built from the contract's words.

A batch is split into *request groups* (requests that travel together); each group is cut into
items (chunks of its prompt), consecutive in item order.  A group is written ``(requests,
[tokens of each item])``:

* chunked schemes (``terapipe``, ``mbkr``): one group ``(B, partition)``;
* TeraPipe plans: several groups ``(b_g, slicing_g)``, prefixes restarting at each group;
* ``gpipe``: microbatches of ``microbatch`` whole requests, each a group of one item of S tokens.

``num_batches`` identical batches run back to back; the item order is batch 0's items, then
batch 1's, and so on.  The last item of a group ends its requests (the LM head runs on the last
stage for one token per request).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Item:
    """One work item.

    Attributes:
      index: position in item order over every batch.
      batch: which of the consecutive batches it belongs to.
      group: request group, numbered over every batch.
      group_first, group_last: item indices of the group's first and last items.
      tokens: prompt tokens per request in the item.
      prefix: tokens of the same requests processed before the item.
      requests: requests the item carries.
      last: the item ends its group.
    """

    index: int
    batch: int
    group: int
    group_first: int
    group_last: int
    tokens: int
    prefix: int
    requests: int
    last: bool


Group = tuple[int, Sequence[int]]


def uniform_partition(seq_len: int, chunks: int) -> list[int]:
    """``c_k = S // M + (1 if k < S % M else 0)`` for ``k < M``."""
    base, extra = divmod(int(seq_len), int(chunks))
    return [base + (1 if k < extra else 0) for k in range(int(chunks))]


def scheme_groups(scheme: str, seq_len: int, batch: int, partition: Sequence[int], microbatch: int) -> list[Group]:
    """The request groups of one batch of a scheme: one chunked group, or GPipe's microbatches."""
    if scheme == "gpipe":
        return [(min(microbatch, batch - j), [seq_len]) for j in range(0, batch, microbatch)]
    return [(batch, list(partition))]


def build_items(groups: Sequence[Group], num_batches: int = 1) -> list[Item]:
    """The items of ``num_batches`` identical batches made of ``groups``, in item order."""
    items: list[Item] = []
    group = 0
    for batch in range(num_batches):
        for requests, tokens in groups:
            first = len(items)
            last = first + len(tokens) - 1
            prefix = 0
            for c in tokens:
                items.append(Item(index=len(items), batch=batch, group=group, group_first=first, group_last=last,
                                  tokens=int(c), prefix=prefix, requests=int(requests), last=len(items) == last))
                prefix += int(c)
            group += 1
    return items


__all__ = ["Group", "Item", "build_items", "scheme_groups", "uniform_partition"]
