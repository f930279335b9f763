"""WSC-LLM: prefill/decode serving co-exploration on a wafer-scale chip.

Modules, bottom up:

* hardware and workloads -- :mod:`~mocap_jax.wsc.hardware` (:class:`WaferSpec`, presets, the
  A100 cluster, :class:`WaferParams`), :mod:`~mocap_jax.wsc.geometry` (hops, routes, link
  resources), :mod:`~mocap_jax.wsc.workload` (rate + length points),
  :mod:`~mocap_jax.wsc.traces` (Azure traces), :mod:`~mocap_jax.wsc.synthetic` (fitted and
  long-context synthetic traces);
* instance models -- :mod:`~mocap_jax.wsc.plan` (tensor-parallel plans),
  :mod:`~mocap_jax.wsc.perf` (iteration times, collectives, remote KV, memory per die);
* offline decisions -- :mod:`~mocap_jax.wsc.partition` (+ :mod:`~mocap_jax.wsc.goodput`), :mod:`~mocap_jax.wsc.layout`,
  :mod:`~mocap_jax.wsc.placement` (+ :mod:`~mocap_jax.wsc.placement_search`, :mod:`~mocap_jax.wsc.placement_compare`),
  :mod:`~mocap_jax.wsc.memory` (+ :mod:`~mocap_jax.wsc.memory_optimal`,
  :mod:`~mocap_jax.wsc.memory_sim`), :mod:`~mocap_jax.wsc.setup` (a design point's tables);
* serving simulation -- :mod:`~mocap_jax.wsc.serving` (the batched array program, built from
  :mod:`~mocap_jax.wsc.serving_inputs`, :mod:`~mocap_jax.wsc.serving_state`,
  :mod:`~mocap_jax.wsc.serving_step`, :mod:`~mocap_jax.wsc.serving_decode`,
  :mod:`~mocap_jax.wsc.serving_prefill`, :mod:`~mocap_jax.wsc.traffic`),
  :mod:`~mocap_jax.wsc.metrics`, and its event-driven reference :mod:`~mocap_jax.wsc.reference`
  (+ :mod:`~mocap_jax.wsc.reference_flows`);
* studies -- :mod:`~mocap_jax.wsc.explore` and :mod:`~mocap_jax.wsc.ranking` (design space),
  :mod:`~mocap_jax.wsc.robustness`, :mod:`~mocap_jax.wsc.baselines`,
  :mod:`~mocap_jax.wsc.figures` and :mod:`~mocap_jax.wsc.figures_wafer`.

The command line is ``mocap-jax wsc-llm ...`` (:mod:`mocap_jax.cli.wsc`).
"""

from .hardware import WAFER_PRESETS, WaferParams, WaferSpec, a100_cluster, design_points, get_wafer, wsc_wafer
from .layout import Instance, Layout
from .metrics import ServingResult
from .goodput import ServingTargets, instance_goodput
from .partition import PartitionResult
from .perf import RemoteKV, decode_iteration_time, decode_time, prefill_iteration_time, prefill_time
from .placement import anneal_placement, decode_centred_placement, exhaustive_placement, random_placement, transfer_cost
from .plan import STRATEGIES, InstanceConfig, TPPlan, tp_plan
from .reference import simulate_reference
from .serving import simulate
from .setup import CONTENTION, ServingConfig, ServingSetup, build_setup, build_setups
from .synthetic import LENGTH_FITS, LengthFit, get_trace, synthetic_trace
from .traces import Trace, get_workload, load_azure_trace
from .workload import WORKLOAD_PRESETS, WorkloadParams, WorkloadSpec

__all__ = [
    "WAFER_PRESETS", "WaferParams", "WaferSpec", "a100_cluster", "design_points", "get_wafer", "wsc_wafer",
    "Instance", "Layout", "ServingResult", "PartitionResult", "ServingTargets", "instance_goodput",
    "RemoteKV", "decode_iteration_time", "decode_time", "prefill_iteration_time", "prefill_time", "anneal_placement",
    "decode_centred_placement", "exhaustive_placement", "random_placement", "transfer_cost", "STRATEGIES",
    "InstanceConfig", "TPPlan", "tp_plan", "simulate_reference", "simulate", "CONTENTION", "ServingConfig",
    "ServingSetup", "build_setup", "build_setups", "LENGTH_FITS", "LengthFit", "get_trace", "synthetic_trace", "Trace",
    "get_workload", "load_azure_trace", "WORKLOAD_PRESETS", "WorkloadParams", "WorkloadSpec",
]
