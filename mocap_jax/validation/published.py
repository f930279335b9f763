"""Published end-to-end prefill measurements, and the simulator's prediction of each.

A table (CSV, one row per measurement) with the columns

=============  ==================================================================================
``id``         a name for the row (optional; the row number otherwise)
``model``      model preset or .json/.toml spec file
``gpu``        GPU preset key (:data:`mocap_jax.specs.gpus.GPUS`) or a .json/.toml hardware spec
``gpus``       GPUs used, ``tp x pp`` (data parallelism is not part of one request's prefill)
``tp``, ``pp`` tensor- and pipeline-parallel degrees
``precision``  ``bf16``, ``fp16`` (the same tensor peak) or ``fp8`` (GEMMs at the FP8 peak)
``chunking``   ``none``, ``fixed`` or ``dynamic`` (chunk sizes chosen at run time)
``chunk_tokens`` chunk size (the initial one for dynamic chunking); empty for ``none``
``smooth``     dynamic chunking's smoothing factor in [0, 1] (optional; default 0.75)
``seq_len``    prompt tokens per request; ``batch`` requests prefilled together
``metric``     ``ttft_s`` (time to first token, seconds) or ``prefill_tokens_per_s``
``measured``   the published number; ``software``, ``source`` (URL), ``where`` (table or
               sentence in the source)
=============  ==================================================================================

The shipped table is ``mocap_jax/data/published_prefill.csv``; any file in this format works.
A row is simulated as ``pp`` stage groups of ``tp`` GPUs on ``ceil(gpus / node size)`` nodes of
the GPU preset; chunked rows as TeraPipe-style pipelining of their chunks, the rest as one
whole-prompt item.  Fixed chunking: ``chunk_tokens`` each (the last one shorter).  Dynamic
chunking follows SGLang's rule: the next chunk ``c`` after ``L`` tokens solves
``cost(c, prefix L) = cost(chunk_tokens, prefix 0)`` on the cost model (equal chunk times), is
blended with the initial size as ``(1 - smooth) chunk_tokens + smooth c``, rounded down to a
multiple of 64 and kept at or above a quarter of the initial size.  The prediction excludes what the simulator does not model (scheduler
and framework overheads, tokenisation, sampling).
"""

from __future__ import annotations

import csv
import math
from importlib import resources
from pathlib import Path
from typing import Any

from ..specs import HardwareSpec, SpecError, get_hardware
from ..specs.checks import choice, integer, number, suggest
from ..specs.gpus import GPUS
from ..specs.hardware import gpu_node

COLUMNS = ("model", "gpu", "gpus", "tp", "pp", "precision", "chunking", "chunk_tokens", "seq_len", "batch", "metric",
           "measured", "software", "source")
METRICS = ("ttft_s", "prefill_tokens_per_s")
CHUNKING = ("none", "fixed", "dynamic")
PRECISIONS = ("bf16", "fp16", "fp8")
MISS = 0.25   # a prediction further than this from the measurement (relative) is a miss


def default_table() -> Path:
    """The table shipped with the package."""
    return Path(str(resources.files("mocap_jax") / "data" / "published_prefill.csv"))


def _int(where: str, row: dict, key: str, lo: int = 1) -> int:
    text = (row.get(key) or "").strip()
    try:
        value = float(text)
    except ValueError:
        raise SpecError(f"{where}: {key} must be an integer, got {text!r}") from None
    return integer(f"{where}: {key}", value, lo)


def load_published(path=None) -> list[dict[str, Any]]:
    """Rows of a published-measurement table (default: the shipped one), checked.

    Raises:
      SpecError: unreadable file, missing columns, or a row with a bad value (named by file,
        row and column, with what was expected).
    """
    path = default_table() if path is None else Path(path)
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            reader = csv.DictReader(fh)
            header = reader.fieldnames or []
            raw = list(reader)
    except OSError as e:
        raise SpecError(f"cannot read published-measurement table {str(path)!r}: {e.strerror}") from None
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise SpecError(f"{str(path)!r} lacks column(s) {missing}; a published-measurement table needs "
                        f"{', '.join(COLUMNS)} (and optionally id, where)")
    if not raw:
        raise SpecError(f"{str(path)!r} holds no measurements")
    rows = []
    for i, r in enumerate(raw, start=2):
        where = f"{path.name} line {i}"
        row = dict(id=(r.get("id") or "").strip() or f"row{i - 1}", model=(r["model"] or "").strip(),
                   gpu=(r["gpu"] or "").strip().lower(), software=r["software"], source=r["source"],
                   where=r.get("where") or "")
        for key in ("gpus", "tp", "pp", "seq_len", "batch"):
            row[key] = _int(where, r, key)
        if row["tp"] * row["pp"] != row["gpus"]:
            raise SpecError(f"{where}: gpus ({row['gpus']}) must equal tp x pp ({row['tp']} x {row['pp']})")
        row["precision"] = choice(f"{where}: precision", (r["precision"] or "").strip().lower(), PRECISIONS)
        row["chunking"] = choice(f"{where}: chunking", (r["chunking"] or "").strip().lower(), CHUNKING)
        row["chunk_tokens"] = None if row["chunking"] == "none" else _int(where, r, "chunk_tokens")
        smooth = (r.get("smooth") or "").strip()
        try:
            row["smooth"] = 0.75 if not smooth else float(smooth)
        except ValueError:
            raise SpecError(f"{where}: smooth must be a number in [0, 1], got {smooth!r}") from None
        number(f"{where}: smooth", row["smooth"], 0.0, 1.0)
        row["metric"] = choice(f"{where}: metric", (r["metric"] or "").strip(), METRICS)
        try:
            measured = float(r["measured"])
        except (TypeError, ValueError):
            raise SpecError(f"{where}: measured must be a number, got {r['measured']!r}") from None
        row["measured"] = number(f"{where}: measured", measured, 0.0, lo_open=True)
        if not row["model"]:
            raise SpecError(f"{where}: model is empty; give a preset name or a spec file")
        rows.append(row)
    return rows


