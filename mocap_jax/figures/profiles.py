"""Predicted vs measured GPU operator times (``mocap-jax validate --profiles --figure``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def plot_profiles(report: dict[str, Any], path) -> Path:
    """Three log-log panels: GEMMs in case (a), GEMMs in case (b), collectives (datasheet link model).

    Written atomically (:func:`~mocap_jax.figures.style.save`).  Returns the path.
    """
    from .style import plt, save

    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2))
    panels = [("(a) GEMMs, efficiencies fitted on the other GPU", report["points"]["cross_gpu"]),
              ("(b) GEMMs, datasheet only", report["points"]["datasheet"])]
    for ax, (title, points) in zip(axes, panels):
        for gpu in sorted({p[0] for p in points}):
            m = np.array([[p[1], p[2]] for p in points if p[0] == gpu]) * 1e3
            ax.scatter(m[:, 0], m[:, 1], s=3, alpha=0.35, label=gpu)
        ax.set_title(title, fontsize=10)
    for r in report["collectives"]["rows"]:
        if r["link"] == "nvlink":
            ax = axes[2]
            ax.scatter(np.array(r["measured_s"]) * 1e3, np.array(r["predicted_s"]) * 1e3, s=3, alpha=0.35,
                       label=f"{r['folder']} {r['collective']} x{r['workers']}")
    axes[2].set_title("collectives inside a node, datasheet link model", fontsize=10)
    for ax in axes:
        ax.set_xscale("log")
        ax.set_yscale("log")
        lo, hi = ax.get_xlim()
        ax.plot([lo, hi], [lo, hi], color="0.4", lw=0.8)
        ax.set_xlabel("measured (ms)")
        ax.set_ylabel("predicted (ms)")
        ax.legend(fontsize=6, markerscale=3, loc="upper left")
    return Path(save(fig, path))
