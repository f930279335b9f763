"""Figures of the MOCAP study.  Each module has ``run_*`` (arrays) and ``plot_*`` (a PNG).

The ``figures/`` folder at the top of the repository holds the rendered PNGs and
``figures/make_figures.py``, which regenerates any of them from the command line.
"""

FIGURES = ("occupancy", "gantt", "chunks", "max_seq", "latency")
#: file formats every figure can be written in, chosen by the path's extension (matplotlib's back ends)
FIGURE_SUFFIXES = (".png", ".pdf", ".svg", ".eps", ".ps", ".jpg", ".jpeg", ".tif", ".tiff", ".webp")
