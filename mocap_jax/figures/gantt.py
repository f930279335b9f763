"""Pipeline Gantt chart: every item on every stage, showing bubbles and MBKR blocking."""

from __future__ import annotations

import numpy as np

from .. import api
from .style import plt, save


def run_gantt(model="llama3-70b", hardware="mocap-4x4", seq_len=5_600_000, chunks=16, batch=1, scheme="mbkr",
              partition=None, num_batches=1, **mbkr) -> dict:
    """Start and finish of each item on each stage (``[K, N]`` seconds) and MBKR's extra time per item.

    ``blocking`` / ``read`` ``[K, N]``: seconds of creditor blocking / unhidden remote reads inside each item.
    """
    r = api.simulate(model, hardware, seq_len, scheme, chunks=None if partition is not None else chunks, batch=batch,
                     partition=partition, num_batches=num_batches, timeline=False, **mbkr)
    K, N = r.finish_times.shape
    block = r.extra.get("mbkr_block_times")
    blocking = np.zeros((K, N)) if block is None else np.asarray(block).reshape(K, N)
    return {"start": r.start_times, "finish": r.finish_times, "blocking": blocking,
            "items_per_batch": r.extra["items_per_batch"], "scheme": scheme, "model": r.model,
            "hardware": r.hardware, "seq_len": seq_len, "batch": r.batch, "latency_s": r.prefill_latency_s,
            "bubble_fraction": r.bubble_fraction}


def plot_gantt(data: dict, path) -> str:
    start, finish = data["start"], data["finish"]
    K, N = start.shape
    kb = data["items_per_batch"]
    fig, ax = plt.subplots(figsize=(12, 0.32 * N + 1.8))
    cmap = plt.get_cmap("viridis")
    for s in range(N):
        for k in range(K):
            ax.barh(s, finish[k, s] - start[k, s], left=start[k, s], height=0.8,
                    color=cmap((k % kb) / max(kb - 1, 1)), edgecolor="white", linewidth=0.3)
            b = data["blocking"][k, s]
            if b > 0:
                ax.barh(s, b, left=finish[k, s] - b, height=0.8, color="none", edgecolor="red", hatch="////",
                        linewidth=0.0)
    ax.set_yticks(range(N))
    ax.set_ylabel("pipeline stage")
    ax.set_xlabel("time (s)")
    ax.invert_yaxis()
    sm = plt.cm.ScalarMappable(cmap=cmap, norm=plt.Normalize(0, kb - 1))
    fig.colorbar(sm, ax=ax, label="chunk index")
    from matplotlib.patches import Patch
    ax.legend(handles=[Patch(facecolor="none", edgecolor="red", hatch="////", label="MBKR creditor blocking"),
                       Patch(facecolor="white", edgecolor="grey", label="white gaps = pipeline bubbles")],
              loc="upper right", fontsize=8)
    ax.set_title(f"{data['scheme']}: {data['model']} on {data['hardware']}, S = {data['seq_len']:,}, B = {data['batch']}"
                 f"; latency {data['latency_s']:.4g} s, bubbles {100 * data['bubble_fraction']:.0f}%, creditor blocking "
                 f"{data['blocking'].sum():.3g} s in all", fontsize=10)
    return save(fig, path)
