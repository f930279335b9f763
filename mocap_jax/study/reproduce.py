"""The MOCAP study on embedded defaults: ``mocap-jax reproduce``.

On the MOCAP wafer (``mocap-4x4``) and the four study models it compares GPipe, TeraPipe (uniform
and TeraPipe's own planner), the MBKR-only and LBCP-only ablations and MOCAP (E2E latency at a
common load, saturation throughput, B') across sequence lengths from 16K tokens to the longest
feasible; finds the longest feasible sequence against chunk count with and without MBKR, for two
workspace settings; draws the study's figures; and ends with the claims ledger
(:mod:`mocap_jax.study.claims`).  Tables go to ``results/*.csv`` (and ``results/claims.json``),
figures to ``figures/``.

Chunk granularity scales with the sequence (``g = S / 256``) so every length shares the same
compiled programs; only the first evaluation of each shape compiles.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

from ..api.search import max_feasible_seq_len
from ..partition.plan import PlanSettings
from ..specs import LIMITS, STUDY_MODELS, SpecError, checks
from ..specs.files import write_atomic, write_rows
from . import claims
from .compare import CompareSettings, batch_text, compare
from .steps import StepStore

STUDY_SCHEMES = ("gpipe", "terapipe", "terapipe-dp", "mbkr", "lbcp", "mocap")
UNITS_PER_SEQUENCE = 256


@dataclass
class StudyConfig:
    """Embedded defaults of the study (override any field from Python or the CLI)."""

    hardware: str = "mocap-4x4"
    models: tuple = STUDY_MODELS
    schemes: tuple = STUDY_SCHEMES
    min_seq_len: int = 16384
    seq_factor: int = 4
    max_lengths: int = 4
    chunks: int = 16
    chains: int = 32
    steps: int = 60
    requests: int = 96
    chunk_counts: tuple = (4, 8, 16, 32, 64)
    figure_model: str = "llama3-70b"
    seed: int = 1
    sensitivity: bool = True
    quick: bool = False

    def __post_init__(self):
        self.chunks = checks.integer("chunks", self.chunks, 1, UNITS_PER_SEQUENCE,
                                     f" The study cuts every sequence into {UNITS_PER_SEQUENCE} units.")
        self.min_seq_len = checks.integer("min_seq_len", self.min_seq_len, UNITS_PER_SEQUENCE, LIMITS["seq_len"])
        if self.min_seq_len % UNITS_PER_SEQUENCE:
            raise SpecError(f"min_seq_len = {self.min_seq_len} is not a multiple of {UNITS_PER_SEQUENCE}: the study "
                            f"cuts every sequence into {UNITS_PER_SEQUENCE} units; use e.g. 16384 or 262144")
        if self.quick:
            self.models = self.models[:1]
            self.max_lengths = min(self.max_lengths, 2)
            self.chunk_counts = (8, 16)
            self.chains, self.steps, self.requests = 16, 20, 32
            self.sensitivity = False


def study_lengths(model: str, cfg: StudyConfig) -> tuple[list[int], int]:
    """Sequence lengths 16K x 4^k up to the longest feasible (TeraPipe, one request), and that length."""
    smax = max_feasible_seq_len(model, cfg.hardware, "terapipe", chunks=cfg.chunks, batch=1, num_batches=1,
                                granularity=UNITS_PER_SEQUENCE * 64)
    lengths, S = [], cfg.min_seq_len
    while S <= smax and len(lengths) < cfg.max_lengths:
        lengths.append(S)
        S *= cfg.seq_factor
    return lengths, smax


def write_csv(path: Path, rows: list[dict]) -> None:
    """Rows as CSV, written atomically (lists and dicts as JSON, a missing latency as 'inf')."""
    if rows:
        write_rows(path, rows, lambda k, v: json.dumps(v) if isinstance(v, (list, dict, tuple)) else
                   ("inf" if v is None and k.endswith("_s") else v))


def comparison_settings(cfg: StudyConfig, S: int) -> CompareSettings:
    """The comparison setting of one sequence length of the study (granularity S / 256)."""
    plan = PlanSettings(chunks=cfg.chunks, granularity=S // UNITS_PER_SEQUENCE, chains=cfg.chains, steps=cfg.steps,
                        seed=cfg.seed)
    return CompareSettings(chunks=cfg.chunks, plan=plan, requests=cfg.requests, seed=cfg.seed, with_max_seq=False)


def run_study(cfg: StudyConfig | None = None, results_dir="results", figures_dir="figures", log=print,
              resume: bool = False) -> dict:
    """Run the whole study; returns its rows, the claims ledger and the figure paths, and writes files.

    Each comparison, the claims' longest sequences and each sensitivity variant are kept in
    ``results_dir/.reproduce-steps`` as they finish; with ``resume`` a rerun after an interruption
    takes them from there (when their inputs are the same) instead of running them again.  The
    directory is removed when the study completes.
    """
    from ..figures import chunks as fchunks, gantt as fgantt, latency as flatency, max_seq as fmax, occupancy as focc

    cfg = cfg or StudyConfig()
    t0 = time.perf_counter()
    res_dir, fig_dir = Path(results_dir), Path(figures_dir)
    res_dir.mkdir(parents=True, exist_ok=True)
    fig_dir.mkdir(parents=True, exist_ok=True)
    stamp = lambda: f"[{time.perf_counter() - t0:6.1f}s]"
    steps = StepStore(res_dir / ".reproduce-steps", resume)
    rows, longest, lengths_of = [], {}, {}
    for model in cfg.models:
        lengths, smax = study_lengths(model, cfg)
        longest[model], lengths_of[model] = smax, tuple(lengths)
        log(f"{stamp()} {model}: lengths {', '.join(f'{s // 1024}K' for s in lengths)} (longest feasible "
            f"{smax:,} tokens)")
        for S in lengths:
            out = study_comparison(steps, model, cfg.hardware, S, cfg.schemes, comparison_settings(cfg, S))
            for r in out["schemes"]:
                rows.append({"model": model, "hardware": out["hardware"], "seq_len": S, "load_rps": out["load_rps"],
                             "max_batch": out["max_batch"], **r})
            log(f"{stamp()}   S = {S:>9,}: load {out['load_rps']:.3g} req/s, "
                + ", ".join(f"{r['scheme']} {_s(r['e2e_latency_mean_s'])}" for r in out["schemes"])
                + (" (from an earlier run)" if steps.last_reused else ""))
    write_csv(res_dir / "study.csv", rows)

    ms = fmax.run_max_seq(cfg.figure_model, cfg.hardware, cfg.chunk_counts, granularity=UNITS_PER_SEQUENCE * 64)
    max_rows = [{"model": cfg.figure_model, "hardware": cfg.hardware, "chunks": int(M), "workspace": w,
                 **{f"max_seq_len_{s}": int(ms[(w, s)][i]) for s in ("terapipe", "mbkr")}}
                for w in ms["workspaces"] for i, M in enumerate(ms["chunk_counts"])]
    write_csv(res_dir / "max_seq.csv", max_rows)
    log(f"{stamp()} max sequence vs chunks done")

    figs = {"latency": flatency.plot_latency(rows, fig_dir / "latency_throughput.png"),
            "max_seq": fmax.plot_max_seq(ms, fig_dir / "max_seq_vs_chunks.png")}
    # KV heat map and Gantt chart at a length where MBKR spills (between TeraPipe's and MBKR's limits)
    counts = list(ms["chunk_counts"])
    i_m = counts.index(cfg.chunks) if cfg.chunks in counts else 0
    s_t, s_m = int(ms[("tile", "terapipe")][i_m]), int(ms[("tile", "mbkr")][i_m])
    s_spill = ((s_t + s_m) // 2 if s_m > s_t else s_t) // 1024 * 1024
    M_fig = counts[i_m]
    occ = focc.run_occupancy(cfg.figure_model, cfg.hardware, s_spill, chunks=M_fig, num_batches=1)
    figs["occupancy"] = focc.plot_occupancy(occ, fig_dir / "kv_occupancy_heatmap.png")
    gd = fgantt.run_gantt(cfg.figure_model, cfg.hardware, s_spill, chunks=M_fig, num_batches=1)
    figs["gantt"] = fgantt.plot_gantt(gd, fig_dir / "gantt_mbkr.png")
    cd = fchunks.run_chunks(cfg.figure_model, cfg.hardware, 65536, cfg.chunks, 256, cfg.chains, cfg.steps)
    figs["chunks"] = fchunks.plot_chunks(cd, fig_dir / "chunk_sizes.png")
    write_csv(res_dir / "chunk_sizes.csv", [{"chunk": k, **{f"{key}_tokens": int(cd[f"{key}_partition"][k])
                                                            for key in ("uniform", "dp", "annealed")}}
                                            for k in range(len(cd["uniform_partition"]))])
    log(f"{stamp()} figures written to {fig_dir}/")

    ledger, sensitivity = run_claims(cfg, rows, lengths_of, log=log, stamp=stamp, steps=steps)
    write_atomic(res_dir / "claims.json", json.dumps({"ledger": ledger, "sensitivity": sensitivity}, indent=1,
                                                     default=_json_default))
    write_csv(res_dir / "claims.csv", [{k: v for k, v in r.items() if k != "sensitivity"} for r in ledger])
    if sensitivity:
        figs["claims"] = claims.plot_sensitivity(ledger, fig_dir / "claims_sensitivity.png")
    wall = time.perf_counter() - t0
    if steps.reused:
        log(f"{stamp()} finished steps taken from an earlier run: {steps.reused}")
    steps.finish()
    log(f"{stamp()} done")
    return {"rows": rows, "max_seq": max_rows, "longest": longest, "figures": figs, "claims": ledger,
            "wall_s": wall, "results_dir": str(res_dir), "figures_dir": str(fig_dir)}


def study_comparison(steps: StepStore, model: str, hardware: str, seq_len: int, schemes, settings: CompareSettings):
    """One comparison of the study (``compare``), kept in ``steps`` as it finishes."""
    return steps.run("compare", {"model": model, "hardware": hardware, "seq_len": seq_len, "schemes": schemes,
                                 "settings": settings},
                     lambda: compare(model, hardware, seq_len, schemes=schemes, settings=settings))


def run_claims(cfg: StudyConfig, rows: list[dict], lengths_of: dict, log=print, stamp=lambda: "",
               steps: StepStore | None = None):
    """The claims ledger from the study rows, max-sequence rows of every model, and the sensitivity runs
    (each kept in ``steps`` as it finishes, where given)."""
    setting = claims.ClaimSetting(models=cfg.models, hardware=cfg.hardware, lengths=lengths_of,
                                  chunk_counts=tuple(m for m in (4, 8, 16, 32) if m in cfg.chunk_counts) or
                                  cfg.chunk_counts, chains=cfg.chains, steps=cfg.steps, requests=cfg.requests)
    compute = lambda: claims.max_seq_rows(setting, claims.Variant())
    seq_rows = steps.run("max-seq", {"setting": setting}, compute) if steps else compute()
    first = cfg.models[0]
    default_rows = [r for r in rows if r["model"] == first and r["seq_len"] == lengths_of[first][0]] \
        if lengths_of.get(first) else []
    default_seq = [r for r in seq_rows if r["model"] == first]
    sensitivity = None
    if cfg.sensitivity:
        reduced = claims.reduced_setting({first: tuple(lengths_of[first][1:3]) or lengths_of[first]})
        sensitivity = claims.run_sensitivity(reduced, log=lambda m: log(f"{stamp()} {m}"), steps=steps)
    ledger = claims.ledger(rows, seq_rows, default_rows, default_seq, sensitivity)
    log(f"{stamp()} claims ledger done")
    return ledger, sensitivity


def _json_default(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if hasattr(x, "tolist"):
        return x.tolist()
    raise TypeError(type(x).__name__)


def _s(x):
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.3g}s"


def summary_table(result: dict) -> str:
    """Readable summary: per model and length, E2E latency and throughput relative to TeraPipe and GPipe,
    then the claims ledger."""
    from ..cli.common import table

    rows = [{**r, "batch": batch_text(r["batch"], r["max_batch"])} for r in result["rows"]]
    body = table(rows, [("model", "model"), ("seq_len", "S"), ("scheme", "scheme"), ("batch", "B'"),
                                  ("e2e_latency_mean_s", "E2E mean s"), ("e2e_latency_p99_s", "E2E p99 s"),
                                  ("throughput_rps", "sat. req/s"), ("e2e_mean_vs_terapipe", "E2E/TeraPipe"),
                                  ("e2e_mean_vs_gpipe", "E2E/GPipe")])
    seq = result["max_seq"]
    lines = [body, "B' (cap): the search's upper end (max_batch); a larger batch may fit too.", "",
             "longest feasible sequence vs chunks (" + (seq[0]["model"] if seq else "-") + "): " + "; ".join(
        f"M={r['chunks']} {r['workspace']}: TeraPipe {r['max_seq_len_terapipe']:,} / MBKR {r['max_seq_len_mbkr']:,}"
        for r in seq), "", "claims ledger (MOCAP paper vs this simulator):", claims.format_ledger(result["claims"]),
        "", f"wall time {result['wall_s']:.0f} s; results in {result.get('results_dir', 'results')}/*.csv, "
            f"figures in {result.get('figures_dir', 'figures')}/*.png"]
    return "\n".join(lines)
