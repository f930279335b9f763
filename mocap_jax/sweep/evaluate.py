"""The one place the sweep calls the simulator: a block of resolved points -> its output columns.

:class:`Evaluator` takes a bucket key (the static structure of a compiled program) and the
:class:`~.resolver.Resolved` points of one block, and returns a dict of output columns:

* fast buckets (``gpipe``, ``terapipe``, ``mbkr``): the block's ``Point`` pytree is built host side
  in NumPy, sharded over the local devices on its point axis and evaluated by
  ``shard_map(lax.map(vmap(...)))`` over micro-batches; only scalar summaries come back;
* ``serial`` (the slow schemes and ``batch = "auto"``): one point at a time through
  :func:`mocap_jax.study.compare.evaluate_scheme`;
* ``impossible``: rows of ``feasible = false`` with the reason, nothing evaluated.

A column is a NumPy array over the block's points: numeric and bool arrays hold every point
(``float32`` or ``float64`` as simulated); object arrays hold Python values, ``None`` where a
column does not apply.  Before a block program runs, its memory (host inputs and XLA's own
estimate of the compiled program) is checked against what is available; end-to-end latencies
whose absolute clock cannot resolve them are refused, never written.  The simulator's modules
(``prefill``, ``schedule``, ``serving``, ``mbkr``, ``partition``, ``api``, ``study``) are imported here and nowhere else in the
sweep: replacing the evaluator touches only this module.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from ..api.config import ADMISSION_MODES, RELEASE_POLICIES, searched_placement
from ..costs import HardwareParams, ModelParams
from ..costs.computed_once import COMPILER_OPTIONS, compiler_options
from ..mbkr.pairing import DEFAULT_P1, DEFAULT_P2, DEFAULT_READ_OVERLAP, PAIRINGS, MBKRParams
from ..partition.objectives import OBJECTIVES
from ..prefill.batch import evaluate_vmapped, in_steps, plain_shape, spills_needed
from ..prefill.evaluate import Point
from ..prefill.points import MBKRSettings, stage_routes
from ..schedule.items import Chunks, gpipe_items, uniform_partitions
from ..schedule.shape import Admission, MBKRMode, Release, SimShape
from ..serving.arrivals import arrival_times
from ..serving.e2e import ServingShape, check_clock, clock_resolved, e2e_latency
from ..specs import HardwareSpec, ModelSpec, SpecError, mocap_wafer
from ..specs.mesh import snake_placement, stage_groups
from .arrays import unique_rows
from .memory import available_memory_bytes, gib

__all__ = ["Evaluator", "ADMISSION_MODES", "RELEASE_POLICIES", "PAIRINGS", "OBJECTIVES", "ARRIVALS", "DEFAULT_P1",
           "DEFAULT_P2", "DEFAULT_READ_OVERLAP", "MBKR_OUTPUTS"]

ARRIVALS = ("poisson", "fixed", "offline")
MBKR_OUTPUTS = ("spilled_bytes", "remote_read_s", "remote_read_unhidden_s", "spill_write_s", "blocking_s", "migrate_s")
SUMMARY_OUTPUTS = ("prefill_latency_s", "raw_latency_s", "throughput_rps", "period_s", "bubble_fraction",
                   "max_peak_mem_bytes", "max_kv_peak_bytes", "max_stage_weight_bytes", "usable_hbm_bytes",
                   "max_stage_utilisation")
E2E_OUTPUTS = ("e2e_mean_s", "e2e_p50_s", "e2e_p99_s", "load_throughput_rps")


class TemplateCache:
    """Host-side pieces of ``Point`` that depend only on a few inputs (cached per run)."""

    def __init__(self, dtype):
        self.dtype = dtype
        self._params: dict = {}
        self._route: dict = {}
        self._arrivals: dict = {}

    def params(self, spec):
        if spec not in self._params:
            cls = ModelParams if isinstance(spec, ModelSpec) else HardwareParams
            self._params[spec] = cls.from_spec(spec, self.dtype)
        return self._params[spec]

    def route(self, hw: HardwareSpec, n: int, n_pad: int, placement: str, scheme: str, pairing: str, mode: str,
              tp: int = 1):
        """``(StageLayout, MBKRParams)`` of a mesh geometry, stage count, tensor-parallel degree, placement and
        pairing (cached): ``tp > 1`` places stage groups (the default groups, or the searched group tiles)."""
        geo = (hw.rows, hw.cols, hw.wafers, hw.topology, hw.link_bandwidth, hw.cross_wafer_bandwidth)
        key = (geo, n, n_pad, placement, scheme, pairing, mode, tp)
        hit = self._route.get(key)
        if hit is not None:
            return hit
        g = mocap_wafer(hw.rows, hw.cols, hw.wafers, topology=hw.topology, link_bandwidth=hw.link_bandwidth,
                        cross_wafer_bandwidth=hw.cross_wafer_bandwidth, name="route")
        if placement == "default":
            placement = "searched" if scheme in ("mbkr", "mocap") and pairing != "none" else "snake"
        if placement == "searched":
            # the search depends on the geometry and on the cross-wafer / D2D bandwidth ratio only
            ratio = hw.cross_wafer_bandwidth / hw.link_bandwidth if hw.wafers > 1 else 1.0
            gs = mocap_wafer(hw.rows, hw.cols, hw.wafers, topology=hw.topology, link_bandwidth=5e12,
                             cross_wafer_bandwidth=5e12 * ratio, name="placement")
            pl = searched_placement(gs, n, pairing, tp)
        else:
            pl = snake_placement(g, n) if tp == 1 else stage_groups(g, n, tp)
        hit = stage_routes(g, pl, n_pad, MBKRSettings(pairing=pairing), self.dtype)
        self._route[key] = hit
        return hit

    def arrivals(self, kind: str, rate: float, count: int, seed: int) -> np.ndarray:
        key = (kind, rate, count, seed)
        a = self._arrivals.get(key)
        if a is None:
            if len(self._arrivals) > 4096:
                self._arrivals.clear()
            a = self._arrivals[key] = np.asarray(arrival_times(kind, rate, count, seed), self.dtype)
        return a


def _gather(objs: list, inv: np.ndarray):
    """Stack the leaves of ``objs`` (same pytree) and gather them by ``inv`` (leading axis)."""
    return jax.tree_util.tree_map(lambda *xs: np.stack([np.asarray(x) for x in xs])[inv], *objs)


def block_inputs(key: tuple, r, cache: TemplateCache, size: int):
    """``(Point, serving extras)`` of a fast bucket's block, padded to ``size`` points with copies of
    the last one (NumPy)."""
    _, kind, k_pad, n_pad, nb, mode, R, sync, request = key
    pad = np.minimum(np.arange(size), len(r.ids) - 1)
    col = lambda k, dtype=np.int64, fill=np.nan: r.values(k, dtype=dtype, fill=fill)[pad]
    seq = col("seq_len")
    batch = col("batch", fill=1)
    if kind == "gpipe":
        micro = col("microbatch")
        items = gpipe_items(seq, batch, micro, k_pad)
        part_pad = np.zeros((size, k_pad), np.int32)
    else:
        M = col("chunks")
        part_pad = np.zeros((size, k_pad), np.int64)
        for m in np.unique(M):
            rows = M == m
            part_pad[rows, :m] = uniform_partitions(seq[rows], int(m))
        items = Chunks(sizes=part_pad.astype(np.int32), requests=batch.astype(np.int32))   # tables built on the device
    model = _gather([cache.params(m) for m in r.models], r.codes["model"][pad])
    hardware = _gather([cache.params(h) for h in r.hw_specs], r.hw_inv[pad])
    # routes: per unique (hardware combination, stages, placement, scheme, pairing, tensor-parallel degree)
    c = r.codes
    u, inv = unique_rows([r.hw_inv[pad], r.stages[pad], c["placement"][pad], c["scheme"][pad], c["pairing"][pad],
                          r.tp[pad]])
    t = r.space.tables
    table = [cache.route(r.hw_specs[h], int(n), n_pad, t["placement"][pl], t["scheme"][s], t["pairing"][pa], mode,
                         int(tp)) for h, n, pl, s, pa, tp in u]
    layout = _gather([x[0] for x in table], inv)
    routes = _gather([x[1] for x in table], inv)
    dt = cache.dtype
    mb = MBKRParams(p1=col("p1", np.float64).astype(dt), p2=col("p2", np.float64).astype(dt),
                    read_overlap=col("read_overlap", np.float64).astype(dt), pairing=routes.pairing,
                    stage_hops=routes.stage_hops, stage_bandwidth=routes.stage_bandwidth)
    point = Point(items=items, model=model, hardware=hardware, layout=layout, mbkr=mb)
    extra = {}
    if R:
        u, inv = unique_rows([c["arrivals"][pad].astype(np.float64), col("load", np.float64),
                              col("seed").astype(np.float64)])
        arrivals = [cache.arrivals(t["arrivals"][int(a)], float(ld), R, int(sd)) for a, ld, sd in u]
        extra = {"partition": part_pad.astype(np.int32), "seq_len": seq.astype(np.int32),
                 "microbatch": (col("microbatch") if kind == "gpipe" else np.ones(size)).astype(np.int32),
                 "batch": batch.astype(np.int32), "arrivals": np.stack(arrivals)[inv]}
    return point, extra


#: the evaluation fields a sweep row is made of
_FIELDS = ("prefill_latency_s", "raw_latency_s", "feasible", "throughput_rps", "period_s", "bubble_fraction",
           "peak_mem_bytes_per_stage", "kv_peak_bytes_per_stage", "weight_bytes_per_stage", "capacity_bytes",
           "stage_utilisation", "spilled_bytes_per_stage", "blocking_s_per_stage", "remote_read_s",
           "remote_read_unhidden_s", "spill_write_s", "migrate_s", "mbkr_converged", "extra")


def _lean(points: Point, extra: dict, shape: SimShape, sshape: ServingShape | None,
          evaluated: SimShape | None = None) -> dict:
    """Scalar summaries of a micro-batch of points (what sweep rows need; no item-level arrays leave the device).

    Every point runs the program of ``evaluated`` (default the bucket's ``shape``; its plain shape
    for an MBKR bucket's first pass, whose rows then have zero MBKR columns)."""
    axes = jax.tree_util.tree_map(lambda _: 0, points)
    fields = _FIELDS if (sshape is not None and shape.mbkr != MBKRMode.OFF) else _FIELDS[:-1]
    o = evaluate_vmapped(points, evaluated or shape, axes, fields)
    live = jnp.arange(shape.stages)[None, :] < points.layout.num_stages[:, None]
    mx = lambda a: jnp.max(jnp.where(live, a, 0.0), axis=1)
    r = {k: o[k] for k in ("prefill_latency_s", "raw_latency_s", "feasible", "throughput_rps", "period_s",
                           "bubble_fraction")}
    r.update(max_peak_mem_bytes=mx(o["peak_mem_bytes_per_stage"]), max_kv_peak_bytes=mx(o["kv_peak_bytes_per_stage"]),
             max_stage_weight_bytes=mx(o["weight_bytes_per_stage"]), usable_hbm_bytes=o["capacity_bytes"],
             max_stage_utilisation=mx(o["stage_utilisation"]))
    if shape.mbkr != MBKRMode.OFF:
        r.update(spilled_bytes=jnp.sum(o["spilled_bytes_per_stage"], axis=1),
                 blocking_s=jnp.sum(o["blocking_s_per_stage"], axis=1),
                 **{k: o[k] for k in ("remote_read_s", "remote_read_unhidden_s", "spill_write_s", "migrate_s",
                                      "mbkr_converged")})
    if sshape is not None:
        dt = points.model.hidden.dtype
        K, N = shape.items, shape.stages
        full = o["extra"][:, :K] if "extra" in o else jnp.zeros((extra["batch"].shape[0], K, N), dt)

        def one(p, ex, mbx):
            # the plain limit is not known here: a batch of b requests carries b / B of a full batch's MBKR time
            return e2e_latency(p, ex["partition"], ex["seq_len"], ex["microbatch"], ex["batch"], ex["arrivals"], mbx,
                               0, sshape)

        e = jax.vmap(one)(points, extra, full)
        ok = o["feasible"]
        inf = jnp.asarray(jnp.inf, dt)
        r.update(e2e_mean_s=jnp.where(ok, e["mean_s"], inf), e2e_p50_s=jnp.where(ok, e["p50_s"], inf),
                 e2e_p99_s=jnp.where(ok, e["p99_s"], inf),
                 load_throughput_rps=jnp.where(ok, e["throughput_rps"], 0.0).astype(dt))
    return r


def _program(shape: SimShape, sshape, micro: int, mesh):
    from jax.sharding import PartitionSpec

    def local(points, extra):
        bucket = lambda pe: _lean(pe[0], pe[1], shape, sshape)
        if not spills_needed(shape):
            return in_steps((points, extra), micro, bucket)
        # every point without MBKR first; the spill passes only for the points that do not fit
        return in_steps((points, extra), micro, lambda pe: _lean(pe[0], pe[1], shape, sshape, plain_shape(shape)),
                        bucket)

    spec = PartitionSpec("points")
    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False))


