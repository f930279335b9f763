"""Command-line interface: ``mocap-jax <command> ...`` (also ``python -m mocap_jax``).

Each feature module contributes its sub-commands through a ``register(subparsers)``
function; this file only wires them up and turns bad input into one clear message
and exit code 2 (no traceback).
"""

from __future__ import annotations

import importlib
import os
import sys

from ..api.process import collect_garbage_less_often
from ..prefill.batch import DishonestResult
from .common import Parser

# Modules that contribute sub-commands, in the order they appear in --help.
COMMAND_MODULES = (
    "mocap_jax.cli.core",          # simulate, max-seq, max-batch, models, hardware
    "mocap_jax.cli.bench",         # bench pipeline, bench anneal
    "mocap_jax.cli.placement",     # placement
    "mocap_jax.cli.partition",     # compare, partition
    "mocap_jax.cli.validate",      # validate, bench reference
    "mocap_jax.cli.calibrate",     # calibrate
    "mocap_jax.cli.sweep",         # sweep, bench sweep
    "mocap_jax.cli.study",         # reproduce, claims
    "mocap_jax.cli.wsc",           # wsc-llm ..., bench wsc-serving
)


def _bench_parser(sub):
    """The shared ``bench`` command; benchmark modules add their targets to it."""
    bench = sub.add_parser("bench", help="benchmarks (commands, not tests): pipeline, anneal, reference, peer, sweep, "
                                         "wsc-partition, wsc-serving, wsc-explore")
    return bench.add_subparsers(dest="bench_target", metavar="TARGET", required=True, parser_class=Parser)


def build_parser() -> Parser:
    parser = Parser(
        prog="mocap-jax",
        description="Vectorised simulator of prefill-only LLM inference (MOCAP) and serving (WSC-LLM) on wafer-scale chips.",
    )
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"mocap-jax {__version__}")
    parser.add_argument("--compile-cache", metavar="DIR", default=None,
                        help="keep compiled programs in DIR between runs ('off' disables; default "
                             "$MOCAP_JAX_CACHE_DIR or ~/.cache/mocap_jax/xla; benchmarks run without "
                             "it unless given, so their compile times are cold)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=Parser)
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


def _use_compile_cache(args) -> None:
    """The persistent compilation cache (``mocap_jax.api.compile_cache``), set before anything is
    compiled: on for every command, except benchmarks unless ``--compile-cache`` names a folder.
    Where it is on, XLA's false alarms about the programs it loads are dropped from stderr
    (:mod:`mocap_jax.cli.stderr_filter`)."""
    from ..api.compile_cache import cache_dir_of, disable_compilation_cache, enable_compilation_cache
    from .stderr_filter import install

    choice = args.compile_cache
    if choice is not None:
        folder = enable_compilation_cache(choice)
        if folder is None and cache_dir_of(choice) is not None:
            raise ValueError(f"--compile-cache {choice}: cannot create that folder; name a writable one or 'off'")
    elif args.command == "bench":
        folder = None
        disable_compilation_cache()
    else:
        folder = enable_compilation_cache()
    if folder is not None:
        install()


def _use_dtype(args) -> None:
    """``--dtype float64`` turns on 64-bit JAX for this process, before anything is traced (the library
    leaves that switch to its caller; a command that offers float64 is that caller)."""
    if getattr(args, "dtype", None) == "float64":
        import jax

        jax.config.update("jax_enable_x64", True)


def _fail(args, message: str) -> int:
    """One line on stderr, exit code 2."""
    command = " ".join(x for x in (getattr(args, "command", None), getattr(args, "wsc_command", None),
                                   getattr(args, "bench_target", None)) if x)
    print(f"mocap-jax {command}: error: {' '.join(message.split())}", file=sys.stderr)
    return 2


def main(argv=None) -> int:
    _use_all_cpu_cores()
    collect_garbage_less_often()
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        _use_compile_cache(args)
        _use_dtype(args)
        code = args.func(args)
    except BrokenPipeError:                   # the reader (e.g. head) closed the pipe: nothing more to say
        return 0
    except (ValueError, OverflowError) as e:  # SpecError and every validation error: bad input
        return _fail(args, str(e))
    except OSError as e:                      # a path that could not be read or written
        return _fail(args, f"{e.strerror or e} ({e.filename})" if getattr(e, "filename", None) else str(e))
    except DishonestResult as e:              # a broken invariant: a bug, reported, never printed as a result
        print(f"mocap-jax: internal error (please report): {e}", file=sys.stderr)
        return 1
    except MemoryError:
        return _fail(args, "the problem does not fit in memory; use fewer points, a smaller mesh or smaller blocks")
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
