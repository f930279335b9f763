"""The MOCAP study on embedded defaults: ``mocap-jax reproduce`` (DESIGN §1, §11; issue 6).

For the MOCAP wafer (``mocap-4x4``) and the four study models it evaluates GPipe,
TeraPipe and MOCAP plus the MBKR-only and LBCP-only ablations (E2E latency at a
common load and saturation throughput) across sequence lengths from 16K tokens to
the longest feasible, the longest feasible sequence against chunk count, and draws
the study's figures.  Tables go to ``results/*.csv``, figures to ``figures/``.

Chunk granularity scales with the sequence (``g = S / 256``) so every length shares
the same compiled programs; only the first evaluation of each shape compiles.
"""

from __future__ import annotations

import csv
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import api, compare
from .specs import STUDY_MODELS

STUDY_SCHEMES = ("gpipe", "terapipe", "mbkr", "lbcp", "mocap")
UNITS_PER_SEQUENCE = 256


@dataclass
class StudyConfig:
    """Embedded defaults of the study (override any field from Python or the CLI)."""

    hardware: str = "mocap-4x4"
    models: tuple = STUDY_MODELS
    schemes: tuple = STUDY_SCHEMES
    min_seq_len: int = 16384
    seq_factor: int = 4
    max_lengths: int = 5
    chunks: int = 16
    chains: int = 64
    steps: int = 150
    requests: int = 128
    chunk_counts: tuple = (4, 8, 16, 32, 64)
    figure_model: str = "llama3-70b"
    seed: int = 0
    quick: bool = False

    def __post_init__(self):
        if self.quick:
            self.models = self.models[:1]
            self.max_lengths = min(self.max_lengths, 2)
            self.chunk_counts = (8, 16)
            self.chains, self.steps, self.requests = 16, 40, 32


def study_lengths(model: str, cfg: StudyConfig) -> tuple[list[int], int]:
    """Sequence lengths 16K x 4^k up to the longest feasible (TeraPipe, B = 1), and that longest length."""
    smax = api.max_feasible_seq_len(model, cfg.hardware, "terapipe", chunks=cfg.chunks, batch=1,
                                    granularity=UNITS_PER_SEQUENCE * 64)
    lengths, S = [], cfg.min_seq_len
    while S <= smax and len(lengths) < cfg.max_lengths:
        lengths.append(S)
        S *= cfg.seq_factor
    return lengths, smax


def _write_csv(path: Path, rows: list[dict]) -> None:
    if not rows:
        return
    keys = list(dict.fromkeys(k for r in rows for k in r))
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: (json.dumps(v) if isinstance(v, (list, dict)) else ("inf" if v is None and k.endswith("_s")
                            else v)) for k, v in r.items()})
    os.replace(tmp, path)


