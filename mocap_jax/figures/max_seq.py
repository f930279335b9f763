"""Longest feasible sequence against chunk count, with and without MBKR."""

from __future__ import annotations

import numpy as np

from .. import api
from ..specs import get_hardware
from .style import SCHEME_COLOURS, SCHEME_LABELS, plt, save


#: the workspace settings the figure compares: the default MLP token tile, and the untiled engine
WORKSPACES = (("tile", None), ("untiled", 0))


def run_max_seq(model="llama3-70b", hardware="mocap-4x4", chunk_counts=(4, 8, 16, 32, 64), batch=1,
                granularity=4096, schemes=("terapipe", "mbkr"), num_batches=1, workspaces=WORKSPACES) -> dict:
    """``max_seq_len[(workspace, scheme)]`` ``[len(chunk_counts)]`` tokens (multiples of ``granularity``) for
    each workspace setting (``(label, mlp_token_tile)``; None keeps the hardware's own tile)."""
    hw = get_hardware(hardware)
    out = {"chunk_counts": np.asarray(chunk_counts), "model": model, "hardware": hw.name, "batch": batch,
           "tile": hw.mlp_token_tile, "workspaces": [w for w, _ in workspaces]}
    for label, tile in workspaces:
        h = hw if tile is None else hw.replace(mlp_token_tile=tile)
        for s in schemes:
            out[(label, s)] = np.array([api.max_feasible_seq_len(model, h, s, chunks=M, batch=batch,
                                                                 granularity=granularity, num_batches=num_batches)
                                        for M in chunk_counts])
    return out


def plot_max_seq(data: dict, path) -> str:
    fig, ax = plt.subplots(figsize=(6.5, 4))
    styles = {"tile": "o-", "untiled": "s--"}
    for w in data["workspaces"]:
        name = f"MLP tile {data['tile']:,} tokens" if w == "tile" else "untiled MLP"
        for s in ("terapipe", "mbkr"):
            if (w, s) in data:
                ax.plot(data["chunk_counts"], data[(w, s)] / 1e6, styles.get(w, "o-"), label=f"{SCHEME_LABELS[s]}, {name}",
                        color=SCHEME_COLOURS[s])
    ax.set_xscale("log", base=2)
    ax.set_xlabel("chunks per request M")
    ax.set_ylabel("longest feasible sequence (million tokens)")
    ax.set_title(f"Max sequence length: {data['model']} on {data['hardware']}, B = {data['batch']}", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save(fig, path)