def dynamic_partition(model, hw: HardwareSpec, seq_len: int, first: int, smooth: float, tp: int = 1) -> list[int]:
    """Chunk sizes of SGLang-style dynamic chunking (module docstring) on the cost model of one block."""
    import numpy as np

    from ..costs import HardwareParams, ModelParams, dense_layer_time, moe_layer_time
    from ..specs import get_model

    m = get_model(model)
    mp, hp = ModelParams.from_spec(m, np.float64), HardwareParams.from_spec(hw, np.float64)
    block = moe_layer_time if m.is_moe else dense_layer_time
    cost = lambda c, p: float(block(mp, hp, float(c), float(p), 1.0, np, float(tp)))
    target = cost(first, 0)
    floor = max(64, first // 4 // 64 * 64)
    chunks, done = [], 0
    while done < seq_len:
        lo, hi = 1, first
        while lo < hi:   # largest c <= first with cost(c, done) <= target
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if cost(mid, done) <= target else (lo, mid - 1)
        size = int(((1.0 - smooth) * first + smooth * lo) // 64 * 64)
        size = min(max(size, floor), seq_len - done)
        chunks.append(size)
        done += size
    return chunks


def row_hardware(row: dict) -> HardwareSpec:
    """The GPU nodes a row ran on: the GPU preset on ``ceil(gpus / node size)`` nodes, or a spec file."""
    gpu = row["gpu"]
    if gpu.endswith((".json", ".toml")):
        return get_hardware(gpu)
    if gpu not in GPUS:
        raise SpecError(f"unknown GPU {gpu!r} in row {row['id']}.{suggest(gpu, GPUS)} Presets: {', '.join(GPUS)}; "
                        f"or give a .json/.toml hardware spec file")
    per_node = GPUS[gpu].node_gpus
    nodes = math.ceil(row["gpus"] / per_node)
    precision = "fp8" if row["precision"] == "fp8" else "bf16"
    return gpu_node(gpu, min(row["gpus"], per_node), nodes, precision)


def predict_row(row: dict) -> dict[str, Any]:
    """Simulate one row; returns ``predicted`` (in the row's metric), ``latency_s``, ``feasible``, ``error``."""
    from .. import api

    hw = row_hardware(row)
    seq, batch = row["seq_len"], row["batch"]
    first = row["chunk_tokens"]
    partition = None
    if first is None:
        scheme = "gpipe"
    elif row["chunking"] == "fixed":
        scheme, partition = "terapipe", [first] * (seq // first) + ([seq % first] if seq % first else [])
    else:
        scheme, partition = "terapipe", dynamic_partition(row["model"], hw, seq, first, row["smooth"], row["tp"])
    r = api.simulate(row["model"], hw, seq, scheme, partition=partition, batch=batch, microbatch=batch,
                     num_batches=1, stages=row["pp"], tp=row["tp"], timeline=False)
    latency = r.prefill_latency_s if r.feasible else float("inf")
    predicted = latency if row["metric"] == "ttft_s" else batch * seq / latency
    error = predicted / row["measured"] - 1.0 if math.isfinite(predicted) else float("inf")
    return dict(row, hardware=hw.name, scheme=scheme, chunks=len(partition or [seq]), feasible=r.feasible,
                latency_s=latency,
                predicted=predicted, error=error, miss=not abs(error) <= MISS)


def published_report(path=None) -> dict[str, Any]:
    """Every row's prediction and error, the rows missed by more than 25%, and the MAPE over all rows."""
    rows = [predict_row(r) for r in load_published(path)]
    finite = [abs(r["error"]) for r in rows if math.isfinite(r["error"])]
    return dict(table=str(default_table() if path is None else path), rows=rows,
                sources=sorted({r["source"] for r in rows}),
                mape=100.0 * sum(finite) / len(finite) if finite else float("nan"),
                misses=[r["id"] for r in rows if r["miss"]], miss_threshold=MISS)
