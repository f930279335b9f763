"""Chunk sizes and per-chunk bottleneck times: uniform (TeraPipe) against LBCP."""

from __future__ import annotations

import numpy as np

from .. import api
from ..partition.plan import PlanSettings, plan_partition
from .style import SCHEME_COLOURS, plt, save


def run_chunks(model="llama3-70b", hardware="mocap-4x4", seq_len=65536, chunks=16, granularity=256, chains=128,
               steps=300, scheme="mocap", seed=0) -> dict:
    """Uniform, DP and annealed partitions (tokens, ``[M]``) and each chunk's time on the busiest stage (s)."""
    plan = plan_partition(model, hardware, seq_len, scheme,
                          settings=PlanSettings(chunks=chunks, granularity=granularity, chains=chains, steps=steps,
                                                seed=seed))
    per = plan["per_chunks"][0]
    out = {"model": plan["model"], "hardware": plan["hardware"], "seq_len": seq_len, "batch": per["batch"],
           "scheme": scheme}
    for key in ("uniform", "dp", "annealed"):
        part = np.asarray(per[key]["partition"])
        r = api.simulate(model, hardware, seq_len, "mbkr" if scheme == "mocap" else "terapipe", partition=part,
                         batch=max(per[key]["batch"], 1), num_batches=1, timeline=False)
        out[f"{key}_partition"] = part
        out[f"{key}_chunk_time_s"] = r.stage_times.max(axis=1)
        out[f"{key}_objective_s"] = per[key]["objective_s"]
        out[f"{key}_batch"] = per[key]["batch"]
    return out


def plot_chunks(data: dict, path) -> str:
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4))
    M = len(data["uniform_partition"])
    x = np.arange(M)
    w = 0.38
    for off, key, label, colour in ((-w / 2, "uniform", "uniform (TeraPipe)", SCHEME_COLOURS["terapipe"]),
                                    (w / 2, "annealed", "LBCP (DP + annealing)", SCHEME_COLOURS["lbcp"])):
        a1.bar(x + off, data[f"{key}_partition"] / 1e3, w, label=label, color=colour)
        a2.plot(x, data[f"{key}_chunk_time_s"] * 1e3, "o-", label=f"{label}: B' = {data[f'{key}_batch']}, "
                f"{data[f'{key}_objective_s']:.3g} s per request", color=colour)
    a1.set_xlabel("chunk index")
    a1.set_ylabel("chunk size (thousand tokens)")
    a1.set_title("Chunk sizes")
    a1.legend(fontsize=8)
    a2.set_xlabel("chunk index")
    a2.set_ylabel("bottleneck-stage time per chunk (ms)")
    a2.set_title("Per-chunk time: LBCP balances the growing prefix")
    a2.legend(fontsize=8)
    fig.suptitle(f"{data['model']} on {data['hardware']}, S = {data['seq_len']:,}; each partition at its own B'",
                 fontsize=10)
    return save(fig, path)
