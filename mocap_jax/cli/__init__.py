"""Command-line interface: ``mocap-jax <command> ...`` (also ``python -m mocap_jax``).

Each feature module contributes its sub-commands through a ``register(subparsers)``
function; this file only wires them up and turns bad input into one clear message
and exit code 2 (no traceback).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# Modules that contribute sub-commands, in the order they appear in --help.
COMMAND_MODULES = (
    "mocap_jax.cli.core",          # simulate, max-seq, max-batch, models, hardware, bench pipeline
    "mocap_jax.cli.placement",     # placement
    "mocap_jax.cli.partition",     # compare, partition, bench anneal
    "mocap_jax.cli.validate",      # validate, bench reference
    "mocap_jax.cli.calibrate",     # calibrate
    "mocap_jax.cli.sweep",         # sweep, bench sweep
    "mocap_jax.cli.study",         # reproduce
    "mocap_jax.cli.wsc",           # wsc-llm ..., bench wsc-serving
)


class UsageError(ValueError):
    """Bad command-line input (reported as one line, exit code 2)."""


def _bench_parser(sub):
    """The shared ``bench`` command; benchmark modules add their targets to it."""
    bench = sub.add_parser("bench", help="benchmarks (commands, not tests): pipeline, anneal, reference, sweep")
    return bench.add_subparsers(dest="bench_target", metavar="TARGET", required=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mocap-jax",
        description="Vectorised simulator of prefill-only LLM inference (MOCAP) and serving (WSC-LLM) on wafer-scale chips.",
    )
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"mocap-jax {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    bench_sub = _bench_parser(sub)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub, bench_sub)
    return parser


def _use_all_cpu_cores() -> None:
    """Expose every CPU core as a JAX device so sweeps shard across them.

    Only affects the CPU backend, only if the user has not chosen a count, and only
    before JAX initialises its backends (nothing is computed at import time).
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        n = max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()


def main(argv=None) -> int:
    _use_all_cpu_cores()
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = args.func(args)
    except ValueError as e:  # SpecError, UsageError and API validation errors
        print(f"mocap-jax {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
