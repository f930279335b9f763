"""``mocap-jax bench peer``: a published simulator side by side with this one (a benchmark, not a test).

The peer (GenZ, ``genz-llm`` on the package index) is installed into a virtual environment of
its own that this command creates (default ``~/.cache/mocap_jax/peer-genz-llm``); it is never a
runtime or test dependency of the package.  Both simulators get the same configurations --
prefill of public models on GPU nodes over sequence lengths, batches and TP x PP layouts, on the
same datasheet (peak FLOP/s, HBM, NVLink of :mod:`mocap_jax.specs.gpus`) -- and the command
reports, per configuration, both prefill latencies, their ratio and each simulator's wall time,
all measured in one run.

This simulator runs each configuration as GPipe over ``pp`` stage groups of ``tp`` GPUs with
microbatches of ``batch // pp`` requests (GenZ's pipeline rule), so the two model the same
schedule; GenZ's batch latency is ``batch / throughput`` (its ``Latency`` field is one
microbatch's).  GenZ runs twice: with its default system efficiency of 1 (an ideal roofline) and with
the preset's ``eff_gemm`` as its system efficiency.  Wall time: GenZ's ``prefill_moddeling``
call per configuration; ours, one :func:`mocap_jax.simulate` call after a warm-up call of the
same configuration (compilation excluded, reported apart), and ``simulate_batch`` over all
sequence lengths and batches of a layout, per configuration.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import venv as _venv
from pathlib import Path
from typing import Any

import numpy as np

from ..specs import SpecError
from .machine import describe, host

PEER_REQUIREMENT = "genz-llm==0.0.16"
GENZ_MODELS = {"llama2-7b": "llama2_7b", "llama3.1-8b": "llama3_8b", "llama2-70b": "llama2_70b"}
LAYOUTS = {"llama2-7b": ((1, 1), (2, 1), (4, 1), (2, 2)), "llama3.1-8b": ((1, 1), (2, 1), (4, 1), (2, 2)),
           "llama2-70b": ((4, 1), (8, 1), (4, 2), (2, 4))}

# Runs inside the peer's environment: JSON configurations on stdin, JSON results on stdout.
WORKER = r"""
import json, sys, time, warnings
warnings.filterwarnings("ignore")
from GenZ import prefill_moddeling
out = []
for c in json.load(sys.stdin):
    system = {"Flops": c["tflops"], "Memory_size": c["hbm_gb"], "Memory_BW": c["hbm_gbps"], "ICN": c["icn_gbps"],
              "ICN_LL": c["icn_latency_us"], "real_values": True}
    row = {}
    for key, eff in (("genz", 1.0), ("genz_matched", c["eff"])):
        t0 = time.perf_counter()
        try:
            r = prefill_moddeling(model=c["genz_model"], batch_size=c["batch"], input_tokens=c["seq_len"],
                                  system_name=system, system_eff=eff, bits="bf16", tensor_parallel=c["tp"],
                                  pipeline_parallel=c["pp"])
            row[key + "_latency_s"] = c["batch"] / float(r["Throughput"])   # the whole batch (Latency: one microbatch)
        except Exception as e:
            row[key + "_latency_s"] = None
            row[key + "_error"] = f"{type(e).__name__}: {e}"[:200]
        row[key + "_wall_s"] = time.perf_counter() - t0
    out.append(row)
