"""Figures of the MOCAP study.  Each module has ``run_*`` (arrays) and ``plot_*`` (a PNG).

The ``figures/`` folder at the top of the repository holds the rendered PNGs and
``figures/make_figures.py``, which regenerates any of them from the command line.
"""

FIGURES = ("occupancy", "gantt", "chunks", "max_seq", "latency")
