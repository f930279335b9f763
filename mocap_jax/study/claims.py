"""The claims ledger: the MOCAP paper's headline results, what this simulator says, and why they differ.

Five claims (:data:`CLAIMS`), each a number computed the same way from a *setting* (models,
sequence lengths, chunk counts) and a set of *assumptions* (hardware and runtime parameters):

(a) MOCAP's mean E2E latency is 76.4% lower than GPipe's on average;
(b) MOCAP's saturation throughput is 3.24x GPipe's on average;
(c) MOCAP's longest feasible sequence is up to 1.31x TeraPipe's (MBKR against uniform chunks, one
    request, the best ratio over models and chunk counts);
(d) fewer chunks allow longer feasible sequences (with MBKR): the share of models whose longest
    sequence falls as the chunk count grows (Spearman correlation below zero);
(e) MOCAP has the lowest E2E latency and the highest throughput of MOCAP, TeraPipe and GPipe in
    every setting: the share of settings where it does (ties within 0.1% count).

For each claim the ledger reports the paper's figure, ours at our defaults (Llama-3-70B on the
4 x 4 wafer, the shortest study length), ours under the paper's stated setting (4 x 4 dies of
4.5 PFLOP/s, 180 GB HBM at 7.7 TB/s, 5 TB/s D2D; Llama3-70B, Mistral-123B, Qwen3-235B,
Llama3-405B; E2E = queueing + prefill; throughput in requests/s -- these are the simulator's
defaults, so the two differ only in the models and lengths), and a verdict; then a one-at-a-time
sensitivity over the assumptions that could decide it (:data:`ASSUMPTIONS`), on a reduced
setting, drawn as a tornado figure; the assumption that moves each claim most is named.

Verdicts: *reproduced* when ours is within 25% of the paper's figure (or the qualitative claim
holds in every case), *same direction* when it points the same way (MOCAP better, MBKR longer,
a negative correlation) but is farther, *contradicted* otherwise.  A setting where a scheme does
not fit is reported in its row (``None``), never a crash.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..partition.plan import PlanSettings
from ..prefill.points import MBKRSettings
from ..specs import STUDY_MODELS, SpecError, get_hardware
from .compare import CompareSettings, compare

#: claim id -> (statement, paper's figure, kind): kind "reduction" (1 - ours / GPipe, mean),
#: "ratio_mean", "ratio_max", "share"
CLAIMS = {
    "a": ("MOCAP's E2E latency is lower than GPipe's by 76.4% on average", 0.764, "reduction"),
    "b": ("MOCAP's throughput is 3.24x GPipe's on average", 3.24, "ratio_mean"),
    "c": ("MOCAP's longest feasible sequence is up to 1.31x TeraPipe's", 1.31, "ratio_max"),
    "d": ("fewer chunks allow longer feasible sequences", 1.0, "share"),
    "e": ("MOCAP has the lowest E2E latency and the highest throughput of MOCAP, TeraPipe and GPipe everywhere",
          1.0, "share"),
}
TIE = 1e-3


@dataclass(frozen=True)
class Variant:
    """One assumption set: hardware field changes, comparison-setting changes, and a load fraction."""

    name: str = "defaults"
    value: str = "default"
    hardware: tuple = ()
    settings: tuple = ()
    load_fraction: float = 0.5


#: the assumptions the sensitivity varies, one at a time: (name, [(label, hardware changes, settings changes, load)])
ASSUMPTIONS = (
    ("MLP token tile", [("untiled", (("mlp_token_tile", 0),), (), 0.5),
                        ("16,384 tokens", (("mlp_token_tile", 16384),), (), 0.5)]),
    ("activation buffers", [("none", (("activation_buffer_scale", 0.0),), (), 0.5)]),
    ("MBKR p2", [("0.70", (), (("p2", 0.70),), 0.5), ("1.00", (), (("p2", 1.0),), 0.5)]),
    ("MBKR spill policy", [("eager", (), (("spill", "eager"),), 0.5)]),
    ("admission", [("synchronous", (), (("admission", "synchronous"),), 0.5)]),
    ("KV release", [("request", (), (("release", "request"),), 0.5)]),
    ("GPipe microbatch", [("1 request", (), (("microbatches", (1,)),), 0.5),
                          ("8 requests", (), (("microbatches", (8,)),), 0.5)]),
    ("GEMM efficiency", [("-15%", (("eff_gemm", 0.85),), (), 0.5), ("+15%", (("eff_gemm", 1.15),), (), 0.5)]),
    ("attention efficiency", [("-15%", (("eff_attention", 0.85),), (), 0.5),
                              ("+15%", (("eff_attention", 1.15),), (), 0.5)]),
    ("load", [("25% of saturation", (), (), 0.25), ("90% of saturation", (), (), 0.9)]),
    ("D2D bandwidth", [("1 TB/s", (("link_bandwidth", 1e12), ("cross_wafer_bandwidth", 1e12)), (), 0.5),
                       ("10 TB/s", (("link_bandwidth", 10e12), ("cross_wafer_bandwidth", 10e12)), (), 0.5)]),
    # the chunk count of every chunked scheme (uniform TeraPipe, MOCAP's LBCP search); TeraPipe's own
    # planner chooses its slicing freely, so a fixed M can decide claim (e) by itself
    ("chunk count", [("M = 64", (), (("chunks", 64),), 0.5), ("M = 128", (), (("chunks", 128),), 0.5)]),
)
#: hardware fields given as factors of the default (efficiencies), not values
FACTOR_FIELDS = ("eff_gemm", "eff_attention")


def variants() -> list[Variant]:
    out = [Variant()]
    for name, values in ASSUMPTIONS:
        for label, hw, st, load in values:
            out.append(Variant(name, label, hw, st, load))
    return out


@dataclass
class ClaimSetting:
    """Where a claim is evaluated: models, lengths per model, chunk counts, and the search budgets."""

    models: tuple = STUDY_MODELS
    hardware: str = "mocap-4x4"
    lengths: dict = field(default_factory=dict)        # model -> sequence lengths
    chunk_counts: tuple = (4, 8, 16, 32)
    chunks: int = 16
    chains: int = 32
    steps: int = 60
    requests: int = 64
    granularity_units: int = 256
    max_seq_granularity: int = 16384


def _hardware(setting: ClaimSetting, v: Variant):
    hw = get_hardware(setting.hardware)
    changes = {k: (getattr(hw, k) * x if k in FACTOR_FIELDS else x) for k, x in v.hardware}
    changes = {k: (min(x, 1.0) if k in FACTOR_FIELDS else x) for k, x in changes.items()}
    return hw.replace(**changes) if changes else hw


def _compare_settings(setting: ClaimSetting, v: Variant, S: int) -> CompareSettings:
    st = dict(v.settings)
    mbkr = MBKRSettings(p2=st.pop("p2", MBKRSettings().p2), spill=st.pop("spill", "overflow"))
    chunks = st.pop("chunks", setting.chunks)
    g = max(S // setting.granularity_units, 1)
    plan = PlanSettings(chunks=chunks, granularity=g, chains=setting.chains, steps=setting.steps)
    return CompareSettings(chunks=chunks, plan=plan, requests=setting.requests, mbkr=mbkr,
                           with_max_seq=False, **st)


def comparison_rows(setting: ClaimSetting, v: Variant, log=None) -> list[dict]:
    """GPipe, TeraPipe, TeraPipe-DP and MOCAP at every (model, length) of the setting."""
    hw = _hardware(setting, v)
    rows = []
    for model in setting.models:
        for S in setting.lengths.get(model, ()):
            st = _compare_settings(setting, v, S)
            base = compare(model, hw, S, schemes=("gpipe", "terapipe", "terapipe-dp", "mocap"), settings=st)
            sat = [r["throughput_rps"] for r in base["schemes"] if r["feasible"] and r["throughput_rps"] > 0]
            if v.load_fraction != 0.5 and sat:
                base = compare(model, hw, S, schemes=("gpipe", "terapipe", "terapipe-dp", "mocap"), settings=st,
                               load=v.load_fraction * min(sat))
            for r in base["schemes"]:
                rows.append({"model": model, "seq_len": S, "load_rps": base["load_rps"], **r})
            if log:
                log(f"    {v.name} = {v.value}: {model} S = {S:,} done")
    return rows


def max_seq_rows(setting: ClaimSetting, v: Variant) -> list[dict]:
    """Longest feasible sequence (one request) with and without MBKR for every model and chunk count."""
    from ..api.search import max_feasible_seq_len

    hw = _hardware(setting, v)
    st = dict(v.settings)
    kw = dict(batch=1, num_batches=1, granularity=setting.max_seq_granularity,
              release=st.get("release", "stage"), admission=st.get("admission", "streaming"))
    mb = dict(p2=st.get("p2", MBKRSettings().p2), spill=st.get("spill", "overflow"))
    rows = []
    for model in setting.models:
        for M in setting.chunk_counts:
            t = max_feasible_seq_len(model, hw, "terapipe", chunks=M, **kw)
            m = max_feasible_seq_len(model, hw, "mbkr", chunks=M, **kw, **mb)
            rows.append({"model": model, "chunks": M, "terapipe": t, "mbkr": m})
    return rows


def _by_setting(rows: list[dict]) -> dict:
    out: dict = {}
    for r in rows:
        out.setdefault((r["model"], r["seq_len"]), {})[r["scheme"]] = r
    return out


def _ok(r) -> bool:
    return r is not None and r.get("feasible") and r.get("e2e_latency_mean_s") is not None


def claim_values(cmp_rows: list[dict], seq_rows: list[dict]) -> dict:
    """The five claim metrics from comparison rows and max-sequence rows (None where nothing fits)."""
    groups = _by_setting(cmp_rows)
    red, thr, wins = [], [], []
    for schemes in groups.values():
        mo, gp = schemes.get("mocap"), schemes.get("gpipe")
        if _ok(mo) and _ok(gp):
            red.append(1.0 - mo["e2e_latency_mean_s"] / gp["e2e_latency_mean_s"])
            thr.append(mo["throughput_rps"] / gp["throughput_rps"])
        if _ok(mo):
            others = [schemes[s] for s in ("gpipe", "terapipe", "terapipe-dp") if _ok(schemes.get(s))]
            wins.append(all(mo["e2e_latency_mean_s"] <= o["e2e_latency_mean_s"] * (1 + TIE) and
                            mo["throughput_rps"] >= o["throughput_rps"] * (1 - TIE) for o in others))
        elif any(_ok(schemes.get(s)) for s in ("gpipe", "terapipe", "terapipe-dp")):
            wins.append(False)
    ratios = [r["mbkr"] / r["terapipe"] for r in seq_rows if r["terapipe"] > 0]
    falling = []
    for model in dict.fromkeys(r["model"] for r in seq_rows):
        ms = [(r["chunks"], r["mbkr"]) for r in seq_rows if r["model"] == model and r["mbkr"] > 0]
        if len(ms) >= 2:
            falling.append(_spearman([m for m, _ in ms], [s for _, s in ms]) < 0)
    mean = lambda xs: float(np.mean(xs)) if xs else None
    return {"a": mean(red), "b": mean(thr), "c": float(max(ratios)) if ratios else None,
            "d": mean([float(x) for x in falling]), "e": mean([float(x) for x in wins])}


def _spearman(x, y) -> float:
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
    if np.std(rx) == 0 or np.std(ry) == 0:
        return 0.0
    return float(np.corrcoef(rx, ry)[0, 1])


def verdict(claim: str, ours) -> str:
    """reproduced / same direction / contradicted / not evaluated."""
    if ours is None:
        return "not evaluated (nothing fits)"
    _, paper, kind = CLAIMS[claim]
    if kind == "share":
        return "reproduced" if ours >= 1.0 - 1e-9 else ("same direction" if ours > 0.5 else "contradicted")
    if kind == "reduction":
        same = ours > 0
    else:
        same = ours > 1.0 + TIE
    close = abs(ours - paper) <= 0.25 * abs(paper)
    return "reproduced" if close and same else ("same direction" if same else "contradicted")


def ledger(study_rows: list[dict], study_seq_rows: list[dict], default_rows: list[dict], default_seq_rows: list[dict],
           sensitivity: dict | None = None) -> list[dict]:
    """One row per claim: the paper's figure, ours at defaults and under the paper's setting, the
    verdict, and (with ``sensitivity``) the range per assumption and the one that moves it most."""
    ours_default = claim_values(default_rows, default_seq_rows)
    ours_paper = claim_values(study_rows, study_seq_rows)
    rows = []
    for cid, (text, paper, kind) in CLAIMS.items():
        row = {"claim": cid, "statement": text, "paper": paper, "ours_defaults": ours_default[cid],
               "ours_paper_setting": ours_paper[cid], "verdict": verdict(cid, ours_paper[cid])}
        rows.append(with_sensitivity(row, sensitivity) if sensitivity else row)
    return rows


def with_sensitivity(row: dict, sensitivity: dict) -> dict:
    """A ledger row with the range of its claim under each assumption (its values and the default's)
    and the assumption whose range is widest."""
    cid = row["claim"]
    base = sensitivity["defaults"]["default"][cid]
    spans = {}
    for name, values in sensitivity.items():
        if name == "defaults":
            continue
        vals = [v[cid] for v in values.values() if v[cid] is not None] + ([base] if base is not None else [])
        if vals:
            spans[name] = (min(vals), max(vals))
    row = {k: v for k, v in row.items() if k not in ("moved_most_by", "moved_most_range")}
    row["sensitivity_base"] = base
    row["sensitivity"] = {k: list(v) for k, v in spans.items()}
    if spans:
        top = max(spans, key=lambda k: spans[k][1] - spans[k][0])
        row["moved_most_by"] = top
        row["moved_most_range"] = list(spans[top])
    return row


def run_sensitivity(setting: ClaimSetting, log=None, steps=None) -> dict:
    """Claim metrics for the default assumptions and each one-at-a-time variant: ``{name: {value: metrics}}``.

    ``steps`` (a :class:`~mocap_jax.study.steps.StepStore`) keeps each variant's metrics on disk as it
    finishes, so an interrupted run resumes at the next variant.
    """
    out: dict = {}
    t0 = time.perf_counter()
    for v in variants():
        compute = lambda v=v: claim_values(comparison_rows(setting, v), max_seq_rows(setting, v))
        metrics = steps.run("sensitivity", {"setting": setting, "variant": v}, compute) if steps else compute()
        out.setdefault(v.name, {})[v.value] = metrics
        if log:
            log(f"[{time.perf_counter() - t0:6.1f}s] sensitivity {v.name} = {v.value}: "
                + ", ".join(f"({k}) {_fmt(x)}" for k, x in metrics.items())
                + (" (from an earlier run)" if steps and steps.last_reused else ""))
    return out


def _fmt(x) -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.3g}"


#: the fields every ledger row has (what :func:`format_ledger` prints)
LEDGER_FIELDS = ("claim", "statement", "paper", "ours_defaults", "ours_paper_setting", "verdict")


def read_ledger(path) -> list[dict]:
    """The claims ledger of a ``claims.json`` written by ``mocap-jax reproduce`` (``SpecError`` if it is not one)."""
    try:
        data = json.loads(Path(path).read_text())
    except ValueError as e:
        raise SpecError(f"{path} is not JSON ({e}); delete it or pass --run to recompute the ledger") from None
    rows = data.get("ledger") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and set(LEDGER_FIELDS) <= set(r) for r in rows):
        raise SpecError(f"{path} is not a claims ledger written by mocap-jax reproduce (a 'ledger' list of rows "
                        f"with {', '.join(LEDGER_FIELDS)}); delete it or pass --run to recompute the ledger")
    return rows


def format_ledger(rows: list[dict]) -> str:
    """The ledger as text."""
    lines = ["claim  paper    ours (defaults)  ours (paper setting)  verdict          moved most by"]
    for r in rows:
        moved = r.get("moved_most_by")
        span = r.get("moved_most_range")
        extra = f"{moved} ({_fmt(span[0])} .. {_fmt(span[1])})" if moved else "-"
        lines.append(f"({r['claim']})    {_fmt(r['paper']):7s}  {_fmt(r['ours_defaults']):15s}  "
                     f"{_fmt(r['ours_paper_setting']):20s}  {r['verdict']:15s}  {extra}")
        lines.append(f"       {r['statement']}")
    return "\n".join(lines)


def plot_sensitivity(rows: list[dict], path) -> str:
    """Tornado figure: per claim, the range of its metric under each assumption's values."""
    from ..figures.style import plt, save

    with_sens = [r for r in rows if r.get("sensitivity")]
    fig, axes = plt.subplots(1, max(len(with_sens), 1), figsize=(4.2 * max(len(with_sens), 1), 4.8), squeeze=False)
    for ax, r in zip(axes[0], with_sens):
        items = sorted(r["sensitivity"].items(), key=lambda kv: kv[1][1] - kv[1][0])
        base = r["sensitivity_base"]
        for i, (name, (lo, hi)) in enumerate(items):
            ax.barh(i, hi - lo, left=lo, color="#1f77b4", alpha=0.8)
        ax.set_yticks(range(len(items)))
        ax.set_yticklabels([k for k, _ in items], fontsize=7)
        if base is not None:
            ax.axvline(base, color="black", lw=1, label="ours (defaults)")
        ax.axvline(r["paper"], color="#d62728", lw=1, ls="--", label="paper")
        ax.set_title(f"({r['claim']}) {r['statement'][:48]}...", fontsize=8)
        ax.legend(fontsize=7, loc="lower right")
        ax.grid(alpha=0.3, axis="x")
    fig.suptitle("Claims against one-at-a-time changes of the assumptions (Llama-3-70B, reduced setting)", fontsize=10)
    return save(fig, path)


def reduced_setting(lengths: dict | None = None) -> ClaimSetting:
    """The setting of the sensitivity runs: Llama-3-70B at two lengths, two chunk counts."""
    return ClaimSetting(models=("llama3-70b",), lengths=lengths or {"llama3-70b": (65536, 262144)},
                        chunk_counts=(4, 16), chains=16, steps=30, requests=32)


__all__ = ["CLAIMS", "ASSUMPTIONS", "ClaimSetting", "Variant", "variants", "claim_values", "ledger", "verdict",
           "with_sensitivity", "run_sensitivity", "format_ledger", "plot_sensitivity", "reduced_setting",
           "comparison_rows", "max_seq_rows"]