json.dump(out, sys.stdout)
"""


def peer_configs(quick: bool = False) -> list[dict[str, Any]]:
    """The configurations both simulators run (``quick``: a small subset for a smoke run)."""
    seqs, batches, gpus = ((2048, 8192), (1,), ("h100",)) if quick else ((1024, 4096, 16384), (1, 4), ("a100", "h100"))
    out = []
    for model, layouts in LAYOUTS.items():
        for gpu in gpus:
            for tp, pp in (layouts[:2] if quick else layouts):
                for seq in seqs:
                    for batch in batches:
                        out.append(dict(model=model, gpu=gpu, tp=tp, pp=pp, seq_len=seq, batch=batch))
    return out


def default_venv() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mocap_jax" / "peer-genz-llm"


#: written into an environment this benchmark created: only such a folder may be cleared and rebuilt
PEER_MARKER = ".mocap-jax-peer"


def ensure_peer(env_dir: Path) -> Path:
    """The peer's Python, creating its virtual environment and installing it on first use.

    An environment that already imports the peer is used as it is.  Otherwise the folder must be
    new, empty, or one this benchmark created (:data:`PEER_MARKER`, or the default folder): any other
    folder is refused, never cleared, since rebuilding an environment deletes what it holds.
    """
    env_dir = Path(env_dir)
    python = env_dir / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    probe = [str(python), "-c", "import GenZ"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    ours = (env_dir / PEER_MARKER).exists() or env_dir.resolve() == default_venv().resolve()
    if env_dir.exists() and (not env_dir.is_dir() or any(env_dir.iterdir())) and not ours:
        raise SpecError(f"--venv {env_dir}: this folder holds files the peer benchmark did not create, and "
                        f"installing the peer ({PEER_REQUIREMENT}) would rebuild it; give a new or empty folder "
                        f"(default {default_venv()})")
    _venv.EnvBuilder(with_pip=True, clear=ours and python.exists()).create(env_dir)
    (env_dir / PEER_MARKER).write_text("created by mocap-jax bench peer; safe to delete\n")
    pip = subprocess.run([str(python), "-m", "pip", "install", "-q", PEER_REQUIREMENT], capture_output=True, text=True)
    if pip.returncode != 0 or subprocess.run(probe, capture_output=True).returncode != 0:
        raise RuntimeError(f"could not install {PEER_REQUIREMENT} into {env_dir}: {pip.stderr.strip()[-800:]}")
    return python


def _peer_inputs(configs: list[dict]) -> list[dict]:
    from ..specs.gpus import GPUS

    out = []
    for c in configs:
        d = GPUS[c["gpu"]]
        out.append(dict(genz_model=GENZ_MODELS[c["model"]], batch=c["batch"], seq_len=c["seq_len"], tp=c["tp"],
                        pp=c["pp"], tflops=d.bf16_flops / 1e12, hbm_gb=d.hbm_capacity / 1e9,
                        hbm_gbps=d.hbm_bandwidth / 1e9, icn_gbps=d.nvlink_bandwidth / 1e9, icn_latency_us=1.0,
                        eff=d.eff_gemm))
    return out


def run_peer(python: Path, configs: list[dict], timeout_s: float = 3600.0) -> list[dict]:
    """GenZ's latency and wall time for every configuration, in its own environment."""
    proc = subprocess.run([str(python), "-c", WORKER], input=json.dumps(_peer_inputs(configs)), capture_output=True,
                          text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"the peer worker failed: {proc.stderr.strip()[-800:]}")
    return json.loads(proc.stdout)