_COMPILED: dict = {}   # compiled block programs, per (shapes, devices, options), for the life of the process


def _outputs_fast(raw: dict, r, key: tuple) -> dict:
    P = len(r.ids)
    feasible = np.asarray(raw["feasible"])[:P].astype(bool)
    out = {"feasible": feasible, "reason": np.where(feasible, "", "memory").astype(object),
           "batch_used": r.values("batch")}
    for k in SUMMARY_OUTPUTS + E2E_OUTPUTS:
        if k in raw:
            out[k] = np.asarray(raw[k])[:P]
    for k in MBKR_OUTPUTS:
        out[k] = np.asarray(raw[k])[:P] if k in raw else np.zeros(P, np.int64)
    out["mbkr_converged"] = np.asarray(raw["mbkr_converged"])[:P] if "mbkr_converged" in raw else np.ones(P, bool)
    if key[6]:
        out["load_rps"] = r.objects("load")
    return out


def _outputs_serial(r, dtype: str) -> dict:
    from ..partition.plan import PlanSettings
    from ..study.compare import CompareSettings, evaluate_scheme, plan_scheme

    rows = []
    for j in range(len(r.ids)):
        v = r.point(j)
        plan = PlanSettings(chunks=v["chunks"], granularity=v["granularity"], chains=v["chains"], steps=v["steps"],
                            objective=v["objective"], seed=v["seed"], max_batch=v["max_batch"])
        st = CompareSettings(chunks=v["chunks"], plan=plan, max_batch=v["max_batch"], requests=v["requests"],
                             arrivals=v["arrivals"], seed=v["seed"], release=v["release"], admission=v["admission"],
                             num_batches=v["num_batches"], mbkr=MBKRSettings(v["pairing"], v["p1"], v["p2"],
                                                                             v["read_overlap"]),
                             dtype=dtype, tp=int(r.tp[j]), with_max_seq=False)
        res = evaluate_scheme(plan_scheme(r.models[int(r.codes["model"][j])], r.hardware(j), v["seq_len"],
                                          v["scheme"], st, load=v["load"]), v["load"], st)
        ex = res.extra
        rows.append({
            "feasible": bool(res.feasible), "reason": "" if res.feasible else "memory",
            "prefill_latency_s": res.prefill_latency_s, "throughput_rps": res.throughput_rps,
            "bubble_fraction": res.bubble_fraction, "batch_used": int(res.batch),
            "max_stage_utilisation": max(res.stage_utilisation) if res.stage_utilisation else 0.0,
            **{k: ex.get(k, 0.0) for k in ("spilled_bytes", "remote_read_s", "blocking_s")},
            "mbkr_converged": ex.get("mbkr_converged", True),
            "load_rps": ex.get("load_rps"), "e2e_mean_s": res.e2e_latency_mean_s,
            "e2e_p50_s": res.e2e_latency_p50_s, "e2e_p99_s": res.e2e_latency_p99_s,
            "load_throughput_rps": res.load_throughput_rps,
            "partition": "-".join(str(int(x)) for x in res.partition),
        })
    out = {k: np.array([row[k] for row in rows], dtype=object) for k in rows[0]}
    out["feasible"] = out["feasible"].astype(bool)
    return out


