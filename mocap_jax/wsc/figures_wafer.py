"""The wafer figure: instances of a layout and the KV routes from prefill to decode instances."""

from __future__ import annotations

from .figures import pyplot, save_figure
from .hardware import WaferSpec
from .layout import Layout
from .placement import transfer_cost


def plot_placement(wafer: WaferSpec, layout: Layout, path, alpha: float = 1.0, title: str | None = None):
    """Draw the wafer, its instances and the KV routes (prefill centre -> nearest decode centre).

    Link width grows with the number of transfers sharing it.  Saves to ``path``
    (any format matplotlib knows, from the suffix) and returns the path.
    """
    plt = pyplot()
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch, Rectangle

    rep = transfer_cost(wafer, layout, alpha)
    fig, ax = plt.subplots(figsize=(0.9 * wafer.cols + 1.5, 0.9 * wafer.rows + 1.2))
    for r in range(wafer.rows):
        for c in range(wafer.cols):
            ax.add_patch(Rectangle((c - 0.45, r - 0.45), 0.9, 0.9, fc="#f2f2f2", ec="#bbbbbb", lw=0.5))
    colours = {"prefill": "#f4a259", "decode": "#5b8e7d"}
    counters = {"prefill": 0, "decode": 0}
    for inst in layout.instances:
        ax.add_patch(Rectangle((inst.col - 0.48, inst.row - 0.48), inst.cols - 0.04, inst.rows - 0.04,
                               fc=colours[inst.kind], ec="black", lw=1.2, alpha=0.75))
        cr, cc = inst.centre
        ax.text(inst.col + (inst.cols - 1) / 2, inst.row + (inst.rows - 1) / 2 + 0.27,
                f"{inst.kind[0].upper()}{counters[inst.kind]}", ha="center", va="center", fontsize=8, weight="bold",
                bbox=dict(boxstyle="round,pad=0.1", fc="white", ec="none", alpha=0.6))
        ax.plot(cc, cr, "k.", ms=4)
        counters[inst.kind] += 1
    for (a, b), u in rep.link_use.items():
        ra, ca = divmod(a, wafer.cols)
        rb, cb = divmod(b, wafer.cols)
        off = 0.08 if (b > a) else -0.08  # keep the two directions apart
        dx, dy = (0, off) if ra == rb else (off, 0)
        ax.annotate("", xy=(cb + dx, rb + dy), xytext=(ca + dx, ra + dy),
                    arrowprops=dict(arrowstyle="-|>", color="#c0392b" if u > 1 else "#2c3e50", lw=1.0 + 1.2 * (u - 1),
                                    shrinkA=0, shrinkB=0))
    ax.set_xlim(-0.6, wafer.cols - 0.4)
    ax.set_ylim(wafer.rows - 0.4, -0.6)
    ax.set_aspect("equal")
    ax.set_xticks(range(wafer.cols))
    ax.set_yticks(range(wafer.rows))
    ax.set_xlabel("die column")
    ax.set_ylabel("die row")
    ax.set_title(title or f"{wafer.name}: TransferCost {rep.cost:.1f} (alpha={alpha:g}, hops {rep.hop_sum}, "
                          f"shared links {rep.shared_links})", fontsize=9)
    ax.legend(handles=[Patch(fc=colours["prefill"], ec="black", label="prefill instance"),
                       Patch(fc=colours["decode"], ec="black", label="decode instance"),
                       Line2D([], [], color="#2c3e50", label="KV route"),
                       Line2D([], [], color="#c0392b", lw=2.2, label="shared link")],
              loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path, bbox_inches=None)


__all__ = ["plot_placement"]
