"""``mocap-jax calibrate``: fit the roofline cost model to measured chunked prefill.

Registered by :mod:`mocap_jax.cli` through :func:`register`.
"""

from __future__ import annotations

import json
import sys

from .common import check_figure_file, check_output_file, seed

DEFAULT_JSON = "results/calibration.json"
DEFAULT_FIGURE = "figures/calibration.png"


def register(subparsers, bench_subparsers=None) -> None:
    """Add the ``calibrate`` sub-command (``bench_subparsers`` is accepted for the common signature; unused)."""
    from ..validation.calibration import SIZES

    p = subparsers.add_parser(
        "calibrate",
        help="measure chunked prefill of a small transformer on this device and fit the cost model to it",
        description=(
            "Run chunked prefill of a small Llama-style transformer (random weights, GQA attention over a KV "
            "cache, SwiGLU MLP) with JAX on the local device for a grid of (chunk size, prefix length, batch), "
            "fit the efficiencies and per-layer overhead of the roofline cost model on a seeded random 60% "
            "of the cells, and report its MAPE on the other 40% next to a linear least-squares baseline. On a "
            "CPU the timings come from a separate single-threaded process, by its CPU clock (latency on one "
            "dedicated core, robust to other load on the machine)."),
    )
    p.add_argument("--size", choices=sorted(SIZES), default="cpu",
                   help="small: the test grid (under a minute on 2 CPU cores); cpu: a fuller CPU grid (a few "
                        "minutes; default); gpu: Llama-8B-sized blocks in bf16, c up to 4096, p up to 32K "
                        "(needs a GPU)")
    p.add_argument("--seed", type=seed, default=0, help="seed of weights, caches, timing order and split (default 0)")
    p.add_argument("--test-fraction", type=float, default=None, metavar="F",
                   help="share of grid cells held out for scoring (default 0.4)")
    p.add_argument("--out", default=DEFAULT_JSON, metavar="PATH",
                   help=f"JSON report path (default {DEFAULT_JSON}; '-' or '' to skip)")
    p.add_argument("--figure", default=DEFAULT_FIGURE, metavar="PATH",
                   help=f"predicted-vs-measured figure (default {DEFAULT_FIGURE}; '-' or '' to skip)")
    p.add_argument("--json", action="store_true", help="print the full report as JSON on stdout (progress goes "
                                                        "to stderr)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=run_calibrate_command)


def _path_or_none(value):
    return None if value in (None, "", "-") else value


def run_calibrate_command(args) -> int:
    from ..validation.calibration import run_calibration

    if _path_or_none(args.out):
        check_output_file(args.out)
    if _path_or_none(args.figure):
        check_figure_file(args.figure)
    if args.test_fraction is not None and not 0 < args.test_fraction < 1:
        raise ValueError(f"--test-fraction must be in (0, 1), got {args.test_fraction}")

    def log(msg):
        print(f"[calibrate] {msg}", file=sys.stderr, flush=True)
    report = run_calibration(size=args.size, seed=args.seed, json_path=_path_or_none(args.out),
                             figure_path=_path_or_none(args.figure), test_fraction=args.test_fraction,
                             log=None if args.quiet else log)
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_summary(report))
    return 0


def format_summary(report: dict) -> str:
    """A readable multi-line summary of a calibration report."""
    f = report["fitted"]
    ident = report.get("identified", {})
    pts = report["points"]
    meas = report.get("measurement", {})
    grid = report["grid"]
    m = report["model"]

    def mark(name):
        return "" if ident.get(name, True) else "  (not identified: its roofline branch binds on no training cell)"

    lines = [
        f"calibration of the cost model: size {report['size']}, device {report['device']} "
        f"({report.get('device_info', {}).get('execution', '')}), {report['dtype']}",
        f"  model: {m['layers']} layers, hidden {m['hidden']}, FFN {m['ffn']}, GQA {m['q_heads']}/{m['kv_heads']} "
        f"heads x {m['head_dim']}",
        f"  nominal: peak {report['hardware_nominal']['peak_flops'] / 1e9:.1f} GFLOP/s, bandwidth "
        f"{report['hardware_nominal']['hbm_bandwidth'] / 1e9:.1f} GB/s ({report.get('nominal_source', '')})",
        f"  grid: c {grid['chunk_sizes']} x p {grid['prefix_lengths']} x B {grid['batch_sizes']} = {grid['cells']} "
        f"cells; {meas.get('rounds', '?')} rounds, clock: {meas.get('clock', '?')}, median spread "
        f"{100 * meas.get('median_spread_iqr_rel', float('nan')):.1f}%",
        f"  points: {pts['train']} train / {pts['test']} held out ({pts.get('split', '')})",
        "  fitted:",
        f"    eff_gemm         {f['eff_gemm']:.4f}{mark('eff_gemm')}",
        f"    eff_attention    {f['eff_attention']:.4f}{mark('eff_attention')}",
        f"    eff_hbm          {f['eff_hbm']:.4f}{mark('eff_hbm')}",
        f"    layer_overhead_s {f['layer_overhead_s']:.3e}",
        f"  held-out MAPE: cost model {report['calibration_mape']:.2f}% (max {report['max_abs_test_error_pct']:.1f}%, "
        f"train {report['train_mape']:.2f}%)",
        f"                 linear baseline a + b(Bc) + d(Bp) + e(Bcp) {report['baseline_linear_mape']:.2f}%; "
        f"plain (c, p, cp) ignoring B {report['baseline_linear_unscaled_mape']:.2f}%",
        f"  wall time: {report['wall_s']:.1f} s (compile {meas.get('compile_s', float('nan')):.1f} s, timing "
        f"{meas.get('measure_s', float('nan')):.1f} s)",
    ]
    if report.get("json_path"):
        lines.append(f"  report: {report['json_path']}")
    if report.get("figure_path"):
        lines.append(f"  figure: {report['figure_path']}")
    return "\n".join(lines)
