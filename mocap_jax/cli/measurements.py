"""Text reports of ``mocap-jax validate --profiles`` and ``--published``."""

from __future__ import annotations

import math
from typing import Any


def _pct(v) -> str:
    return "   n/a" if v is None or not math.isfinite(v) else f"{v:5.1f}%"


def _operator_table(by_operator: list[dict]) -> list[str]:
    lines = [f"    {'operator':26s} {'TP':>3s} {'rows':>6s} {'MAPE':>7s} {'>=512 tok':>10s}"]
    for r in by_operator:
        lines.append(f"    {r['operator']:26s} {r['tp']:3d} {r['rows']:6d} {_pct(r['mape']):>7s} {_pct(r['mape_512']):>10s}")
    return lines


def format_profiles(rep: dict[str, Any]) -> str:
    """Case (a), case (b), the fits and the collectives of a :func:`profiles_report`."""
    lines = [f"operator profiles: {rep['profiles']}  (MAPE against the measured medians)"]
    for g, f in rep["fits"].items():
        lines.append(f"  fit {g:7s} eff_gemm {f['eff_gemm']:.3f}  gemm_fixed_s {f['gemm_fixed_s'] * 1e6:6.2f} us  "
                     f"eff_hbm {f['eff_hbm']:.3f}")
    for g, c in rep["cross_gpu"].items():
        lines.append(f"(a) {g}, efficiencies fitted on {c['source']}: GEMMs {_pct(c['gemm_mape'])} all tokens, "
                     f"{_pct(c['gemm_mape_512'])} at >= 512 tokens ({c['gemm_rows_512']} rows); element-wise "
                     f"operators {_pct(c['other_mape'])}")
        lines.extend(_operator_table(c["by_operator"]))
    for g, c in rep["datasheet"].items():
        lines.append(f"(b) {g}, datasheet only: GEMMs {_pct(c['gemm_mape'])} all tokens, "
                     f"{_pct(c['gemm_mape_512'])} at >= 512 tokens; element-wise {_pct(c['other_mape'])}")
        lines.extend(_operator_table([r for r in c["by_operator"] if r["operator"].endswith("proj")]))
    col = rep["collectives"]
    lines.append("collectives: ring all-reduce / send-recv against the link model "
                 "(datasheet; cross = eff_link and latency fitted on the other GPU's *_dgx rows)")
    for g, f in col["fits"].items():
        lines.append(f"  fit {g:7s} eff_link {f['eff_link']:.3f}  latency {f['link_latency_s'] * 1e6:5.2f} us per step")
    lines.append(f"    {'folder':24s} {'collective':10s} {'ranks':>5s} {'link':>8s} {'MAPE':>7s} {'>=1MB':>7s} "
                 f"{'cross':>7s} {'>=1MB':>7s}")
    for r in col["rows"]:
        lines.append(f"    {r['folder']:24s} {r['collective']:10s} {r['workers']:5d} {r['link']:>8s} {_pct(r['mape']):>7s} "
                     f"{_pct(r['mape_large']):>7s} {_pct(r.get('cross_mape')):>7s} {_pct(r.get('cross_mape_large')):>7s}")
    t = rep["target"]
    lines.append(f"target: GEMM MAPE <= {t['gemm_mape_512_max']:.0f}% at >= 512 tokens in case (a): worst "
                 f"{_pct(t['worst']).strip()} -> {'MET' if t['met'] else 'MISSED'}")
    return "\n".join(lines)


def format_published(rep: dict[str, Any]) -> str:
    """One line per published measurement: what ran, measured, predicted, error."""
    lines = [f"published prefill measurements: {rep['table']} ({len(rep['rows'])} rows, {len(rep['sources'])} sources)",
             f"  {'id':38s} {'hardware':15s} {'TPxPP':>6s} {'chunks':>6s} {'metric':>8s} {'measured':>10s} "
             f"{'predicted':>10s} {'error':>8s}"]
    for r in rep["rows"]:
        mark = "  MISS" if r["miss"] else ""
        lines.append(f"  {r['id']:38s} {r['hardware']:15s} {r['tp']:>2d}x{r['pp']:<3d} {r['chunks']:6d} "
                     f"{'TTFT s' if r['metric'] == 'ttft_s' else 'tok/s':>8s} {r['measured']:10.4g} "
                     f"{r['predicted']:10.4g} {100 * r['error']:+7.1f}%{mark}")
    lines.append(f"  MAPE {rep['mape']:.1f}% over all rows; {len(rep['misses'])} miss(es) beyond "
                 f"{100 * rep['miss_threshold']:.0f}%: {', '.join(rep['misses']) or 'none'}")
    return "\n".join(lines)
