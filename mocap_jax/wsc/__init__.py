"""WSC-LLM (DESIGN §10): prefill/decode serving co-exploration on a wafer-scale chip.

Modules:

* :mod:`~mocap_jax.wsc.hardware` -- the hardware template (:class:`WaferSpec`, presets,
  the A100 cluster baseline) and its traced form (:class:`WaferParams`, :func:`design_points`).
* :mod:`~mocap_jax.wsc.workload` -- request rate + representative length points (Azure traces).
* :mod:`~mocap_jax.wsc.perf` -- instance performance models: TP plans, prefill and decode
  iteration times, collectives, remote KV reads, memory per die.
* :mod:`~mocap_jax.wsc.partition` -- goodput per die and the resource partition.
* :mod:`~mocap_jax.wsc.placement` -- layouts, TransferCost, decode-centred / random /
  annealed / exhaustive placement, the wafer figure.
* :mod:`~mocap_jax.wsc.memory` -- the KV memory scheduler (greedy, local-only, LP optimum).
* :mod:`~mocap_jax.wsc.serving` -- the batched serving simulation (``jit(vmap(lax.scan))`` over
  design points): set-up from the central scheduler's decisions, metrics.
* :mod:`~mocap_jax.wsc.serving_reference` -- the event-driven reference of the same contract.
* :mod:`~mocap_jax.wsc.explore` -- hardware design-space exploration.
* :mod:`~mocap_jax.wsc.baselines` -- Splitwise vs WSC-LLM on the A100 cluster and the wafer, ablations.
* :mod:`~mocap_jax.wsc.figures` -- run / plot functions of the part-2 figures.
* :mod:`mocap_jax.cli.wsc` -- ``mocap-jax wsc-llm ...``.

The submodules keep their names (``mocap_jax.wsc.partition.partition(...)``,
``mocap_jax.wsc.memory``, ...); only classes and array functions are re-exported here.
"""

from .hardware import WAFER_PRESETS, WaferParams, WaferSpec, a100_cluster, design_points, get_wafer, wsc_wafer
from .partition import PartitionResult, ServingTargets, instance_goodput
from .perf import (STRATEGIES, InstanceConfig, RemoteKV, TPPlan, decode_iteration_time, decode_time,
                   prefill_iteration_time, prefill_time, tp_plan)
from .placement import (Instance, Layout, anneal_placement, decode_centred_placement, exhaustive_placement,
                        random_placement, transfer_cost)
from .workload import (LENGTH_FITS, WORKLOAD_PRESETS, LengthFit, Trace, WorkloadParams, WorkloadSpec, get_trace,
                       get_workload, load_azure_trace, synthetic_trace)
from .serving import ServingConfig, ServingResult, ServingSetup, ServingShape, build_setup, simulate
from .serving_reference import simulate_reference

__all__ = [
    "WAFER_PRESETS", "WaferParams", "WaferSpec", "a100_cluster", "design_points", "get_wafer", "wsc_wafer",
    "PartitionResult", "ServingTargets", "instance_goodput", "STRATEGIES", "InstanceConfig", "RemoteKV",
    "TPPlan", "decode_iteration_time", "decode_time", "prefill_iteration_time", "prefill_time", "tp_plan",
    "Instance", "Layout", "anneal_placement", "decode_centred_placement", "exhaustive_placement", "random_placement",
    "transfer_cost", "WORKLOAD_PRESETS", "WorkloadParams", "WorkloadSpec", "get_workload",
    "LENGTH_FITS", "LengthFit", "Trace", "get_trace", "load_azure_trace", "synthetic_trace",
    "ServingConfig", "ServingResult", "ServingSetup", "ServingShape", "build_setup", "simulate", "simulate_reference",
]
