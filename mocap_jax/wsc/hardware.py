"""WSC-LLM hardware template: a wafer of compute dies, or a GPU cluster.

:class:`WaferSpec` is the static, hashable description (plain Python, validated at
construction); :class:`WaferParams` is the pytree of traced numbers the performance
models consume, so a design-space sweep can ``vmap`` over DRAM capacity, DRAM
bandwidth, D2D bandwidth or any other numeric field (:func:`design_points`).

Two topologies:

* ``"mesh"`` -- a ``rows x cols`` wafer of compute dies, each joined to its four
  neighbours by D2D links (``link_bandwidth`` bytes/s per direction).  Traffic follows
  dimension-order (XY) routing (:mod:`mocap_jax.specs.mesh`).
* ``"cluster"`` -- ``rows`` nodes of ``cols`` GPUs.  Inside a node every pair of GPUs
  is one hop over the NVLink switch (``link_bandwidth`` per GPU per direction);
  between nodes each GPU has its own network port of ``node_bandwidth`` bytes/s
  (InfiniBand), one "network hop" of ``node_latency_s``.

Die geometry (hop counts, XY routes, link tables) lives in :mod:`mocap_jax.wsc.geometry`.
Units: bytes, seconds, FLOP/s, bytes/s.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np

from ..costs import pytree
from ..specs import HardwareSpec, SpecError, checks
from ..specs.checks import LIMITS

Array = Any

# Compute die of the WSC-LLM template: 16 x 16 cores of 1.02 TFLOP/s FP16 each.
WSC_CORES_PER_DIE = 16 * 16
WSC_CORE_FLOPS = 1.02e12


@dataclass(frozen=True)
class WaferSpec:
    """A WSC-LLM hardware point: a mesh of dies (wafer) or a GPU cluster.

    Attributes:
      name: preset or user name.
      rows, cols: die grid (mesh) or nodes x GPUs per node (cluster).
      topology: ``"mesh"`` or ``"cluster"``.
      peak_flops: dense FP16 FLOP/s of one die / GPU.
      dram_capacity: bytes of DRAM per die / GPU.
      dram_bandwidth: DRAM bytes/s per die / GPU.
      link_bandwidth: D2D bytes/s per direction per neighbour link (mesh), or NVLink
        bytes/s per direction per GPU (cluster).
      node_bandwidth: cluster only: network bytes/s per direction per GPU between nodes.
      link_latency_s: seconds per D2D / NVLink hop.
      node_latency_s: cluster only: seconds per network (inter-node) hop.
      sync_latency_s: fixed seconds per step of a ring collective (synchronisation,
        kernel launch), on top of the hop latency.
      eff_gemm, eff_attention, eff_dram, eff_link: achieved / peak.
      usable_dram_fraction: share of DRAM the runtime may fill (weights + KV + buffers).
      weight_bytes, kv_bytes, activation_bytes: storage precision per element.
      activation_workspace_factor: activation buffers of an iteration, in units of
        ``tokens x hidden x activation_bytes``.
      layer_overhead_s: fixed seconds per transformer block per iteration.
      remote_kv_overlap: in [0, 1], the share of the shorter of (local attention,
        remote KV read) hidden under the longer one (1 = fully overlapped).
      description: free text (where the numbers come from).
    """

    name: str
    rows: int = 6
    cols: int = 9
    topology: str = "mesh"
    peak_flops: float = WSC_CORES_PER_DIE * WSC_CORE_FLOPS
    dram_capacity: float = 64e9
    dram_bandwidth: float = 2e12
    link_bandwidth: float = 2e12
    node_bandwidth: float = 25e9
    link_latency_s: float = 100e-9
    node_latency_s: float = 5e-6
    sync_latency_s: float = 1e-6
    eff_gemm: float = 0.80
    eff_attention: float = 0.70
    eff_dram: float = 0.85
    eff_link: float = 0.85
    usable_dram_fraction: float = 0.9
    weight_bytes: float = 2.0
    kv_bytes: float = 2.0
    activation_bytes: float = 2.0
    activation_workspace_factor: float = 8.0
    layer_overhead_s: float = 0.0
    remote_kv_overlap: float = 1.0
    description: str = ""

    def __post_init__(self):
        for f in ("rows", "cols"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise SpecError(f"wafer {self.name!r}: {f} must be a positive integer, got {v!r}")
        if self.rows * self.cols > LIMITS["dies"]:
            raise SpecError(f"wafer {self.name!r}: {self.rows * self.cols:,} dies exceed the largest grid the "
                            f"simulator represents, {LIMITS['dies']:,} dies; use fewer rows or cols")
        if self.topology not in ("mesh", "cluster"):
            raise SpecError(f"wafer {self.name!r}: topology must be 'mesh' or 'cluster', got {self.topology!r}")
        where = f"wafer {self.name!r}"
        # the prefill hardware's ranges (specs.checks.LIMITS): inside them every time and byte count
        # the performance models form stays finite in float32
        for f in ("peak_flops", "dram_capacity", "dram_bandwidth", "link_bandwidth", "node_bandwidth"):
            checks.positive(f"{where}: {f}", getattr(self, f), lo=LIMITS["hardware_minimum"],
                            hint=" Give FLOP/s, bytes or bytes/s (1 at least).")
        for f in ("weight_bytes", "kv_bytes", "activation_bytes"):
            checks.number(f"{where}: {f}", getattr(self, f), 0.0, 16.0, lo_open=True,
                          hint=" Bytes per stored element, e.g. 2 for BF16, 1 for FP8.")
        for f in ("eff_gemm", "eff_attention", "eff_dram", "eff_link"):
            checks.number(f"{where}: {f}", getattr(self, f), LIMITS["efficiency_minimum"], 1.0)
        checks.fraction(f"{where}: usable_dram_fraction", self.usable_dram_fraction, open_low=True)
        checks.number(f"{where}: remote_kv_overlap", self.remote_kv_overlap, 0.0, 1.0)
        for f in ("link_latency_s", "node_latency_s", "sync_latency_s", "layer_overhead_s"):
            checks.number(f"{where}: {f}", getattr(self, f), 0.0, LIMITS["latency_s"])
        # tokens x hidden x activation_bytes: up to 1e6 of them per token, a chunk's buffers stay finite in
        # float32 for every length and model width the simulator represents
        checks.number(f"{where}: activation_workspace_factor", self.activation_workspace_factor, 0.0, 1e6)

    # ---- geometry
    @property
    def num_dies(self) -> int:
        return self.rows * self.cols

    @property
    def is_mesh(self) -> bool:
        return self.topology == "mesh"

    def mesh_spec(self) -> HardwareSpec:
        """The same grid as a :class:`~mocap_jax.specs.HardwareSpec` (for :mod:`mocap_jax.specs.mesh` routing).

        A cluster maps to a ``switch`` topology (every pair of GPUs one hop apart);
        use :func:`hop_matrix` for the cluster's node-aware distances.
        """
        return HardwareSpec(
            name=self.name, rows=self.rows if self.is_mesh else 1, cols=self.cols if self.is_mesh else self.num_dies,
            topology="mesh" if self.is_mesh else "switch", peak_flops=self.peak_flops,
            hbm_capacity=self.dram_capacity, hbm_bandwidth=self.dram_bandwidth, link_bandwidth=self.link_bandwidth,
            cross_wafer_bandwidth=self.link_bandwidth, link_latency_s=self.link_latency_s, eff_gemm=self.eff_gemm,
            eff_attention=self.eff_attention, eff_hbm=self.eff_dram, eff_link=self.eff_link,
            usable_hbm_fraction=self.usable_dram_fraction, weight_bytes=self.weight_bytes, kv_bytes=self.kv_bytes,
            activation_bytes=self.activation_bytes, description=self.description)

    def replace(self, **changes) -> "WaferSpec":
        return dataclasses.replace(self, **changes)

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "topology": self.topology,
            "grid": f"{self.rows}x{self.cols}" + (" (nodes x GPUs)" if not self.is_mesh else ""),
            "dies": self.num_dies,
            "tflops_per_die": self.peak_flops / 1e12,
            "dram_gb_per_die": self.dram_capacity / 1e9,
            "dram_tbps_per_die": self.dram_bandwidth / 1e12,
            "link_tbps": self.link_bandwidth / 1e12,
            "node_gbps": self.node_bandwidth / 1e9 if not self.is_mesh else None,
            "total_pflops": self.num_dies * self.peak_flops / 1e15,
            "total_dram_tb": self.num_dies * self.dram_capacity / 1e12,
            "description": self.description,
        }

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def wsc_wafer(rows: int = 6, cols: int = 9, dram_gb: float = 64, dram_tbps: float = 2, d2d_tbps: float = 2,
              cores_per_die: int = WSC_CORES_PER_DIE, core_tflops: float = WSC_CORE_FLOPS / 1e12,
              name: str | None = None, **changes) -> WaferSpec:
    """The WSC-LLM wafer: ``rows x cols`` compute dies of ``cores_per_die`` cores each.

    Args:
      rows, cols: die grid.
      dram_gb: DRAM capacity per die, GB (1e9 bytes).
      dram_tbps: DRAM bandwidth per die, TB/s (1e12 bytes/s).
      d2d_tbps: D2D bandwidth per direction per neighbour link, TB/s.
      cores_per_die, core_tflops: compute die (default 16 x 16 cores of 1.02 TFLOP/s FP16).
      name: defaults to ``wsc-RxC-<dram>g-<bw>t-<d2d>d``.
      **changes: any other :class:`WaferSpec` field.
    """
    for label, v in (("dram_gb", dram_gb), ("dram_tbps", dram_tbps), ("d2d_tbps", d2d_tbps),
                     ("core_tflops", core_tflops)):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0 or not math.isfinite(v):
            raise SpecError(f"wsc_wafer: {label} must be a positive number, got {v!r}")
    if not isinstance(cores_per_die, int) or cores_per_die <= 0:
        raise SpecError(f"wsc_wafer: cores_per_die must be a positive integer, got {cores_per_die!r}")
    name = name or f"wsc-{rows}x{cols}-{dram_gb:g}g-{dram_tbps:g}t-{d2d_tbps:g}d"
    desc = changes.pop("description", f"{rows}x{cols} dies of {cores_per_die} cores x {core_tflops:g} TFLOP/s FP16 "
                                      f"({cores_per_die * core_tflops:.0f} TFLOP/s), {dram_gb:g} GB / "
                                      f"{dram_tbps:g} TB/s DRAM, {d2d_tbps:g} TB/s D2D")
    return WaferSpec(name=name, rows=rows, cols=cols, topology="mesh", peak_flops=cores_per_die * core_tflops * 1e12,
                     dram_capacity=dram_gb * 1e9, dram_bandwidth=dram_tbps * 1e12, link_bandwidth=d2d_tbps * 1e12,
                     description=desc, **changes)


def a100_cluster(nodes: int = 6, gpus_per_node: int = 8, ib_gbps: float = 25.0, name: str | None = None,
                 **changes) -> WaferSpec:
    """The Splitwise-style GPU baseline: ``nodes`` DGX-A100-like nodes of ``gpus_per_node`` A100-80GB.

    Per GPU: 312 TFLOP/s BF16 dense, 80 GB HBM2e at 2.039 TB/s, NVLink 3 at 300 GB/s per
    direction through the node's NVSwitch.  Between nodes each GPU has its own
    200 Gb/s HDR InfiniBand port, i.e. ``ib_gbps`` = 25 GB/s per direction (the DGX A100
    design: eight compute NICs per node), 5 us per network hop.
    """
    if not isinstance(nodes, int) or nodes <= 0 or not isinstance(gpus_per_node, int) or gpus_per_node <= 0:
        raise SpecError(f"a100_cluster: nodes and gpus_per_node must be positive integers, got {nodes!r}, {gpus_per_node!r}")
    name = name or f"a100-cluster-{nodes}x{gpus_per_node}"
    desc = changes.pop("description", f"{nodes} nodes x {gpus_per_node} A100-80GB SXM (312 TFLOP/s BF16, 80 GB, "
                                      f"2.039 TB/s), NVLink 300 GB/s, InfiniBand {ib_gbps:g} GB/s per GPU")
    base = dict(rows=nodes, cols=gpus_per_node, topology="cluster", peak_flops=312e12, dram_capacity=80e9,
                dram_bandwidth=2.039e12, link_bandwidth=300e9, node_bandwidth=ib_gbps * 1e9, link_latency_s=1e-6,
                node_latency_s=5e-6, sync_latency_s=1e-6, description=desc)
    base.update(changes)
    return WaferSpec(name=name, **base)


WAFER_PRESETS: dict[str, WaferSpec] = {
    w.name: w
    for w in [
        # Published WSC-LLM design points.
        wsc_wafer(6, 9, 64, 2, 2, name="wsc-llm-64g", description="WSC-LLM design point: 6x9 dies, 64 GB / 2 TB/s "
                                                                    "DRAM per die, 2 TB/s D2D, 261 TFLOP/s per die"),
        wsc_wafer(6, 9, 96, 3, 1.5, name="wsc-llm-96g", description="WSC-LLM design point: 6x9 dies, 96 GB / 3 TB/s "
                                                                     "DRAM per die, 1.5 TB/s D2D, 261 TFLOP/s per die"),
        # The low-memory corner of the exploration range (32 GB / 1 TB/s DRAM, 2.5 TB/s D2D; not published).
        wsc_wafer(6, 9, 32, 1, 2.5, name="wsc-llm-32g", description="DSE corner: 6x9 dies, 32 GB / 1 TB/s DRAM per "
                                                                     "die, 2.5 TB/s D2D"),
        a100_cluster(6, 8, name="a100-cluster"),
    ]
}


def _parse_wafer_name(key: str) -> WaferSpec | None:
    """``wsc-RxC`` (64 GB / 2 TB/s / 2 TB/s dies) or ``a100-cluster-NxG``."""
    m = re.fullmatch(r"wsc-(\d+)x(\d+)", key)
    if m:
        r, c = int(m.group(1)), int(m.group(2))
        if min(r, c) <= 0:
            raise SpecError(f"wafer {key!r}: rows and cols must be positive")
        return wsc_wafer(r, c, name=key)
    m = re.fullmatch(r"a100-cluster-(\d+)x(\d+)", key)
    if m:
        n, g = int(m.group(1)), int(m.group(2))
        if min(n, g) <= 0:
            raise SpecError(f"cluster {key!r}: nodes and GPUs per node must be positive")
        return a100_cluster(n, g, name=key)
    return None


def get_wafer(name_or_spec: "str | WaferSpec | Mapping[str, Any]") -> WaferSpec:
    """Resolve a preset name (also ``wsc-RxC``, ``a100-cluster-NxG``), a field mapping, or pass a WaferSpec through."""
    if isinstance(name_or_spec, WaferSpec):
        return name_or_spec
    if isinstance(name_or_spec, Mapping):
        fields = {f.name for f in dataclasses.fields(WaferSpec)}
        unknown = sorted(set(name_or_spec) - fields)
        if unknown:
            raise SpecError(f"wafer spec: unknown field(s) {unknown}; known fields: {sorted(fields)}")
        data = dict(name_or_spec)
        data.setdefault("name", "custom")
        return WaferSpec(**data)
    key = str(name_or_spec).lower()
    if key in WAFER_PRESETS:
        return WAFER_PRESETS[key]
    parsed = _parse_wafer_name(key)
    if parsed is not None:
        return parsed
    close = difflib.get_close_matches(key, list(WAFER_PRESETS) + ["wsc-6x9", "a100-cluster-6x8"], n=3, cutoff=0.4)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    raise SpecError(f"unknown WSC-LLM hardware {str(name_or_spec)!r}.{hint} Presets: {sorted(WAFER_PRESETS)}; "
                    f"also wsc-RxC (any die grid) and a100-cluster-NxG. Run `mocap-jax wsc-llm hardware` for the list.")


# --------------------------------------------------------------------------- traced numbers



@pytree
class WaferParams:
    """Numbers of a :class:`WaferSpec` the performance models read (scalars, or ``[...]`` batched).

    Every leaf may be traced, so ``jax.vmap`` can run the models over design points
    (build a batch with :func:`design_points`).  Fields mirror :class:`WaferSpec`.
    """

    peak_flops: Array                    # [] FLOP/s of one die
    dram_capacity: Array                 # [] bytes of DRAM per die
    dram_bandwidth: Array                # [] bytes/s of DRAM per die
    link_bandwidth: Array                # [] bytes/s per direction of a D2D link (NVLink per GPU on a cluster)
    node_bandwidth: Array                # [] bytes/s per direction of a GPU's network port (cluster)
    link_latency_s: Array                # [] s per D2D / NVLink hop
    node_latency_s: Array                # [] s per network hop (cluster)
    sync_latency_s: Array                # [] s per ring-collective step
    eff_gemm: Array                      # [] achieved / peak FLOP/s of GEMMs
    eff_attention: Array                 # [] achieved / peak FLOP/s of attention
    eff_dram: Array                      # [] achieved / peak DRAM bandwidth
    eff_link: Array                      # [] achieved / peak link bandwidth
    usable_dram_fraction: Array          # [] share of DRAM the runtime may fill
    weight_bytes: Array                  # [] bytes per weight element
    kv_bytes: Array                      # [] bytes per KV element
    activation_bytes: Array              # [] bytes per activation element
    activation_workspace_factor: Array   # [] activation buffers, in tokens x hidden x activation_bytes
    layer_overhead_s: Array              # [] s per transformer block per iteration
    remote_kv_overlap: Array             # [] share of min(local attention, remote KV read) hidden, in [0, 1]

    @staticmethod
    def from_spec(w: WaferSpec, dtype=jnp.float32) -> "WaferParams":
        names = [f.name for f in dataclasses.fields(WaferParams)]
        return WaferParams(**{n: np.asarray(getattr(w, n), dtype=dtype) for n in names})

    @property
    def usable_dram(self):
        """Bytes of DRAM per die the runtime may fill."""
        return self.dram_capacity * self.usable_dram_fraction

    def replace(self, **changes) -> "WaferParams":
        return dataclasses.replace(self, **changes)


def design_points(base: WaferSpec, dtype=jnp.float32, **axes) -> tuple[WaferParams, dict[str, np.ndarray]]:
    """A batch of hardware points: the Cartesian product of the given field values.

    Example: ``design_points(spec, dram_capacity=[32e9, 64e9, 96e9], link_bandwidth=[1.5e12, 2e12])``
    gives a :class:`WaferParams` whose leaves have shape ``[6]`` (fields not named
    are broadcast), ready for ``jax.vmap``.

    Returns:
      (params, grid): the batched params and, per named field, its value at each point ``[P]``.
    """
    fields = {f.name for f in dataclasses.fields(WaferParams)}
    bad = sorted(set(axes) - fields)
    if bad:
        raise SpecError(f"design_points: unknown field(s) {bad}; sweepable fields: {sorted(fields)}")
    names = list(axes)
    values = [np.atleast_1d(np.asarray(axes[n], dtype=np.float64)) for n in names]
    for n, v in zip(names, values):
        if v.size == 0:
            raise SpecError(f"design_points: {n} needs one or more values")
        for x in np.unique(v):          # each value within the wafer's ranges (WaferSpec's checks)
            dataclasses.replace(base, **{n: float(x)})
    combos = list(itertools.product(*[v.tolist() for v in values])) if names else [()]
    n_pts = len(combos)
    grid = {n: np.asarray([c[i] for c in combos]) for i, n in enumerate(names)}
    one = WaferParams.from_spec(base, dtype)
    leaves = {}
    for f in dataclasses.fields(WaferParams):
        v = grid[f.name] if f.name in grid else np.full(n_pts, getattr(one, f.name))
        leaves[f.name] = np.asarray(v, dtype=dtype)
    return WaferParams(**leaves), grid


__all__ = [
    "WaferSpec", "WaferParams", "WAFER_PRESETS", "wsc_wafer", "a100_cluster", "get_wafer", "design_points",
    "WSC_CORES_PER_DIE", "WSC_CORE_FLOPS",
]
