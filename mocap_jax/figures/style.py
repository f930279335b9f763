"""Shared matplotlib set-up (headless backend, consistent colours per scheme)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SCHEME_COLOURS = {"gpipe": "#7f7f7f", "terapipe": "#1f77b4", "terapipe-dp": "#17becf", "mbkr": "#2ca02c",
                  "lbcp": "#ff7f0e", "mocap": "#d62728"}
SCHEME_LABELS = {"gpipe": "GPipe", "terapipe": "TeraPipe (uniform)", "terapipe-dp": "TeraPipe (DP)",
                 "mbkr": "MBKR only", "lbcp": "LBCP only", "mocap": "MOCAP (MBKR + LBCP)"}


def save(fig, path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return str(path)
