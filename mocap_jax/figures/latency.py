"""Normalised E2E latency and saturation throughput per model and sequence length."""

from __future__ import annotations

import numpy as np

from .style import SCHEME_COLOURS, SCHEME_LABELS, plt, save


def table_from_rows(rows: list[dict]) -> dict:
    """Arrays ``[model][scheme] -> (seq_len[L], e2e_mean[L], throughput[L])`` from study rows."""
    out: dict = {}
    for r in rows:
        d = out.setdefault(r["model"], {}).setdefault(r["scheme"], {"seq_len": [], "e2e": [], "thr": []})
        d["seq_len"].append(r["seq_len"])
        d["e2e"].append(np.inf if r["e2e_latency_mean_s"] is None else r["e2e_latency_mean_s"])
        d["thr"].append(r["throughput_rps"] or 0.0)
    return out


def plot_latency(rows: list[dict], path, reference: str = "terapipe") -> str:
    data = table_from_rows(rows)
    models = list(data)
    fig, axes = plt.subplots(2, len(models), figsize=(3.6 * len(models), 6.5), squeeze=False)
    for j, model in enumerate(models):
        ref = data[model].get(reference)
        for scheme, d in data[model].items():
            S = np.asarray(d["seq_len"])
            e2e = np.asarray(d["e2e"], float)
            thr = np.asarray(d["thr"], float)
            base_e2e = np.asarray(ref["e2e"], float) if ref else np.ones_like(e2e)
            base_thr = np.asarray(ref["thr"], float) if ref else np.ones_like(thr)
            with np.errstate(divide="ignore", invalid="ignore"):
                ne = np.where(np.isfinite(e2e) & (base_e2e > 0), e2e / base_e2e, np.nan)
                nt = np.where(base_thr > 0, thr / base_thr, np.nan)
            kw = dict(label=SCHEME_LABELS.get(scheme, scheme), color=SCHEME_COLOURS.get(scheme))
            axes[0, j].plot(S, ne, "o-", **kw)
            axes[1, j].plot(S, nt, "o-", **kw)
        for i in range(2):
            axes[i, j].set_xscale("log", base=2)
            axes[i, j].grid(alpha=0.3)
        axes[0, j].set_title(model, fontsize=10)
        axes[1, j].set_xlabel("sequence length (tokens)")
    axes[0, 0].set_ylabel(f"E2E latency / {SCHEME_LABELS[reference]}")
    axes[1, 0].set_ylabel(f"saturation throughput / {SCHEME_LABELS[reference]}")
    axes[0, -1].legend(fontsize=7)
    fig.suptitle("Normalised end-to-end latency (at a common load) and saturation throughput", fontsize=11)
    return save(fig, path)
