"""Per-stage KV occupancy over time, TeraPipe against MBKR (a heat map per scheme)."""

from __future__ import annotations

import numpy as np

from .. import api
from .style import plt, save


def run_occupancy(model="llama3-70b", hardware="mocap-4x4", seq_len=5_600_000, chunks=16, batch=1, num_batches=1,
                  **mbkr) -> dict:
    """KV held per stage over time with and without MBKR.

    Returns arrays: ``terapipe_times`` [T1] s, ``terapipe_kv`` [T1, N] bytes, ``mbkr_times`` [T2],
    ``mbkr_kv`` [T2, N], ``budget`` [N] bytes (KV budget per stage), plus scalars.
    """
    kw = dict(chunks=chunks, batch=batch, num_batches=num_batches)
    t = api.simulate(model, hardware, seq_len, "terapipe", **kw)
    m = api.simulate(model, hardware, seq_len, "mbkr", **kw, **mbkr)
    return {"terapipe_times": t.timeline_times, "terapipe_kv": t.timeline_kv_bytes, "mbkr_times": m.timeline_times,
            "mbkr_kv": m.timeline_kv_bytes, "budget": m.capacity_bytes - m.weight_bytes_per_stage,
            "terapipe_feasible": t.feasible, "mbkr_feasible": m.feasible, "spilled_bytes": m.extra["spilled_bytes"],
            "model": t.model, "hardware": t.hardware, "seq_len": seq_len, "batch": batch, "chunks": chunks}


def plot_occupancy(data: dict, path) -> str:
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    vmax = max(data["terapipe_kv"].max(), data["mbkr_kv"].max()) / 1e9
    for ax, key, title in ((axes[0], "terapipe", "TeraPipe (no MBKR)"), (axes[1], "mbkr", "MBKR (cross-half pairs)")):
        times, kv = data[f"{key}_times"], data[f"{key}_kv"] / 1e9
        im = ax.pcolormesh(times, np.arange(kv.shape[1] + 1), kv[:-1].T if len(times) > 1 else kv.T,
                           shading="flat" if len(times) > 1 else "auto", cmap="viridis", vmin=0, vmax=vmax)
        feas = data[f"{key}_feasible"]
        ax.set_title(f"{title}: {'fits' if feas else 'does NOT fit'}")
        ax.set_xlabel("time (s)")
    axes[0].set_ylabel("pipeline stage")
    cb = fig.colorbar(im, ax=axes, shrink=0.9)
    cb.set_label(f"KV held (GB); budget ~{data['budget'].min() / 1e9:.0f} GB per stage")
    fig.suptitle(f"Per-stage KV occupancy: {data['model']} on {data['hardware']}, S = {data['seq_len']:,} tokens, "
                 f"B = {data['batch']}, M = {data['chunks']} (spilled {data['spilled_bytes'] / 1e9:.0f} GB with MBKR)",
                 fontsize=10)
    return save(fig, path, tight_layout=False, bbox_inches="tight")
