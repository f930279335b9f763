"""``mocap-jax wsc-llm ...``: WSC-LLM serving on a wafer-scale chip.

Sub-commands:

* ``wsc-llm hardware`` -- the hardware presets (wafers and the GPU cluster);
* ``wsc-llm partition`` -- instance shapes, TP strategies and prefill/decode counts;
* ``wsc-llm place`` -- decode-centred placement, TransferCost, alpha sensitivity, figure;
* ``wsc-llm memory`` -- greedy KV placement vs local-only vs an LP optimum, DRAM use per die;
* ``wsc-llm trace`` -- statistics of a workload (synthetic preset or Azure-format trace file);
* ``wsc-llm serve`` -- batched serving simulation of one design point (``--check-reference``
  compares it with the event-driven reference);
* ``wsc-llm explore`` -- hardware design-space exploration (CSV under ``--out``, figure);
* ``wsc-llm robustness`` -- does the best design stay best when the performance model errs;
* ``wsc-llm baselines`` -- Splitwise vs WSC-LLM scheduling on the A100 cluster and the wafer,
  and the ablations (CSV, latency-CDF and ablation figures).

Benchmarks: ``bench wsc-partition`` (partition runtime), ``bench wsc-serving`` (array program vs
reference) and ``bench wsc-explore`` (the whole exploration).  Every command prints plain aligned
tables, or JSON with ``--json``; bad input is one line on stderr and exit code 2
(:mod:`mocap_jax.cli`).
"""

from __future__ import annotations

from .wsc_explore import register_explore
from .wsc_offline import register_offline
from .wsc_serving import register_serving


def register(subparsers, bench_subparsers) -> None:
    """Add ``wsc-llm`` and the WSC-LLM benchmarks to the ``mocap-jax`` parser."""
    top = subparsers.add_parser("wsc-llm", help="WSC-LLM serving on a wafer: partition, placement, KV memory, serving",
                                description="WSC-LLM: resource partition, placement, the KV memory scheduler, the "
                                            "serving simulation and the hardware design space of prefill/decode "
                                            "serving on a wafer-scale chip.")
    sub = top.add_subparsers(dest="wsc_command", metavar="SUBCOMMAND", required=True)
    register_offline(sub, bench_subparsers)
    register_serving(sub, bench_subparsers)
    register_explore(sub, bench_subparsers)


__all__ = ["register"]