def run_ours(configs: list[dict]) -> list[dict]:
    """This simulator's latency, per-call wall time (warm) and compile time for every configuration."""
    from .. import api
    from ..specs import gpu_node

    out = []
    for c in configs:
        hw = gpu_node(c["gpu"], c["tp"] * c["pp"])
        kw = dict(batch=c["batch"], microbatch=max(c["batch"] // c["pp"], 1), num_batches=1, stages=c["pp"],
                  tp=c["tp"], timeline=False)
        t0 = time.perf_counter()
        api.simulate(c["model"], hw, c["seq_len"], "gpipe", **kw)
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        r = api.simulate(c["model"], hw, c["seq_len"], "gpipe", **kw)
        wall = time.perf_counter() - t0
        out.append(dict(ours_latency_s=r.prefill_latency_s if r.feasible else None, ours_wall_s=wall,
                        ours_first_call_s=first))
    return out


def run_ours_batched(configs: list[dict]) -> list[float]:
    """Per-configuration wall time of one ``simulate_batch`` call per (model, GPU, layout, batch)."""
    from .. import api
    from ..specs import gpu_node

    walls = [0.0] * len(configs)
    groups: dict[tuple, list[int]] = {}
    for i, c in enumerate(configs):
        groups.setdefault((c["model"], c["gpu"], c["tp"], c["pp"], c["batch"]), []).append(i)
    for (model, gpu, tp, pp, batch), idx in groups.items():
        hw = gpu_node(gpu, tp * pp)
        seqs = np.array([configs[i]["seq_len"] for i in idx])
        kw = dict(batch=batch, microbatch=max(batch // pp, 1), num_batches=1, stages=pp, tp=tp)
        api.simulate_batch(model, hw, seqs, "gpipe", **kw)   # compile
        t0 = time.perf_counter()
        api.simulate_batch(model, hw, seqs, "gpipe", **kw)
        per = (time.perf_counter() - t0) / len(idx)
        for i in idx:
            walls[i] = per
    return walls


def bench_peer(env_dir=None, quick: bool = False) -> dict[str, Any]:
    """Both simulators on :func:`peer_configs`; rows and medians (see the module docstring)."""
    configs = peer_configs(quick)
    machine = host()
    python = ensure_peer(Path(env_dir) if env_dir else default_venv())
    theirs = run_peer(python, configs)
    ours = run_ours(configs)
    batched = run_ours_batched(configs)
    rows = []
    for c, o, t, b in zip(configs, ours, theirs, batched):
        row = dict(c, **o, **t, ours_batched_wall_s=b)
        for key in ("genz", "genz_matched"):
            theirs_s = t.get(f"{key}_latency_s")
            row[f"ratio_{key}"] = o["ours_latency_s"] / theirs_s if theirs_s and o["ours_latency_s"] else None
        row["wall_ratio"] = t["genz_wall_s"] / o["ours_wall_s"]
        row["wall_ratio_batched"] = t["genz_wall_s"] / b
        rows.append(row)
    med = lambda k: float(np.median([r[k] for r in rows if r.get(k) is not None])) if any(
        r.get(k) is not None for r in rows) else None
    return dict(peer=PEER_REQUIREMENT, configs=len(rows), rows=rows, python=sys.version.split()[0],
                median_ratio_genz=med("ratio_genz"), median_ratio_genz_matched=med("ratio_genz_matched"),
                median_wall_ratio=med("wall_ratio"), median_wall_ratio_batched=med("wall_ratio_batched"),
                median_ours_wall_s=med("ours_wall_s"), median_genz_wall_s=med("genz_wall_s"), **machine)


def format_peer(r: dict[str, Any]) -> str:
    fmt = lambda v, f="{:.4f}": "-" if v is None else f.format(v)
    lines = [f"bench peer: {r['configs']} configurations, mocap-jax vs {r['peer']} (prefill latency, one run; "
             f"{describe(r)})",
             f"  {'model':12s} {'gpu':5s} {'TPxPP':>5s} {'seq':>6s} {'B':>2s} {'ours s':>9s} {'genz s':>9s} "
             f"{'ours/genz':>9s} {'genz@eff s':>10s} {'ours/that':>9s} {'wall genz/ours':>14s}"]
    for x in r["rows"]:
        lines.append(f"  {x['model']:12s} {x['gpu']:5s} {x['tp']:>2d}x{x['pp']:<2d} {x['seq_len']:6d} {x['batch']:2d} "
                     f"{fmt(x['ours_latency_s']):>9s} {fmt(x.get('genz_latency_s')):>9s} "
                     f"{fmt(x['ratio_genz'], '{:.3f}'):>9s} {fmt(x.get('genz_matched_latency_s')):>10s} "
                     f"{fmt(x['ratio_genz_matched'], '{:.3f}'):>9s} {fmt(x['wall_ratio'], '{:.1f}x'):>14s}")
    lines.append(f"  median latency ratio ours/genz {fmt(r['median_ratio_genz'], '{:.3f}')} (GenZ efficiency 1), "
                 f"{fmt(r['median_ratio_genz_matched'], '{:.3f}')} (GenZ at the preset's eff_gemm)")
    lines.append(f"  median wall time per configuration: genz {fmt(r['median_genz_wall_s'], '{:.4f}')} s, ours "
                 f"{fmt(r['median_ours_wall_s'], '{:.4f}')} s per simulate call ({fmt(r['median_wall_ratio'], '{:.1f}')}x), "
                 f"{fmt(r['median_wall_ratio_batched'], '{:.1f}')}x with simulate_batch")
    return "\n".join(lines)


def cmd_bench_peer(args) -> int:
    r = bench_peer(args.venv, args.quick)
    print(json.dumps(r, indent=2) if args.json else format_peer(r))
    return 0


def register_bench(bench_subparsers) -> None:
    """Add ``peer`` to ``mocap-jax bench``."""
    b = bench_subparsers.add_parser(
        "peer", help="a published simulator (GenZ) side by side: agreement and wall time per configuration",
        description="Create a virtual environment with genz-llm (first run; needs the package index), run GenZ "
                    "and mocap-jax on the same prefill configurations and report latencies, their ratio and wall "
                    "times per configuration.")
    b.add_argument("--venv", default=None, help=f"the peer's environment (default {default_venv()})")
    b.add_argument("--quick", action="store_true", help="a small subset of configurations")
    b.add_argument("--json", action="store_true", help="print one JSON object")
    b.set_defaults(func=cmd_bench_peer)