def _outputs_impossible(r) -> dict:
    P = len(r.ids)
    return {"feasible": np.zeros(P, bool), "reason": r.reason_names(), "prefill_latency_s": np.full(P, np.inf, np.float32),
            "raw_latency_s": np.full(P, np.inf, np.float32), "throughput_rps": np.zeros(P, np.float32)}


def _check_e2e_clock(out: dict, r, arrivals: np.ndarray) -> None:
    """Refuse end-to-end latencies the float clock cannot resolve (never write them)."""
    P = len(r.ids)
    resolved, _ = clock_resolved(arrivals[:P, -1], out["e2e_mean_s"], out["e2e_p50_s"], out["e2e_p99_s"],
                                 arrivals.dtype)
    bad = np.nonzero(out["feasible"] & ~resolved)[0]
    if len(bad):
        j = int(bad[0])
        v = r.point(j)
        check_clock(f"point {int(r.ids[j])}", v["load"], v["requests"], arrivals[j, -1], out["e2e_mean_s"][j],
                    out["e2e_p50_s"][j], out["e2e_p99_s"][j], arrivals.dtype, 'dtype = "float64" in [sweep]')


class Evaluator:
    """Evaluates blocks of one run: devices, dtype and compile options fixed; programs compiled once."""

    def __init__(self, devices: list, dtype, exact: bool):
        from jax.sharding import AxisType, NamedSharding, PartitionSpec

        self.devices = devices
        self.dtype = np.dtype(dtype)
        self.exact = exact
        self.mesh = jax.make_mesh((len(devices),), ("points",), axis_types=(AxisType.Auto,), devices=devices)
        self.sharding = NamedSharding(self.mesh, PartitionSpec("points"))
        self.cache = TemplateCache(self.dtype)
        self.compiles = 0
        self.compile_s = 0.0

    def _compiled(self, shape, sshape, micro: int, args, label: str):
        leaves = jax.tree_util.tree_leaves(args)
        sig = tuple((leaf.shape, str(leaf.dtype)) for leaf in leaves)
        key = (shape, sshape, micro, tuple(d.id for d in self.mesh.devices.flat), self.exact, sig)
        hit = _COMPILED.get(key)
        if hit is not None:
            return hit
        t0 = time.perf_counter()
        opts = compiler_options("algsimp") if self.exact else COMPILER_OPTIONS
        compiled = _program(shape, sshape, micro, self.mesh).lower(*args).compile(compiler_options=opts)
        self.compiles += 1
        self.compile_s += time.perf_counter() - t0
        mem = compiled.memory_analysis()
        if mem is not None:
            per_device = mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes
            shared = self.devices[0].platform == "cpu"   # CPU devices share the host's memory
            need = per_device * (len(self.devices) if shared else 1)
            have = available_memory_bytes(self.devices[0])
            if need > have:
                raise SpecError(f"bucket {label}: a block of {len(leaves[0]):,} points needs about {gib(need)} "
                                f"(XLA's estimate of the compiled program) but {gib(have)} is available; lower "
                                f"the block size (--block-size) or the [sweep] micro_batch setting")
        _COMPILED[key] = compiled
        return compiled

    def start(self, key: tuple, r, *, micro: int, size: int, label: str):
        """Begin evaluating a block (asynchronously for fast buckets); ``.result()`` gives its columns.

        ``micro`` is the points per vectorised step, ``size`` the padded block length (a multiple
        of ``micro`` x devices), ``label`` names the bucket in messages.  The block's inputs and the
        compiled program's memory are checked before either is allocated.
        """
        if key[0] == "impossible":
            return _Done(_outputs_impossible(r))
        if key[0] == "serial":
            return _Done(_outputs_serial(r, self.dtype.name))
        _, kind, k_pad, n_pad, nb, mode, R, sync, request = key
        one = block_inputs(key, r, self.cache, 1)
        need = sum(np.asarray(x).nbytes for x in jax.tree_util.tree_leaves(one)) * size * 2
        have = available_memory_bytes(self.devices[0])
        if need > have:
            raise SpecError(f"bucket {label}: the inputs of a block of {size:,} points take about {gib(need)} "
                            f"(host and device copies) but {gib(have)} is available; lower the block size "
                            f"(--block-size)")
        inputs = block_inputs(key, r, self.cache, size)
        shape = SimShape(items=k_pad, stages=n_pad, batches=nb, groups=k_pad if kind == "gpipe" else 1,
                         release=Release.REQUEST if request else Release.STAGE,
                         admission=Admission.SYNCHRONOUS if sync else Admission.STREAMING, mbkr=MBKRMode(mode))
        sshape = ServingShape(prefill=shape._replace(batches=1), requests=R, gpipe=kind == "gpipe") if R else None
        abstract = jax.tree_util.tree_map(
            lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype, sharding=self.sharding), inputs)
        program = self._compiled(shape, sshape, micro, abstract, label)
        handle = program(*jax.device_put(inputs, self.sharding))
        return _Pending(handle, r, key, inputs[1].get("arrivals"))


class _Done:
    def __init__(self, out: dict):
        self.out = out

    def result(self) -> dict:
        return self.out


class _Pending:
    def __init__(self, handle, r, key, arrivals):
        self.handle, self.r, self.key, self.arrivals = handle, r, key, arrivals

    def result(self) -> dict:
        out = _outputs_fast(jax.device_get(self.handle), self.r, self.key)
        if self.arrivals is not None:
            _check_e2e_clock(out, self.r, self.arrivals)
        return out
