"""Entry points of the reference: validate the arguments, build the items, run the event loop.

:func:`reference_simulate` takes the arguments of :func:`mocap_jax.api.simulate` (scheme,
lengths, batches, policies, MBKR settings); :func:`reference_run` takes an explicit list of
request groups per batch (for example a TeraPipe plan with several groups).  Every bad argument
raises one :class:`~mocap_jax.specs.SpecError` (a ``ValueError``) before anything is simulated.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ...specs import LIMITS, SpecError, checks, get_hardware, get_model
from ...specs.mesh import snake_placement
from .engine import Engine
from .items import Group, build_items, scheme_groups, uniform_partition
from .quantities import quantities
from .result import ReferenceResult, summarise
from .spill import MBKRSettings, static_partners

SCHEMES = ("gpipe", "terapipe", "mbkr")
RELEASE_POLICIES = ("stage", "request")
ADMISSION_MODES = ("streaming", "synchronous")


def _placement(hw, model, placement) -> np.ndarray:
    if placement is None:
        pl = snake_placement(hw)
    else:
        pl = checks.integers("placement", placement, 0, hw.num_dies - 1)
        if pl.ndim != 1 or pl.size == 0 or len(set(pl.tolist())) != pl.size:
            raise SpecError(f"placement must list distinct die indices in [0, {hw.num_dies}), "
                            f"got {np.asarray(placement).tolist()}")
    if len(pl) > model.layers:
        raise SpecError(f"{model.name} has {model.layers} layers, fewer than the {len(pl)} stages of the placement; "
                        f"place at most {model.layers} stages")
    return np.asarray(pl, np.int64)


def _groups(groups) -> list[Group]:
    try:
        pairs = [(requests, tokens) for requests, tokens in groups]
    except (TypeError, ValueError):
        raise SpecError("groups must be a list of (requests, [tokens of each item]) pairs") from None
    if not pairs:
        raise SpecError("groups must hold at least one request group")
    out = []
    for g, (requests, tokens) in enumerate(pairs):
        b = checks.integer(f"requests of group {g}", requests, 1, LIMITS["batch"])
        c = checks.integers(f"tokens of group {g}", tokens, 1, LIMITS["seq_len"])
        if c.ndim != 1 or c.size == 0:
            raise SpecError(f"tokens of group {g} must be a non-empty list of chunk sizes, got {tokens!r}")
        if int(c.sum()) > LIMITS["seq_len"]:
            raise SpecError(f"group {g} covers {int(c.sum()):,} tokens, more than the {LIMITS['seq_len']:,} "
                            f"the simulator represents")
        out.append((b, [int(x) for x in c]))
    if sum(len(c) for _, c in out) > LIMITS["chunks"]:
        raise SpecError(f"the groups hold more than the {LIMITS['chunks']} items per batch the simulator holds")
    return out


def reference_run(model, hardware, groups: Sequence[Group], *, release: str = "stage",
                  admission: str = "streaming", num_batches: int = 2, placement=None,
                  mbkr: MBKRSettings | None = None) -> ReferenceResult:
    """Simulate batches made of explicit request groups, event by event.

    Args:
      model, hardware: preset names, spec file paths or spec objects.
      groups: one batch's request groups in run order, each ``(requests, [tokens of each item])``.
      release: ``stage`` or ``request``; admission: ``streaming`` or ``synchronous``.
      num_batches: identical batches run back to back.
      placement: die of each stage (default: the snake order over every die).
      mbkr: MBKR settings, or None for no MBKR.

    Returns:
      :class:`ReferenceResult`.
    """
    m, hw = get_model(model), get_hardware(hardware)
    checks.choice("release policy", release, RELEASE_POLICIES)
    checks.choice("admission mode", admission, ADMISSION_MODES)
    nb = checks.integer("num_batches", num_batches, 1, LIMITS["num_batches"])
    if mbkr is not None and not isinstance(mbkr, MBKRSettings):
        raise SpecError(f"mbkr must be MBKRSettings or None, got {type(mbkr).__name__}")
    pl = _placement(hw, m, placement)
    items = build_items(_groups(groups), nb)
    pairs = None
    if mbkr is not None and mbkr.pairing in ("cross-half", "head-to-tail"):
        pairs = [(s, p) for s, p in enumerate(static_partners(mbkr.pairing, len(pl))) if p > s]
    q = quantities(m, hw, items, pl, pairs)
    return summarise(Engine(q, items, release, admission, mbkr).run(), q, pl)


def reference_simulate(model, hardware, seq_len, scheme: str = "terapipe", chunks=None, batch=1, partition=None,
                       release: str = "stage", admission: str = "streaming", num_batches=2, microbatch=1,
                       placement=None, pairing: str = "cross-half", p1=0.0, p2=0.85, read_overlap=0.5,
                       spill: str = "overflow") -> ReferenceResult:
    """Simulate one configuration event by event, with the arguments of :func:`mocap_jax.api.simulate`.

    Args:
      model, hardware: preset names, spec file paths or spec objects.
      seq_len: prompt tokens S per request.
      scheme: ``terapipe`` (chunked), ``gpipe`` (microbatches of whole requests) or ``mbkr``
        (chunked with memory-balanced KV reallocation).
      chunks: M of the uniform partition (default 16) when ``partition`` is None.
      batch: requests B per batch; partition: chunk sizes summing to S (chunked schemes).
      release, admission: KV release policy and admission mode.
      num_batches: identical batches run back to back; microbatch: requests per GPipe microbatch.
      placement: die of each stage; default the snake order over every die, for every scheme (the
        reference searches no placement: pass the array side's to compare MBKR runs).
      pairing, p1, p2, read_overlap, spill: MBKR settings (used by ``mbkr``).

    Returns:
      :class:`ReferenceResult`.
    """
    checks.choice("scheme", scheme, SCHEMES)
    S = checks.integer("seq_len", seq_len, 1, LIMITS["seq_len"], " Pass the prompt length in tokens, e.g. 65536.")
    B = checks.integer("batch", batch, 1, LIMITS["batch"])
    micro = checks.integer("microbatch", microbatch, 1, LIMITS["batch"])
    settings = MBKRSettings(pairing, p1, p2, read_overlap, spill)
    if scheme == "gpipe":
        if partition is not None:
            raise SpecError("partition applies to the chunked schemes (terapipe, mbkr), not gpipe")
        part: list[int] = []
    elif partition is not None:
        arr = checks.integers("partition", partition, 1, LIMITS["seq_len"])
        if arr.ndim != 1 or arr.size == 0:
            raise SpecError(f"partition must be a non-empty list of chunk sizes, got {partition!r}")
        if int(arr.sum()) != S:
            raise SpecError(f"partition sums to {int(arr.sum())} tokens but seq_len is {S}: chunk sizes must add "
                            f"up to the sequence length")
        if chunks is not None and checks.integer("chunks", chunks, 1, LIMITS["chunks"]) != arr.size:
            raise SpecError(f"chunks={chunks} but the partition has {arr.size} chunks; pass one or the other")
        part = [int(x) for x in arr]
    else:
        M = 16 if chunks is None else checks.integer("chunks", chunks, 1, LIMITS["chunks"])
        if M > S:
            raise SpecError(f"{M} chunks need at least {M} tokens but seq_len is {S}; use fewer chunks")
        part = uniform_partition(S, M)
    return reference_run(model, hardware, scheme_groups(scheme, S, B, part, micro), release=release,
                         admission=admission, num_batches=num_batches, placement=placement,
                         mbkr=settings if scheme == "mbkr" else None)


__all__ = ["ADMISSION_MODES", "RELEASE_POLICIES", "SCHEMES", "reference_run", "reference_simulate"]