def run_study(cfg: StudyConfig | None = None, results_dir="results", figures_dir="figures", log=print) -> dict:
    """Run the whole study; returns ``{"rows", "max_seq", "figures", "wall_s", "results_dir", "figures_dir"}``
    and writes files."""
    from .figures import chunks as fchunks, gantt as fgantt, latency as flatency, max_seq as fmax, occupancy as focc

    cfg = cfg or StudyConfig()
    t0 = time.perf_counter()
    res_dir, fig_dir = Path(results_dir), Path(figures_dir)
    res_dir.mkdir(parents=True, exist_ok=True)
    fig_dir.mkdir(parents=True, exist_ok=True)
    rows, longest = [], {}
    for model in cfg.models:
        lengths, smax = study_lengths(model, cfg)
        longest[model] = smax
        log(f"[{time.perf_counter() - t0:6.1f}s] {model}: lengths {', '.join(f'{s // 1024}K' for s in lengths)} "
            f"(longest feasible {smax:,} tokens)")
        for S in lengths:
            g = S // UNITS_PER_SEQUENCE
            settings = compare.PlanSettings(chunks=cfg.chunks, granularity=g, chains=cfg.chains, steps=cfg.steps,
                                            seed=cfg.seed)
            out = compare.compare(model, cfg.hardware, S, schemes=cfg.schemes, chunks=cfg.chunks, granularity=g,
                                  requests=cfg.requests, settings=settings, seed=cfg.seed, with_max_seq=False)
            for r in out["schemes"]:
                rows.append({"model": model, "hardware": out["hardware"], "seq_len": S, "load_rps": out["load_rps"],
                             **r})
            log(f"[{time.perf_counter() - t0:6.1f}s]   S = {S:>9,}: load {out['load_rps']:.3g} req/s, "
                + ", ".join(f"{r['scheme']} {_s(r['e2e_latency_mean_s'])}" for r in out["schemes"]))
    _write_csv(res_dir / "study.csv", rows)

    # longest feasible sequence against chunk count
    ms = fmax.run_max_seq(cfg.figure_model, cfg.hardware, cfg.chunk_counts, granularity=UNITS_PER_SEQUENCE * 64)
    max_rows = [{"model": cfg.figure_model, "hardware": cfg.hardware, "chunks": int(M),
                 **{f"max_seq_len_{s}": int(ms[s][i]) for s in ("terapipe", "mbkr")}}
                for i, M in enumerate(ms["chunk_counts"])]
    _write_csv(res_dir / "max_seq.csv", max_rows)
    log(f"[{time.perf_counter() - t0:6.1f}s] max sequence vs chunks done")

    figs = {"latency": flatency.plot_latency(rows, fig_dir / "latency_throughput.png"),
            "max_seq": fmax.plot_max_seq(ms, fig_dir / "max_seq_vs_chunks.png")}
    # KV heat map and Gantt chart at a length where MBKR spills (just past TeraPipe's limit at B = 1)
    i_m = list(ms["chunk_counts"]).index(cfg.chunks) if cfg.chunks in list(ms["chunk_counts"]) else -1
    s_t, s_m = int(ms["terapipe"][i_m]), int(ms["mbkr"][i_m])
    s_spill = ((s_t + s_m) // 2 if s_m > s_t else s_t) // 1024 * 1024   # past TeraPipe's limit, within MBKR's
    occ = focc.run_occupancy(cfg.figure_model, cfg.hardware, s_spill, chunks=cfg.chunks, num_batches=1)
    figs["occupancy"] = focc.plot_occupancy(occ, fig_dir / "kv_occupancy_heatmap.png")
    gd = fgantt.run_gantt(cfg.figure_model, cfg.hardware, s_spill, chunks=cfg.chunks, num_batches=1)
    figs["gantt"] = fgantt.plot_gantt(gd, fig_dir / "gantt_mbkr.png")
    cd = fchunks.run_chunks(cfg.figure_model, cfg.hardware, 65536, cfg.chunks, 256, cfg.chains, cfg.steps)
    figs["chunks"] = fchunks.plot_chunks(cd, fig_dir / "chunk_sizes.png")
    _write_csv(res_dir / "chunk_sizes.csv", [{"chunk": k, **{f"{key}_tokens": int(cd[f"{key}_partition"][k])
                                                             for key in ("uniform", "dp", "annealed")}}
                                             for k in range(len(cd["uniform_partition"]))])
    wall = time.perf_counter() - t0
    log(f"[{wall:6.1f}s] figures written to {fig_dir}/")
    return {"rows": rows, "max_seq": max_rows, "longest": longest, "figures": figs, "wall_s": wall,
            "results_dir": str(res_dir), "figures_dir": str(fig_dir)}


def _s(x):
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.3g}s"


def summary_table(result: dict) -> str:
    """Readable summary: per model and length, E2E latency and throughput relative to TeraPipe."""
    rows = result["rows"]
    lines = [f"{'model':20s} {'S':>9s} {'scheme':9s} {'B':>4s} {'E2E mean':>10s} {'E2E p99':>10s} {'sat. req/s':>11s} "
             f"{'E2E/TeraPipe':>13s} {'E2E/GPipe':>10s}"]
    for r in rows:
        rel_t = r.get("e2e_mean_vs_terapipe")
        rel_g = r.get("e2e_mean_vs_gpipe")
        lines.append(f"{r['model']:20s} {r['seq_len']:>9,} {r['scheme']:9s} {r['batch']:>4d} "
                     f"{_s(r['e2e_latency_mean_s']):>10s} {_s(r['e2e_latency_p99_s']):>10s} "
                     f"{r['throughput_rps']:>11.4g} {('-' if rel_t is None else f'{rel_t:.2f}x'):>13s} "
                     f"{('-' if rel_g is None else f'{rel_g:.2f}x'):>10s}")
    lines.append("")
    lines.append("longest feasible sequence vs chunks (" + result["max_seq"][0]["model"] + "): " + ", ".join(
        f"M={r['chunks']}: TeraPipe {r['max_seq_len_terapipe']:,} / MBKR {r['max_seq_len_mbkr']:,}"
        for r in result["max_seq"]))
    lines.append(f"wall time {result['wall_s']:.0f} s; results in {result.get('results_dir', 'results')}/*.csv, "
                 f"figures in {result.get('figures_dir', 'figures')}/*.png")
    return "\n".join(lines)
