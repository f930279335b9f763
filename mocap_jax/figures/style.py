"""Shared matplotlib set-up (headless backend, consistent colours per scheme)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ..specs import SpecError  # noqa: E402
from . import FIGURE_SUFFIXES  # noqa: E402

SCHEME_COLOURS = {"gpipe": "#7f7f7f", "terapipe": "#1f77b4", "terapipe-dp": "#17becf", "mbkr": "#2ca02c",
                  "lbcp": "#ff7f0e", "mocap": "#d62728"}
SCHEME_LABELS = {"gpipe": "GPipe", "terapipe": "TeraPipe (uniform)", "terapipe-dp": "TeraPipe (DP)",
                 "mbkr": "MBKR only", "lbcp": "LBCP only", "mocap": "MOCAP (MBKR + LBCP)"}


def check_figure_path(path) -> Path:
    """``path`` as a :class:`Path` whose extension names a format :data:`FIGURE_SUFFIXES` lists."""
    path = Path(path)
    if path.suffix.lower() not in FIGURE_SUFFIXES:
        raise SpecError(f"{str(path)!r}: a figure is written in the format its extension names; use one of "
                        f"{', '.join(FIGURE_SUFFIXES)}")
    return path


def save(fig, path, *, tight_layout: bool = True, bbox_inches=None) -> str:
    """Write ``fig`` to ``path`` and close it.  The write is atomic (a temporary file in the same
    folder, then a rename), so an interrupted run never leaves half a figure in place of the last one."""
    path = check_figure_path(path)
    if tight_layout:
        fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=130, bbox_inches=bbox_inches)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
        plt.close(fig)
    return str(path)
