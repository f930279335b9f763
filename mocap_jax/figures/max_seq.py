"""Longest feasible sequence against chunk count, with and without MBKR."""

from __future__ import annotations

import numpy as np

from .. import api
from .style import SCHEME_COLOURS, SCHEME_LABELS, plt, save


def run_max_seq(model="llama3-70b", hardware="mocap-4x4", chunk_counts=(4, 8, 16, 32, 64), batch=1,
                granularity=4096, schemes=("terapipe", "mbkr"), num_batches=1) -> dict:
    """``max_seq_len[scheme]`` ``[len(chunk_counts)]`` tokens (multiples of ``granularity``)."""
    out = {"chunk_counts": np.asarray(chunk_counts), "model": model, "hardware": hardware, "batch": batch}
    for s in schemes:
        out[s] = np.array([api.max_feasible_seq_len(model, hardware, s, chunks=M, batch=batch, granularity=granularity,
                                                    num_batches=num_batches) for M in chunk_counts])
    return out


def plot_max_seq(data: dict, path) -> str:
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for s in ("gpipe", "terapipe", "mbkr", "lbcp", "mocap"):
        if s in data:
            ax.plot(data["chunk_counts"], data[s] / 1e6, "o-", label=SCHEME_LABELS[s], color=SCHEME_COLOURS[s])
    ax.set_xscale("log", base=2)
    ax.set_xlabel("chunks per request M")
    ax.set_ylabel("longest feasible sequence (million tokens)")
    ax.set_title(f"Max sequence length: {data['model']} on {data['hardware']}, B = {data['batch']}", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save(fig, path)
