"""Shared pieces of the ``mocap-jax wsc-llm`` commands: table and JSON output, argument groups, parsing.

Every helper raises :class:`~mocap_jax.specs.SpecError` (a ``ValueError``) on bad input, which
:mod:`mocap_jax.cli` reports as one line with exit code 2.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from typing import Any, Sequence

import numpy as np

from ..specs import SpecError, checks, get_model
from ..wsc import partition as part
from ..wsc.goodput import ServingTargets
from ..wsc.hardware import WAFER_PRESETS, WaferSpec, get_wafer
from ..wsc.plan import STRATEGIES
from ..wsc.setup import CONTENTION, ServingConfig
from ..wsc.traces import get_workload
from ..wsc.workload import WORKLOAD_PRESETS, WORKLOAD_TTFT_SLOS
from .common import seed


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        v = float(v)
        if math.isnan(v):
            return "-"
        if math.isinf(v):
            return "inf"
        if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
            return f"{v:.3g}"
        return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Plain aligned table: text left-aligned, numbers right-aligned."""
    cells = [[_fmt(v) for v in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    isnum = lambda v: isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
    numeric = [any(isnum(r[i]) for r in rows) and all(isnum(r[i]) or r[i] in ("", "-") for r in rows)
               for i in range(len(headers))]
    just = lambda s, i: s.rjust(widths[i]) if numeric[i] else s.ljust(widths[i])
    lines = ["  ".join(just(h, i) for i, h in enumerate(headers)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(just(c, i) for i, c in enumerate(r)).rstrip() for r in cells]
    return "\n".join(lines)


def _json_default(o):
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (np.floating, np.integer, np.bool_)):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def _clean(o):
    """Replace non-finite floats by None so the JSON is standard."""
    if isinstance(o, dict):
        return {k: _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    if isinstance(o, np.ndarray):
        return _clean(o.tolist())
    if isinstance(o, (float, np.floating)) and not math.isfinite(float(o)):
        return None
    return o


def emit_json(obj) -> None:
    print(json.dumps(_clean(obj), indent=2, default=_json_default))


def design_point_args(p: argparse.ArgumentParser):
    """The model, hardware (with overrides) and workload arguments; returns their group."""
    g = p.add_argument_group("model, hardware and workload")
    g.add_argument("--model", default="llama2-7b", help="model preset or .json/.toml spec (default llama2-7b)")
    g.add_argument("--hardware", default="wsc-llm-64g",
                   help=f"WSC-LLM hardware: {', '.join(WAFER_PRESETS)}, wsc-RxC or a100-cluster-NxG (default wsc-llm-64g)")
    g.add_argument("--rows", type=int, help="override the die grid rows (nodes on a cluster)")
    g.add_argument("--cols", type=int, help="override the die grid columns (GPUs per node on a cluster)")
    g.add_argument("--dram-gb", type=float, help="override DRAM capacity per die, GB")
    g.add_argument("--dram-tbps", type=float, help="override DRAM bandwidth per die, TB/s")
    g.add_argument("--d2d-tbps", type=float, help="override D2D (NVLink on a cluster) bandwidth per link, TB/s")
    g.add_argument("--workload", default="azure-conv",
                   help=f"workload preset ({', '.join(WORKLOAD_PRESETS)}) or an Azure-format trace .csv")
    return g


def common_args(p: argparse.ArgumentParser) -> None:
    g = design_point_args(p)
    g.add_argument("--rate", type=float, help="offered load, requests/s (default: the workload's)")
    s = p.add_argument_group("serving targets")
    s.add_argument("--strategies", default=",".join(STRATEGIES),
                   help=f"comma-separated TP strategies (default {','.join(STRATEGIES)})")
    s.add_argument("--chunk", type=int, default=2048, help="prefill token budget per iteration (default 2048)")
    s.add_argument("--tpot-slo-ms", type=float, default=100.0, help="time-per-output-token SLO, ms (default 100)")
    s.add_argument("--ttft-slo-s", type=float, default=10.0, help="time-to-first-token SLO, s (default 10)")
    s.add_argument("--max-batch", type=int, default=512, help="largest decode batch considered (default 512)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")


def instance_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("instances (default: from the partition)")
    g.add_argument("--prefill", metavar="HxW:N[:STRATEGY]", help="prefill instance shape and count, e.g. 1x1:30")
    g.add_argument("--decode", metavar="HxW:N[:STRATEGY]", help="decode instance shape and count, e.g. 1x2:12")


def wafer_from_args(args) -> WaferSpec:
    wafer = get_wafer(args.hardware)
    changes = {}
    for flag, field, scale in (("rows", "rows", None), ("cols", "cols", None), ("dram_gb", "dram_capacity", 1e9),
                               ("dram_tbps", "dram_bandwidth", 1e12), ("d2d_tbps", "link_bandwidth", 1e12)):
        v = getattr(args, flag, None)
        if v is None:
            continue
        if scale is None:
            if v < 1:
                raise SpecError(f"--{flag.replace('_', '-')} must be a positive integer, got {v}")
            changes[field] = int(v)
        else:
            if not v > 0 or not math.isfinite(v):
                raise SpecError(f"--{flag.replace('_', '-')} must be a positive number, got {v}")
            changes[field] = v * scale
    if changes:
        label = ",".join(f"{k}={v:g}" for k, v in changes.items())
        wafer = wafer.replace(name=f"{wafer.name}[{label}]", **changes)
    return wafer


def check_slos(tpot_slo_ms, ttft_slo_s) -> None:
    """The SLO flags: positive, finite numbers (milliseconds per output token, seconds to first token)."""
    checks.positive("--tpot-slo-ms", tpot_slo_ms, hint=" Give the SLO in milliseconds.")
    checks.positive("--ttft-slo-s", ttft_slo_s, hint=" Give the SLO in seconds.")


def offline_strategies(args):
    if args.chunk < 1:
        raise SpecError(f"--chunk must be a positive number of tokens, got {args.chunk}")
    if args.max_batch < 1:
        raise SpecError(f"--max-batch must be a positive integer, got {args.max_batch}")
    check_slos(args.tpot_slo_ms, args.ttft_slo_s)
    if args.rate is not None:
        checks.load("--rate", args.rate)
    strategies = part.validate_strategies([s.strip() for s in args.strategies.split(",") if s.strip()])
    return strategies


_INST = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*:\s*(\d+)\s*(?::\s*([\w-]+)\s*)?$")


def parse_instance(text: str, flag: str):
    """``HxW:N[:strategy]`` -> ((h, w), n, strategy or None)."""
    m = _INST.match(text or "")
    if not m:
        raise SpecError(f"{flag} expects HxW:N[:STRATEGY] (e.g. 2x2:4 or 2x4:3:gqa-hybrid), got {text!r}")
    h, w, n, s = int(m.group(1)), int(m.group(2)), int(m.group(3)), m.group(4)
    if min(h, w, n) < 1:
        raise SpecError(f"{flag}: shape and count must be >= 1, got {text!r}")
    if s is not None and s not in STRATEGIES:
        raise SpecError(f"{flag}: unknown TP strategy {s!r}; choose from {', '.join(STRATEGIES)}")
    return (h, w), n, s


def check_fits(wafer: WaferSpec, shape, flag):
    h, w = shape
    if not ((h <= wafer.rows and w <= wafer.cols) or (wafer.is_mesh and w <= wafer.rows and h <= wafer.cols)):
        raise SpecError(f"{flag} instance {h}x{w} is larger than the {wafer.rows}x{wafer.cols} grid of {wafer.name}; "
                        f"choose a shape with rows <= {wafer.rows} and cols <= {wafer.cols}")


def resolve_instances(args, model, wafer, workload, strategies):
    """Prefill/decode candidates and counts: from --prefill/--decode, or from the partition.

    Returns:
      (prefill Candidate, n_prefill, decode Candidate, n_decode, PartitionResult or None).
    """
    targets = ServingTargets.make(args.chunk, args.tpot_slo_ms / 1e3, args.ttft_slo_s)
    parsed = {flag: parse_instance(text, flag) for flag, text in (("--prefill", args.prefill),
                                                                   ("--decode", args.decode)) if text is not None}
    if (args.prefill is None) != (args.decode is None):
        raise SpecError("give both --prefill and --decode, or neither (then the partition chooses)")
    if args.prefill is None:
        res = part.partition(model, wafer, workload, strategies=strategies, chunk_tokens=args.chunk,
                             tpot_slo_s=args.tpot_slo_ms / 1e3, ttft_slo_s=args.ttft_slo_s, max_batch=args.max_batch)
        return res.prefill, res.n_prefill, res.decode, res.n_decode, res
    out = []
    for flag in ("--prefill", "--decode"):
        shape, n, s = parsed[flag]
        check_fits(wafer, shape, flag)
        cand = part.evaluate_candidates(model, wafer, workload, targets, [s or strategies[0]], args.max_batch,
                                        shapes=[shape])[0]
        out.append((cand, n))
    (pc, n_p), (dc, n_d) = out
    if not pc.prefill_fits:
        raise SpecError(f"--prefill {args.prefill}: the model's weights and a longest prompt's KV do not fit a "
                        f"{pc.config.rows}x{pc.config.cols} instance of {wafer.name}; use a larger instance")
    if not dc.decode_fits:
        raise SpecError(f"--decode {args.decode}: the model's weights and one request's KV do not fit a "
                        f"{dc.config.rows}x{dc.config.cols} instance of {wafer.name}; use a larger instance")
    used = n_p * pc.config.dies + n_d * dc.config.dies
    if used > wafer.num_dies:
        raise SpecError(f"--prefill/--decode need {used} dies but {wafer.name} has {wafer.num_dies}")
    return pc, n_p, dc, n_d, None


def offline_setup(args):
    strategies = offline_strategies(args)
    model = get_model(args.model)
    wafer = wafer_from_args(args)
    workload = get_workload(args.workload, args.rate)
    return model, wafer, workload, strategies


def hardware_line(wafer: WaferSpec) -> str:
    if wafer.is_mesh:
        return (f"{wafer.rows}x{wafer.cols} dies, {wafer.peak_flops / 1e12:.0f} TFLOP/s, "
                f"{wafer.dram_capacity / 1e9:g} GB / {wafer.dram_bandwidth / 1e12:g} TB/s DRAM, "
                f"{wafer.link_bandwidth / 1e12:g} TB/s D2D")
    return (f"{wafer.rows} nodes x {wafer.cols} GPUs, {wafer.peak_flops / 1e12:.0f} TFLOP/s, "
            f"{wafer.dram_capacity / 1e9:g} GB / {wafer.dram_bandwidth / 1e12:g} TB/s, NVLink "
            f"{wafer.link_bandwidth / 1e9:g} GB/s, network {wafer.node_bandwidth / 1e9:g} GB/s per GPU")


def floats(text: str, flag: str, positive: bool = True) -> list[float]:
    try:
        vals = [float(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise SpecError(f"{flag} expects comma-separated numbers, got {text!r}") from None
    if not vals:
        raise SpecError(f"{flag} needs at least one value")
    for v in vals:
        if not math.isfinite(v) or (positive and v <= 0):
            raise SpecError(f"{flag} values must be positive numbers, got {v:g}")
    return vals


def names(text: str, flag: str) -> list[str]:
    vals = [x.strip() for x in str(text).split(",") if x.strip()]
    if not vals:
        raise SpecError(f"{flag} needs at least one name")
    return vals


def serving_args(p: argparse.ArgumentParser, requests: int | None = 400) -> None:
    g = p.add_argument_group("serving")
    g.add_argument("--chunk", type=int, default=2048, help="prefill token budget per iteration (default 2048)")
    g.add_argument("--tpot-slo-ms", type=float, default=100.0, help="time-per-output-token SLO, ms (default 100)")
    g.add_argument("--ttft-slo-s", type=float,
                   help="time-to-first-token SLO, s (default 2; the long-context workload 60)")
    g.add_argument("--max-batch", type=int, default=256, help="largest decode batch (default 256)")
    g.add_argument("--window", type=int, default=16, help="most requests per prefill iteration (default 16)")
    g.add_argument("--strategies", default=",".join(STRATEGIES),
                   help=f"TP strategies of the partition (default {','.join(STRATEGIES)})")
    if requests is not None:
        g.add_argument("--requests", type=int, default=requests, help=f"requests per simulated point (default {requests})")
    g.add_argument("--seed", type=seed, default=0, help="trace seed (default 0)")
    g.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                   help="precision of the array program (default float32)")
    g.add_argument("--contention", default="max-min",
                   help=f"how concurrent traffic shares links and DRAM: {', '.join(CONTENTION)} (default max-min)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")


def serving_config(args, workload: str | None = None):
    """:class:`~mocap_jax.wsc.setup.ServingConfig` of the serving arguments (``workload``: whose TTFT SLO applies
    when ``--ttft-slo-s`` is not given)."""
    if args.chunk < 1 or args.max_batch < 1 or args.window < 1:
        raise SpecError("--chunk, --max-batch and --window must be positive integers")
    ttft = args.ttft_slo_s if args.ttft_slo_s is not None else WORKLOAD_TTFT_SLOS.get(workload, ServingConfig.ttft_slo_s)
    check_slos(args.tpot_slo_ms, ttft)
    if getattr(args, "requests", None) is not None:
        checks.integer("--requests", args.requests, 2, checks.LIMITS["requests"],
                       " Pass the requests to simulate per point, e.g. 1000.")
    strategies = part.validate_strategies([x.strip() for x in args.strategies.split(",") if x.strip()])
    contention = checks.choice("contention rule", args.contention, CONTENTION)
    return ServingConfig(chunk_tokens=args.chunk, tpot_slo_s=args.tpot_slo_ms / 1e3, ttft_slo_s=ttft,
                         max_batch=args.max_batch, window=args.window, strategies=strategies, seed=args.seed,
                         contention=contention)


def program_dtype(args):
    import jax
    import jax.numpy as jnp

    if args.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
        return jnp.float64
    return jnp.float32


METRIC_COLUMNS = [("ttft_mean_s", "TTFT mean s"), ("ttft_p99_s", "TTFT p99 s"), ("tpot_mean_s", "TPOT mean ms"),
                ("tpot_p99_s", "TPOT p99 ms"), ("e2e_mean_s", "E2E mean s"), ("e2e_p50_s", "E2E p50 s"),
                ("e2e_p99_s", "E2E p99 s"), ("tokens_per_s", "tokens/s"), ("goodput_rps", "goodput req/s"),
                ("slo_attainment", "SLO att."), ("dram_util_mean", "DRAM mean"), ("dram_util_peak", "DRAM peak")]


def metric_cells(m: dict) -> list:
    out = []
    for k, _ in METRIC_COLUMNS:
        v = m.get(k)
        v = float("nan") if v is None else float(v)
        out.append(v * 1e3 if k.startswith("tpot") and math.isfinite(v) else v)
    return out




__all__ = ["table", "emit_json", "design_point_args", "common_args", "instance_args", "wafer_from_args",
           "offline_strategies", "parse_instance", "check_fits", "resolve_instances", "offline_setup", "hardware_line",
           "floats", "names", "serving_args", "serving_config", "program_dtype", "METRIC_COLUMNS", "metric_cells"]
