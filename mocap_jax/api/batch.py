"""``simulate_batch``: thousands of configurations of one model and hardware in compiled, vectorised calls."""

from __future__ import annotations

import numpy as np

from ..mbkr.pairing import DEFAULT_P1, DEFAULT_P2, DEFAULT_READ_OVERLAP
from ..prefill.batch import ALL_FIELDS, BLOCK, evaluate_points
from ..prefill.points import batched_items
from ..schedule.items import Chunks, gpipe_items, uniform_partitions
from ..schedule.shape import bucket
from ..specs import LIMITS, SpecError, checks
from .config import DEFAULT_CHUNKS, GPIPE_PARTITION, check_chunks, resolve

#: the fields ``simulate_batch`` returns by default (every field of the evaluation but the timeline arrays)
DEFAULT_FIELDS = tuple(f for f in ALL_FIELDS if f not in ("finish", "start", "item_times", "moved", "extra", "block",
                                                          "host", "stage_times", "handoff_times"))


def simulate_batch(model, hardware, seq_len, scheme: str = "terapipe", *, chunks: int | None = None, batch=1,
                   partition=None, release: str = "stage", admission: str = "streaming", num_batches: int = 2,
                   microbatch: int = 1, stages: int | None = None, placement=None, dtype="float32",
                   block_size: int = BLOCK, k_pad: int | None = None, pairing: str = "cross-half",
                   p1: float = DEFAULT_P1, p2: float = DEFAULT_P2, read_overlap: float = DEFAULT_READ_OVERLAP,
                   spill: str = "overflow", fields=DEFAULT_FIELDS, tp: int = 1) -> dict[str, np.ndarray]:
    """Evaluate P configurations of one model and hardware.

    Args:
      seq_len: int or ``[P]`` ints.
      batch: int or ``[P]`` ints.
      partition: optional ``[P, M]`` int chunk sizes (each row sums to its seq_len); rows may be
        zero-padded on the right to mix chunk counts.  Default: uniform partitions into
        ``chunks`` (default 16).
      block_size: configurations per compiled call (bounds memory; the last block is padded).
      k_pad: item slots (default: the power-of-two bucket of the largest item count).
      fields: :class:`~mocap_jax.prefill.evaluate.Evaluation` fields to return.

    Returns:
      dict of NumPy arrays with a leading axis P: ``prefill_latency_s``, ``feasible``,
      ``throughput_rps``, ``peak_mem_bytes_per_stage`` [P, N_pad], ...
    """
    seq = checks.integers("seq_len", np.atleast_1d(seq_len), 1, LIMITS["seq_len"])
    bat = checks.integers("batch", np.atleast_1d(batch), 1, LIMITS["batch"])
    block_size = checks.integer("block_size", block_size, 8, 1 << 20)
    if seq.ndim != 1 or bat.ndim != 1:
        raise SpecError("seq_len and batch must be scalars or 1-D arrays")
    if not seq.size or not bat.size:
        raise SpecError("seq_len and batch need at least one value each")
    fields = (fields,) if isinstance(fields, str) else tuple(fields)
    unknown = [f for f in fields if f not in ALL_FIELDS]
    if unknown or not fields:
        raise SpecError(f"unknown field(s) {unknown}; choose from {', '.join(ALL_FIELDS)}" if unknown else
                        "fields must name at least one field of the evaluation")
    if partition is not None:
        part = checks.integers("partition", np.asarray(partition), 0, LIMITS["seq_len"])
        part = part[None, :] if part.ndim == 1 else part
        if part.ndim != 2:
            raise SpecError(f"partition must be [P, M] chunk sizes, got shape {part.shape}")
    else:
        part = None
    sizes = [len(x) for x in (seq, bat) + ((part,) if part is not None else ()) if len(x) > 1]
    if len(set(sizes)) > 1:
        raise SpecError(f"seq_len, batch and partition hold different numbers of configurations: {sorted(set(sizes))}")
    P = sizes[0] if sizes else 1
    seq, bat = np.broadcast_to(seq, (P,)), np.broadcast_to(bat, (P,))
    if scheme != "gpipe":
        if part is None:
            M = DEFAULT_CHUNKS if chunks is None else check_chunks(chunks)
            if np.any(seq < M):
                raise SpecError(f"{M} chunks need seq_len >= {M}; got seq_len {int(seq.min())}")
            part = uniform_partitions(seq, M)
        part = np.broadcast_to(part, (P, part.shape[1]))
        live = part > 0
        counts = np.count_nonzero(live, axis=1)                          # [P] chunks of each row
        if not counts.all() or np.any(live[:, 1:] & ~live[:, :-1]):
            raise SpecError("partition rows must hold positive chunk sizes, zeros only as right padding")
        wrong = part.sum(1) != seq
        if wrong.any():
            bad = int(np.argmax(wrong))
            raise SpecError(f"partition row {bad} sums to {int(part[bad].sum())} but seq_len is {int(seq[bad])}")
        if partition is not None and chunks is not None and np.any(counts != check_chunks(chunks)):
            raise SpecError(f"chunks={chunks} but partition rows have {sorted(set(counts.tolist()))} chunks; "
                            f"pass one or the other")
        items_needed = int(counts.max())
    else:
        if part is not None:
            raise SpecError(GPIPE_PARTITION)
        items_needed = int(-(-bat.max() // checks.integer("microbatch", microbatch, 1, LIMITS["batch"])))
    if items_needed > LIMITS["chunks"]:
        raise SpecError(f"{items_needed} items per batch exceed the {LIMITS['chunks']} the simulator holds")
    slots = bucket(items_needed) if k_pad is None else checks.integer("k_pad", k_pad, items_needed, LIMITS["chunks"])
    first = part[0][part[0] > 0] if scheme != "gpipe" else None
    cfg = resolve(model, hardware, int(seq[0]), scheme, batch=int(bat[0]), partition=first, release=release,
                  admission=admission, num_batches=num_batches, microbatch=microbatch, placement=placement,
                  stages=stages, dtype=dtype, pairing=pairing, p1=p1, p2=p2, read_overlap=read_overlap, spill=spill,
                  tp=tp)
    if scheme == "gpipe":
        items = gpipe_items(seq, bat, cfg.microbatch, slots)
    else:
        items = Chunks.padded(part, bat, slots)                          # tables built on the device
    pts, axes = batched_items(cfg.point(slots), items)
    return evaluate_points(pts, cfg.shape(slots), axes, P, tuple(fields), block=block_size)
