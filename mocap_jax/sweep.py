"""Declared sweeps: a TOML file -> points -> shape buckets -> sharded compiled blocks -> CSV (DESIGN §11).

A sweep file (schema in ``sweeps/README.md``) declares grids (cartesian products)
and explicit rows of points over models, hardware (presets, mesh axes, die
parameters), sequence lengths, chunk counts, batches, schemes, MBKR thresholds,
serving load and the annealing settings of the slow schemes.  :func:`run_sweep`

1. validates the whole file before anything is traced (unknown keys, empty or
   mistyped values, impossible combinations such as more chunks than tokens or a
   model that does not fit a mesh: one ``ValueError`` naming the key and the file);
2. groups points into shape buckets (``SimShape``: item bucket, stage bucket,
   batches, MBKR mode, plus the serving shape when a load is given) so that each
   bucket compiles once -- model and hardware numbers are traced leaves, so
   different models and meshes share one program inside a bucket;
3. builds ``Point`` pytrees host-side in NumPy, block by block (a fixed number of
   points; the last block of a bucket is padded), shards each block's point axis
   over every local device (``NamedSharding`` on a 1-D mesh, ``shard_map`` of a
   ``lax.map`` over fixed-size micro-batches of ``vmap(evaluate)``) and transfers
   back only scalar summaries (never the ``finish_times`` array);
4. writes every finished block atomically (temp file + ``os.replace``) to
   ``OUT/parts/`` and finally merges them, in point order, into ``OUT/results.csv``.
   ``resume=True`` skips blocks already on disk (their file name carries a hash of
   the configuration, block layout and package version).

Points never interact, so a point's numbers do not depend on the block it lands in
or on how blocks are sharded.  XLA compiles a single-device program through a
different optimisation pipeline than a partitioned one, and its algebraic
simplifier then rewrites a few divisions differently (last-bit differences); with
``exact = true`` (the default) the sweep compiles with that pass disabled, which
makes results bit-identical for any number of devices (default on CPU; set it
explicitly on accelerators, where this was not measured).

Slow schemes (``lbcp``, ``mocap``, ``terapipe-dp``) and ``batch = "auto"`` run one
point at a time through :func:`mocap_jax.compare.evaluate_scheme` (a partition
search and an annealing run per point: seconds to minutes each).

Multi-host: when ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES`` and
``JAX_PROCESS_ID`` are set, :func:`run_sweep` calls ``jax.distributed.initialize``;
each process evaluates every ``num_processes``-th block on its local devices into a
shared output directory, and process 0 assembles ``results.csv`` after a barrier.
"""

from __future__ import annotations

import csv
import dataclasses
import difflib
import hashlib
import heapq
import io
import json
import math
import os
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from . import __version__, api, costs
from .costs import HardwareParams, ModelParams, StageLayout
from .mbkr import DEFAULT_P1, DEFAULT_P2, DEFAULT_READ_OVERLAP, PAIRINGS, MBKRParams, pair_routes
from .schedule import ItemTable, Point, SimShape, evaluate
from .serving import ServingShape, arrival_times, e2e_latency
from .specs import HardwareSpec, ModelSpec, SpecError, get_hardware, get_model, mocap_wafer

# --------------------------------------------------------------------------- schema

FAST_SCHEMES = ("gpipe", "terapipe", "mbkr")
SERIAL_SCHEMES = ("terapipe-dp", "lbcp", "mocap")
ALL_SCHEMES = FAST_SCHEMES + SERIAL_SCHEMES
DIE_FIELDS = ("peak_flops", "hbm_capacity", "hbm_bandwidth", "link_bandwidth", "cross_wafer_bandwidth",
              "link_latency_s", "eff_gemm", "eff_attention", "eff_hbm", "eff_link", "usable_hbm_fraction",
              "weight_bytes", "kv_bytes", "activation_bytes", "activation_workspace_factor", "layer_overhead_s")
ROUTE_FIELDS = ("link_bandwidth", "cross_wafer_bandwidth")


@dataclass(frozen=True)
class Key:
    """One sweepable key: its value kind, default and documentation."""

    kind: str              # str | int | int? | int|auto | float | float? | frac | choice
    default: Any
    doc: str
    choices: tuple = ()


KEYS: dict[str, Key] = {
    "model": Key("str", "llama3-70b", "model preset or .json/.toml spec file (relative to the sweep file)"),
    "hardware": Key("str", "mocap-4x4", "hardware preset, mocap-RxC[xWw], or spec file"),
    "rows": Key("int?", None, "mesh rows (overrides the hardware's)"),
    "cols": Key("int?", None, "mesh columns per wafer (overrides the hardware's)"),
    "wafers": Key("int?", None, "wafers side by side (overrides the hardware's)"),
    "stages": Key("int?", None, "pipeline stages (default: every die)"),
    **{f: Key("die", None, f"per-die {f} (overrides the hardware's; see HardwareSpec)") for f in DIE_FIELDS},
    "seq_len": Key("int", 65536, "prompt tokens per request"),
    "chunks": Key("int", 16, "chunks per request (chunked schemes; LBCP: chunk count M)"),
    "batch": Key("int|auto", 1, "requests per batch, or \"auto\" (largest feasible B', slow path)"),
    "microbatch": Key("int", 1, "requests per GPipe microbatch"),
    "scheme": Key("choice", "terapipe", "pipelining scheme", ALL_SCHEMES),
    "placement": Key("choice", "default", "stage-to-die map (default: searched for MBKR, snake otherwise)",
                     ("default", "snake", "searched")),
    "release": Key("choice", "stage", "KV release policy", api.RELEASE_POLICIES),
    "admission": Key("choice", "streaming", "batch admission", api.ADMISSION_MODES),
    "num_batches": Key("int", 2, "consecutive batches simulated"),
    "pairing": Key("choice", "cross-half", "MBKR pairing", PAIRINGS),
    "p1": Key("frac", DEFAULT_P1, "MBKR creditor threshold (fraction of KV budget)"),
    "p2": Key("frac", DEFAULT_P2, "MBKR debtor threshold (fraction of KV budget)"),
    "read_overlap": Key("frac", DEFAULT_READ_OVERLAP, "fraction of local attention hiding a remote read"),
    "load": Key("float?", None, "request rate (requests/s) for end-to-end latency; omit for prefill only"),
    "requests": Key("int", 256, "simulated requests for end-to-end latency"),
    "arrivals": Key("choice", "poisson", "arrival process", ("poisson", "fixed", "offline")),
    "granularity": Key("int", 256, "LBCP chunk granularity g (tokens)"),
    "chains": Key("int", 256, "LBCP annealing chains"),
    "steps": Key("int", 600, "LBCP annealing steps"),
    "objective": Key("choice", "prefill", "LBCP objective", ("prefill", "e2e", "throughput")),
    "max_batch": Key("int", 256, "upper end of the batch = \"auto\" search"),
    "seed": Key("seed", 0, "seed of arrivals and annealing (default: [sweep] seed)"),
}

SETTINGS: dict[str, Key] = {
    "name": Key("str", "sweep", "name (default output directory sweep-results/NAME)"),
    "description": Key("str", "", "free text"),
    "seed": Key("seed", 0, "default seed of every point"),
    "block_size": Key("int", 0, "points per compiled call (0: 4096 on CPU, 32768 on accelerators)"),
    "micro_batch": Key("int", 0, "points per vectorised step inside a block (0: 64 on CPU, 4096 otherwise)"),
    "serial_block_size": Key("int", 8, "points per block of the one-at-a-time schemes"),
    "dtype": Key("choice", "float32", "float32 or float64", ("float32", "float64")),
    "impossible": Key("choice", "error", "impossible combinations: raise, or record as infeasible rows",
                      ("error", "infeasible")),
    "exact": Key("bool", None, "bit-identical results for any device count (XLA algebraic simplifier off); "
                               "default: true on CPU, false on accelerators"),
}
TABLES = ("sweep", "fixed", "grid", "points")

OUTPUT_COLUMNS = (
    "feasible", "reason", "prefill_latency_s", "raw_latency_s", "throughput_rps", "period_s", "bubble_fraction",
    "batch_used", "max_peak_mem_bytes", "max_kv_peak_bytes", "max_workspace_bytes", "max_stage_weight_bytes",
    "usable_hbm_bytes",
    "max_stage_utilisation", "spilled_bytes", "remote_read_s", "remote_read_unhidden_s", "spill_write_s",
    "blocking_s", "migrate_s", "load_rps", "e2e_mean_s", "e2e_p50_s", "e2e_p99_s", "load_throughput_rps",
    "partition",
)
INPUT_COLUMNS = ("scheme", "model", "hardware", "rows", "cols", "wafers", "stages", "seq_len", "chunks", "batch",
                 "microbatch", "placement", "release", "admission", "num_batches", "pairing", "p1", "p2",
                 "read_overlap", "load", "requests", "arrivals", "granularity", "chains", "steps", "objective",
                 "max_batch", "seed") + DIE_FIELDS
PROVENANCE_COLUMNS = ("mocap_jax_version", "config_hash", "device_kind", "devices", "bucket")
COLUMNS = ("point_id",) + INPUT_COLUMNS + OUTPUT_COLUMNS + PROVENANCE_COLUMNS
assert len(set(COLUMNS)) == len(COLUMNS)
MBKR_OUTPUTS = ("spilled_bytes", "remote_read_s", "remote_read_unhidden_s", "spill_write_s", "blocking_s", "migrate_s")


def _suggest(word: str, choices) -> str:
    close = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    return f" Did you mean {close[0]!r}?" if close else ""


def _check_value(origin: str, where: str, name: str, spec: Key, v):
    """Validate one value of a key; return it normalised (ints as int, floats as float)."""
    def bad(what: str):
        raise ValueError(f"{origin}: {where} {name}: {what}, got {v!r}")

    kind = spec.kind
    is_int = isinstance(v, int) and not isinstance(v, bool)
    is_num = (is_int or isinstance(v, float)) and not isinstance(v, bool)
    if kind == "str":
        if not isinstance(v, str) or not v:
            bad("expected a non-empty string")
        return v
    if kind == "bool":
        if not isinstance(v, bool):
            bad("expected true or false")
        return v
    if kind == "choice":
        if not isinstance(v, str) or v not in spec.choices:
            raise ValueError(f"{origin}: {where} {name}: unknown value {v!r}; choose one of "
                             f"{', '.join(spec.choices)}.{_suggest(v, spec.choices)}")
        return v
    if kind in ("int", "int?", "int|auto", "seed"):
        if kind == "int|auto" and v == "auto":
            return v
        if kind == "int?" and v is None:
            return None
        if not is_int:
            bad("expected " + ("a positive integer or \"auto\"" if kind == "int|auto" else
                               "a non-negative integer" if kind == "seed" else "a positive integer"))
        if (kind == "seed" and v < 0) or (kind != "seed" and v <= 0):
            bad("expected a non-negative integer" if kind == "seed" else "expected a positive integer")
        return int(v)
    if kind == "frac":
        if not is_num or not 0.0 <= v <= 1.0:
            bad("expected a fraction in [0, 1]")
        return float(v)
    if kind == "float?":
        if v is None:
            return None
        if not is_num or not v > 0 or not math.isfinite(v):
            bad("expected a positive number")
        return float(v)
    if kind == "die":
        if not is_num:
            bad("expected a number")
        try:
            mocap_wafer(**{name: float(v)})
        except SpecError as e:
            msg = str(e).split(": ", 1)[-1]
            raise ValueError(f"{origin}: {where} {name}: {msg}") from None
        return float(v)
    raise AssertionError(kind)


# --------------------------------------------------------------------------- configuration


@dataclass
class SweepConfig:
    """A validated sweep definition (see ``sweeps/README.md``).

    ``grids`` is a list of ``{key: [values]}`` (cartesian products, the last key
    varying fastest), ``rows`` the explicit ``[[points]]`` (``{key: value}``),
    ``fixed`` the scalars applied to every point, ``settings`` the ``[sweep]`` table.
    """

    origin: str
    settings: dict
    fixed: dict
    grids: list
    rows: list
    base_dir: Path
    max_points: int | None = None

    @property
    def name(self) -> str:
        return self.settings["name"]

    def canonical(self) -> dict:
        s = {k: v for k, v in self.settings.items() if k in ("seed", "dtype", "impossible", "exact")}
        return {"settings": s, "fixed": self.fixed, "grids": self.grids, "rows": self.rows,
                "max_points": self.max_points}

    @property
    def config_hash(self) -> str:
        text = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def load_sweep(source, *, max_points: int | None = None) -> SweepConfig:
    """Read and validate a sweep: a path to a TOML file, TOML text in a ``str`` with newlines, or a dict.

    Raises ``ValueError`` naming the file and the key for anything wrong in it.
    """
    if isinstance(source, SweepConfig):
        cfg = dataclasses.replace(source)
        if max_points is not None:
            cfg.max_points = max_points
        return cfg
    base = Path.cwd()
    if isinstance(source, Mapping):
        data, origin = dict(source), "<sweep dict>"
    elif isinstance(source, str) and "\n" in source:
        origin = "<sweep text>"
        try:
            data = tomllib.loads(source)
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"{origin}: not valid TOML: {e}") from None
    else:
        path = Path(source)
        origin = str(path)
        try:
            text = path.read_bytes().decode("utf-8-sig")
        except OSError as e:
            raise ValueError(f"cannot read sweep file {origin!r}: {e.strerror}") from None
        except UnicodeDecodeError:
            raise ValueError(f"{origin}: not UTF-8 text") from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"{origin}: not valid TOML: {e}") from None
        base = path.resolve().parent
    unknown = [k for k in data if k not in TABLES]
    if unknown:
        raise ValueError(f"{origin}: unknown table [{unknown[0]}].{_suggest(unknown[0], TABLES)} "
                         f"A sweep file has [sweep], [fixed], [grid] (or [[grid]]) and [[points]].")

    settings = {k: s.default for k, s in SETTINGS.items()}
    sw = data.get("sweep", {})
    if not isinstance(sw, Mapping):
        raise ValueError(f"{origin}: [sweep] must be a table of settings")
    for k, v in sw.items():
        if k not in SETTINGS:
            raise ValueError(f"{origin}: [sweep] unknown setting {k!r}.{_suggest(k, SETTINGS)} "
                             f"Known settings: {', '.join(SETTINGS)}")
        spec = SETTINGS[k]
        if spec.kind == "int" and v == 0 and k in ("block_size", "micro_batch"):
            settings[k] = 0
            continue
        settings[k] = _check_value(origin, "[sweep]", k, spec, v)
    if settings["name"] == "sweep" and origin.endswith(".toml"):
        settings["name"] = Path(origin).stem

    def check_key(where: str, k: str):
        if k not in KEYS:
            raise ValueError(f"{origin}: {where} unknown key {k!r}.{_suggest(k, KEYS)} Known keys: {', '.join(KEYS)}")

    fixed_raw = data.get("fixed", {})
    if not isinstance(fixed_raw, Mapping):
        raise ValueError(f"{origin}: [fixed] must be a table of key = value")
    fixed = {}
    for k, v in fixed_raw.items():
        check_key("[fixed]", k)
        if isinstance(v, (list, dict)):
            raise ValueError(f"{origin}: [fixed] {k}: expected a single value (put lists of values in [grid]), "
                             f"got {v!r}")
        fixed[k] = _check_value(origin, "[fixed]", k, KEYS[k], v)

    grid_raw = data.get("grid", [])
    grid_list = [grid_raw] if isinstance(grid_raw, Mapping) else grid_raw
    if not isinstance(grid_list, list):
        raise ValueError(f"{origin}: [grid] must be a table of key = [values] (or [[grid]] tables)")
    grids = []
    for gi, g in enumerate(grid_list):
        where = "[grid]" if isinstance(grid_raw, Mapping) else f"[[grid]] #{gi + 1}"
        if not isinstance(g, Mapping):
            raise ValueError(f"{origin}: {where} must be a table of key = [values]")
        if not g:
            raise ValueError(f"{origin}: {where} is empty; give at least one key = [values]")
        axes = {}
        for k, vals in g.items():
            check_key(where, k)
            if k in fixed:
                raise ValueError(f"{origin}: {where} {k}: also set in [fixed]; keep it in one place")
            if not isinstance(vals, list):
                raise ValueError(f"{origin}: {where} {k}: expected a list of values (put single values in "
                                 f"[fixed]), got {vals!r}")
            if not vals:
                raise ValueError(f"{origin}: {where} {k}: empty list; give at least one value")
            axes[k] = [_check_value(origin, where, k, KEYS[k], v) for v in vals]
        grids.append(axes)

    rows_raw = data.get("points", [])
    if not isinstance(rows_raw, list) or any(not isinstance(r, Mapping) for r in rows_raw):
        raise ValueError(f"{origin}: points must be written as [[points]] tables of key = value")
    rows = []
    for ri, r in enumerate(rows_raw):
        where = f"[[points]] #{ri + 1}"
        row = {}
        for k, v in r.items():
            check_key(where, k)
            if isinstance(v, (list, dict)):
                raise ValueError(f"{origin}: {where} {k}: expected a single value, got {v!r}")
            row[k] = _check_value(origin, where, k, KEYS[k], v)
        rows.append(row)
    if not grids and not rows:
        raise ValueError(f"{origin}: no points; add a [grid] table of key = [values] or [[points]] rows")
    if max_points is not None:
        max_points = api._positive_int("max_points", max_points)
    if settings["dtype"] == "float64":
        api._dtype("float64")
    cfg = SweepConfig(origin=origin, settings=settings, fixed=fixed, grids=grids, rows=rows, base_dir=base,
                      max_points=max_points)
    return cfg


# --------------------------------------------------------------------------- the point space


def _fmt(v) -> str:
    """Input value as CSV text (empty for None)."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        v = float(v)
        if v == 0 or not math.isfinite(v):
            return repr(v)
        if v.is_integer() and abs(v) < 1e7:
            return str(int(v))
        if abs(v) >= 1e7 or abs(v) < 1e-4:
            return np.format_float_scientific(v, trim="-", unique=True)
        return np.format_float_positional(v, trim="-", unique=True)
    return str(v)


class Space:
    """Every point of a sweep, addressed by a dense id (grids first, in file order, then rows).

    Nothing per point is stored: :meth:`codes` computes, for any ids, each key's
    index into that key's value table (mixed-radix decoding for grids).
    """

    def __init__(self, cfg: SweepConfig):
        self.cfg = cfg
        self.tables: dict[str, list] = {}
        self._index: dict[str, dict] = {}
        defaults = {k: (cfg.settings["seed"] if k == "seed" else s.default) for k, s in KEYS.items()}
        self.base_code = {}
        for k in KEYS:
            self.tables[k] = []
            self._index[k] = {}
            self.base_code[k] = self._code(k, cfg.fixed.get(k, defaults[k]))
        self.sources = []  # (kind, offset, size, payload)
        off = 0
        for g in cfg.grids:
            keys = list(g)
            axes = [np.array([self._code(k, v) for v in g[k]], np.int32) for k in keys]
            size = int(np.prod([len(a) for a in axes]))
            strides = [int(np.prod([len(a) for a in axes[j + 1:]])) for j in range(len(axes))]
            self.sources.append(("grid", off, size, (keys, axes, strides)))
            off += size
        if cfg.rows:
            keys = sorted({k for r in cfg.rows for k in r})
            cols = {k: np.array([self._code(k, r[k]) if k in r else self.base_code[k] for r in cfg.rows], np.int32)
                    for k in keys}
            self.sources.append(("rows", off, len(cfg.rows), cols))
            off += len(cfg.rows)
        self.total = off
        self.size = off if cfg.max_points is None else min(off, cfg.max_points)
        self.str_tables = {k: np.array([_fmt(v) for v in t], dtype=object) for k, t in self.tables.items()}

    def _code(self, k: str, v) -> int:
        idx = self._index[k]
        key = (type(v).__name__, v)
        if key not in idx:
            idx[key] = len(self.tables[k])
            self.tables[k].append(v)
        return idx[key]

    def codes(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        """``{key: int32[len(ids)]}`` value-table index of every key at every id."""
        ids = np.asarray(ids, np.int64)
        out = {k: np.full(len(ids), c, np.int32) for k, c in self.base_code.items()}
        for kind, off, size, payload in self.sources:
            sel = (ids >= off) & (ids < off + size)
            if not sel.any():
                continue
            local = ids[sel] - off
            if kind == "grid":
                keys, axes, strides = payload
                for k, a, st in zip(keys, axes, strides):
                    out[k][sel] = a[(local // st) % len(a)]
            else:
                for k, col in payload.items():
                    out[k][sel] = col[local]
        return out

    def values(self, key: str, codes: np.ndarray, fill=np.nan, dtype=np.float64) -> np.ndarray:
        """Numeric values of a key (``fill`` where the value is None or not numeric)."""
        t = np.array([fill if (v is None or isinstance(v, str)) else v for v in self.tables[key]], dtype=dtype)
        return t[codes]

    def point(self, i: int) -> dict:
        """The input values of point ``i`` (a dict; None = inherited from the hardware)."""
        c = self.codes(np.array([i]))
        return {k: self.tables[k][int(c[k][0])] for k in KEYS}


# --------------------------------------------------------------------------- resolution (host side, vectorised)


def _unique_rows(cols: list[np.ndarray]):
    """Unique rows of the columns (lexicographic order) and the row index of every element.

    Each column is first reduced to dense codes, which are combined into one int64
    key (mixed radix), so only 1-D sorts run (``np.unique(axis=0)`` is much slower).
    """
    n = len(cols[0])
    key = np.zeros(n, np.int64)
    uvals = []
    radix = 1
    for col in cols:
        u, inv = np.unique(np.asarray(col), return_inverse=True)
        uvals.append(u)
        radix *= max(len(u), 1)
        if radix >= 1 << 62:   # too many combinations for one key: fall back
            m = np.stack([np.asarray(c, np.float64) for c in cols], axis=1)
            uniq, inv = np.unique(m, axis=0, return_inverse=True)
            return uniq, inv.reshape(-1)
        key = key * max(len(u), 1) + inv.reshape(-1)
    ukey, inv = np.unique(key, return_inverse=True)
    rows = []
    rest = ukey
    for u in reversed(uvals):
        size = max(len(u), 1)
        rows.append(u[rest % size])
        rest = rest // size
    rows.reverse()
    if not n:
        return np.zeros((0, len(cols))), inv.reshape(-1)
    ints = all(np.issubdtype(r.dtype, np.integer) or r.dtype == bool for r in rows)
    uniq = np.stack([r.astype(np.int64 if ints else np.float64) for r in rows], axis=1)
    return uniq, inv.reshape(-1)


def _bucket_arr(x: np.ndarray, minimum: int = 4) -> np.ndarray:
    x = np.maximum(np.asarray(x, np.int64), minimum)
    return (1 << np.ceil(np.log2(x)).astype(np.int64)).astype(np.int64)


REASONS = ("", "stages>dies", "stages>layers", "chunks>seq_len", "granularity", "weights", "p1>p2",
           "gpipe-load-microbatch", "serial-batch", "serial-stages")


@dataclass
class Resolved:
    """Per-point derived quantities of a set of ids (arrays over those ids)."""

    ids: np.ndarray
    codes: dict
    hw_specs: list           # HardwareSpec per unique hardware combination
    hw_inv: np.ndarray       # index into hw_specs per point
    models: list             # ModelSpec per model code
    stages: np.ndarray       # N per point
    scheme: np.ndarray       # scheme strings (object)
    reason: np.ndarray       # int code into REASONS


class Resolver:
    """Turns value codes into specs, stage counts, impossibility reasons and bucket keys (cached)."""

    def __init__(self, space: Space):
        self.space = space
        self.cfg = space.cfg
        self._hw: dict[tuple, HardwareSpec] = {}
        self._weights: dict[tuple, float] = {}
        self.models = [self._model(v) for v in space.tables["model"]]
        self.hardware_bases = [self._hardware(v) for v in space.tables["hardware"]]

    def _path(self, v: str) -> str:
        p = Path(v)
        if p.suffix.lower() in (".json", ".toml") and not p.is_absolute():
            cand = self.cfg.base_dir / p
            if cand.exists():
                return str(cand)
        return v

    def _model(self, v: str) -> ModelSpec:
        try:
            return get_model(self._path(v))
        except ValueError as e:
            raise ValueError(f"{self.cfg.origin}: model: {e}") from None

    def _hardware(self, v: str) -> HardwareSpec:
        try:
            return get_hardware(self._path(v))
        except ValueError as e:
            raise ValueError(f"{self.cfg.origin}: hardware: {e}") from None

    HW_KEYS = ("hardware", "rows", "cols", "wafers") + DIE_FIELDS

    def hw_spec(self, row: tuple) -> HardwareSpec:
        """Resolved hardware of one combination of the codes of ``HW_KEYS``."""
        spec = self._hw.get(row)
        if spec is not None:
            return spec
        t = self.space.tables
        base = self.hardware_bases[row[0]]
        rows, cols, wafers = (t[k][c] for k, c in zip(("rows", "cols", "wafers"), row[1:4]))
        geo = {}
        if rows is not None or cols is not None or wafers is not None:
            r = rows if rows is not None else base.rows
            c = cols if cols is not None else base.cols
            w = wafers if wafers is not None else base.wafers
            geo = dict(rows=r, cols=c, wafers=w)
            if base.name.startswith("mocap-"):
                geo["name"] = f"mocap-{r}x{c}" + (f"x{w}w" if w > 1 else "")
            else:
                geo["name"] = f"{base.name}-{r}x{c}" + (f"x{w}w" if w > 1 else "")
        die = {f: t[f][c] for f, c in zip(DIE_FIELDS, row[4:]) if t[f][c] is not None}
        try:
            spec = base.replace(**geo, **die)
        except SpecError as e:
            raise ValueError(f"{self.cfg.origin}: hardware: {e}") from None
        self._hw[row] = spec
        return spec

    def resolve(self, ids: np.ndarray) -> Resolved:
        sp = self.space
        c = sp.codes(ids)
        t = sp.tables
        uniq, hw_inv = _unique_rows([c[k] for k in self.HW_KEYS])
        specs = [self.hw_spec(tuple(int(x) for x in row)) for row in uniq]
        dies = np.array([s.num_dies for s in specs], np.int64)[hw_inv]
        st = sp.values("stages", c["stages"], fill=-1, dtype=np.int64)
        stages = np.where(st < 0, dies, st)
        scheme = np.array(t["scheme"], dtype=object)[c["scheme"]]
        layers = np.array([m.layers for m in self.models], np.int64)[c["model"]]
        seq = sp.values("seq_len", c["seq_len"], dtype=np.int64)
        chunks = sp.values("chunks", c["chunks"], dtype=np.int64)
        gran = sp.values("granularity", c["granularity"], dtype=np.int64)
        p1 = sp.values("p1", c["p1"])
        p2 = sp.values("p2", c["p2"])
        auto = np.array([v == "auto" for v in t["batch"]], bool)[c["batch"]]
        has_load = np.array([v is not None for v in t["load"]], bool)[c["load"]]
        micro = sp.values("microbatch", c["microbatch"], dtype=np.int64)
        serial = np.isin(scheme, SERIAL_SCHEMES)
        chunked = np.isin(scheme, ("terapipe", "mbkr"))
        reason = np.zeros(len(ids), np.int8)

        def mark(mask, code):
            sel = mask & (reason == 0)
            reason[sel] = REASONS.index(code)

        stages_given = np.array([v is not None for v in t["stages"]], bool)[c["stages"]]
        mark(serial & ~auto, "serial-batch")
        mark((serial | auto) & stages_given, "serial-stages")
        mark(stages > dies, "stages>dies")
        mark(stages > layers, "stages>layers")
        mark(chunked & (chunks > seq), "chunks>seq_len")
        bad_g = serial & ((seq % gran != 0) | ((scheme != "terapipe-dp") & (chunks * gran > seq)))
        mark(bad_g, "granularity")
        mark((scheme == "gpipe") & has_load & (micro != 1), "gpipe-load-microbatch")
        mark(p1 > p2, "p1>p2")
        # weights: per unique (model, hardware combination, stages)
        ok = reason == 0
        if ok.any():
            u, inv = _unique_rows([c["model"][ok], hw_inv[ok], stages[ok]])
            over = np.zeros(len(u), bool)
            for j, (mc, hi, n) in enumerate(u):
                spec = specs[hi]
                key = (int(mc), spec, int(n))
                if key not in self._weights:
                    mp = ModelParams.from_spec(self.models[mc], np.float64)
                    hp = HardwareParams.from_spec(spec, np.float64)
                    w = costs.stage_weight_bytes(mp, hp, int(n), int(n), xp=np)
                    self._weights[key] = float(np.max(w)) - spec.hbm_capacity * spec.usable_hbm_fraction
                over[j] = self._weights[key] > 0
            full = np.zeros(len(ids), bool)
            full[ok] = over[inv]
            mark(full, "weights")
        return Resolved(ids=np.asarray(ids, np.int64), codes=c, hw_specs=specs, hw_inv=hw_inv, models=self.models,
                        stages=stages, scheme=scheme, reason=reason)

    def explain(self, r: Resolved, j: int) -> str:
        """One-line message for the impossible point ``r.ids[j]``, naming the keys."""
        sp = self.space
        t = sp.tables
        c = {k: int(v[j]) for k, v in r.codes.items()}
        code = REASONS[int(r.reason[j])]
        hw = r.hw_specs[int(r.hw_inv[j])]
        m = self.models[c["model"]]
        n = int(r.stages[j])
        S, M, g = t["seq_len"][c["seq_len"]], t["chunks"][c["chunks"]], t["granularity"][c["granularity"]]
        scheme = t["scheme"][c["scheme"]]
        if code == "stages>dies":
            msg = f"stages = {n} is more than the {hw.num_dies} dies of hardware {hw.name}; use fewer stages or a larger mesh"
        elif code == "stages>layers":
            msg = (f"model {m.name} has {m.layers} layers, fewer than the {n} pipeline stages of hardware {hw.name}; "
                   f"use a smaller mesh (rows/cols) or set stages <= {m.layers}")
        elif code == "chunks>seq_len":
            msg = f"chunks = {M} is more than seq_len = {S} tokens; use fewer chunks or longer sequences"
        elif code == "granularity":
            if S % g:
                msg = f"granularity = {g} does not divide seq_len = {S} (scheme {scheme}); choose g dividing every seq_len"
            else:
                msg = f"chunks = {M} chunks of granularity = {g} tokens need seq_len >= {M * g}, but seq_len = {S} (scheme {scheme})"
        elif code == "weights":
            mp = ModelParams.from_spec(m, np.float64)
            hp = HardwareParams.from_spec(hw, np.float64)
            w = float(np.max(costs.stage_weight_bytes(mp, hp, n, n, xp=np)))
            usable = hw.hbm_capacity * hw.usable_hbm_fraction
            msg = (f"model {m.name} does not fit hardware {hw.name}: a stage needs {w / 1e9:.1f} GB of weights but a "
                   f"die has {usable / 1e9:.1f} GB usable (hbm_capacity x usable_hbm_fraction); use a larger mesh or "
                   f"a smaller model")
        elif code == "p1>p2":
            msg = f"p1 = {t['p1'][c['p1']]} is above p2 = {t['p2'][c['p2']]}; MBKR needs p1 <= p2"
        elif code == "gpipe-load-microbatch":
            msg = "scheme gpipe with a load (end-to-end latency) needs microbatch = 1"
        elif code == "serial-batch":
            msg = (f"scheme {scheme} always runs at its largest feasible batch: set batch = \"auto\" for it "
                   f"(use a separate [[grid]] table for the slow schemes)")
        elif code == "serial-stages":
            msg = (f"scheme {scheme} (or batch = \"auto\") runs through compare.evaluate_scheme, which uses every "
                   f"die: stages cannot be set for it")
        else:
            msg = code
        return msg

    def bucket_keys(self, r: Resolved) -> tuple[list[tuple], np.ndarray]:
        """Distinct bucket keys and each point's index into them.

        A key is ``("fast", kind, k_pad, n_pad, num_batches, mbkr mode, requests, synchronous)``,
        ``("serial",)`` or ``("impossible",)``.
        """
        sp = self.space
        c = r.codes
        t = sp.tables
        P = len(r.ids)
        auto = np.array([v == "auto" for v in t["batch"]], bool)[c["batch"]]
        serial = np.isin(r.scheme, SERIAL_SCHEMES) | auto
        gp = r.scheme == "gpipe"
        batch = sp.values("batch", c["batch"], fill=1, dtype=np.int64)
        micro = sp.values("microbatch", c["microbatch"], dtype=np.int64)
        chunks = sp.values("chunks", c["chunks"], dtype=np.int64)
        items = np.where(gp, -(-batch // micro), chunks)
        k_pad = _bucket_arr(items)
        n_pad = _bucket_arr(r.stages)
        nb = sp.values("num_batches", c["num_batches"], dtype=np.int64)
        dyn = np.array([v == "dynamic" for v in t["pairing"]], bool)[c["pairing"]]
        mode = np.where(r.scheme == "mbkr", np.where(dyn, 2, 1), 0)
        has_load = np.array([v is not None for v in t["load"]], bool)[c["load"]]
        R = np.where(has_load, sp.values("requests", c["requests"], dtype=np.int64), 0)
        sync = np.where(has_load, np.array([v == "synchronous" for v in t["admission"]], bool)[c["admission"]], False)
        kind = np.where(r.reason > 0, 2, np.where(serial, 1, 0))
        u, inv = _unique_rows([kind, gp.astype(np.int64), k_pad, n_pad, nb, mode, R, sync.astype(np.int64)])
        keys = []
        for row in u:
            kd, g, kp, npad, b, md, rr, sy = (int(x) for x in row)
            if kd == 2:
                keys.append(("impossible",))
            elif kd == 1:
                keys.append(("serial",))
            else:
                keys.append(("fast", "gpipe" if g else "chunked", kp, npad, b, ("off", "static", "dynamic")[md], rr,
                             bool(sy)))
        return keys, inv


# --------------------------------------------------------------------------- plan


@dataclass
class Bucket:
    index: int
    key: tuple
    points: int = 0

    @property
    def kind(self) -> str:
        return self.key[0]

    def label(self) -> str:
        if self.kind != "fast":
            return self.kind
        _, kind, kp, npad, nb, mode, R, sync = self.key
        s = f"{kind} K{kp} N{npad} nb{nb} mbkr={mode}"
        return s + (f" serving R{R}{' sync' if sync else ''}" if R else "")


WINDOW = 1 << 16


class Plan:
    """Validated points grouped into buckets, and the deterministic sequence of blocks."""

    def __init__(self, cfg: SweepConfig, block_size: int, serial_block_size: int):
        self.cfg = cfg
        self.space = Space(cfg)
        self.resolver = Resolver(self.space)
        self.block_size = block_size
        self.serial_block_size = serial_block_size
        self.buckets: dict[tuple, Bucket] = {}
        impossible_error = cfg.settings["impossible"] == "error"
        for lo in range(0, self.space.size, WINDOW):
            ids = np.arange(lo, min(lo + WINDOW, self.space.size))
            r = self.resolver.resolve(ids)
            bad = np.nonzero(r.reason > 0)[0]
            if impossible_error and len(bad):
                j = int(bad[0])
                pt = self.space.point(int(ids[j]))
                given = set(cfg.fixed).union(*[set(g) for g in cfg.grids], *[set(r) for r in cfg.rows])
                shown = {k: v for k, v in pt.items() if k in given}
                raise ValueError(f"{cfg.origin}: impossible combination at point {int(ids[j])} "
                                 f"({', '.join(f'{k}={v}' for k, v in shown.items())}): {self.resolver.explain(r, j)}. "
                                 f"(Or set impossible = \"infeasible\" in [sweep] to record such points as infeasible rows.)")
            keys, inv = self.resolver.bucket_keys(r)
            counts = np.bincount(inv, minlength=len(keys))
            for j in np.argsort([int(np.argmax(inv == q)) for q in range(len(keys))], kind="stable"):
                k = keys[j]   # buckets are numbered in order of their first point
                b = self.buckets.get(k)
                if b is None:
                    b = self.buckets[k] = Bucket(len(self.buckets), k)
                b.points += int(counts[j])

    @property
    def points(self) -> int:
        return self.space.size

    def block_cap(self, b: Bucket) -> int:
        return self.serial_block_size if b.kind == "serial" else self.block_size

    def num_blocks(self) -> int:
        return sum(-(-b.points // self.block_cap(b)) for b in self.buckets.values())

    def blocks(self) -> Iterator[tuple[Bucket, int, np.ndarray]]:
        """Yield ``(bucket, block number, ids)`` in a fixed order (ids ascending inside a block)."""
        by_index = sorted(self.buckets.values(), key=lambda b: b.index)
        pending: dict[int, list] = {b.index: [] for b in by_index}
        counts = {b.index: 0 for b in by_index}
        done = {b.index: 0 for b in by_index}
        for lo in range(0, self.space.size, WINDOW):
            ids = np.arange(lo, min(lo + WINDOW, self.space.size))
            keys, inv = self.resolver.bucket_keys(self.resolver.resolve(ids))
            bidx = np.array([self.buckets[k].index for k in keys], np.int64)[inv]
            for b in by_index:
                sel = ids[bidx == b.index]
                if not len(sel):
                    continue
                pending[b.index].append(sel)
                counts[b.index] += len(sel)
                cap = self.block_cap(b)
                while counts[b.index] >= cap:
                    allids = np.concatenate(pending[b.index])
                    yield b, done[b.index], allids[:cap]
                    done[b.index] += 1
                    pending[b.index] = [allids[cap:]]
                    counts[b.index] -= cap
        for b in by_index:
            if counts[b.index]:
                yield b, done[b.index], np.concatenate(pending[b.index])
                done[b.index] += 1


# --------------------------------------------------------------------------- block inputs


class TemplateCache:
    """Host-side pieces of ``Point`` that depend only on a few inputs (cached per sweep)."""

    def __init__(self, dtype):
        self.dtype = dtype
        self._model: dict = {}
        self._hw: dict = {}
        self._route: dict = {}
        self._arrivals: dict = {}

    def model(self, m: ModelSpec) -> ModelParams:
        if m not in self._model:
            self._model[m] = ModelParams.from_spec(m, self.dtype)
        return self._model[m]

    def hardware(self, h: HardwareSpec) -> HardwareParams:
        if h not in self._hw:
            self._hw[h] = HardwareParams.from_spec(h, self.dtype)
        return self._hw[h]

    def route(self, hw: HardwareSpec, n: int, n_pad: int, placement: str, scheme: str, pairing: str, mode: str):
        """``(num_stages, handoff_hops, handoff_bandwidth, pairing code, stage_hops, stage_bandwidth)`` as in api._point."""
        geo = (hw.rows, hw.cols, hw.wafers, hw.topology, hw.link_bandwidth, hw.cross_wafer_bandwidth)
        key = (geo, n, n_pad, placement, scheme, pairing, mode)
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
            pl = api.searched_placement(gs, n, pairing)
        else:
            pl = api.check_placement(g, "snake", n)
        dt = self.dtype
        mb = api.mbkr_params(g, pl, n_pad, api.MBKRConfig(pairing=pairing), mode, dt)
        layout = StageLayout.from_placement(g, pl, n_pad, dt)
        _, handoff_bw = pair_routes(g, pl, None, n_pad, dt)
        shared = np.ones(n_pad, dt)
        shared[: n - 1] = handoff_bw[np.arange(n - 1), np.arange(1, n)]
        hit = (np.asarray(layout.num_stages), np.asarray(layout.handoff_hops), shared, np.asarray(mb.pairing),
               np.asarray(mb.stage_hops), np.asarray(mb.stage_bandwidth))
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


def build_fast_inputs(plan: Plan, bucket: Bucket, r: Resolved, cache: TemplateCache, size: int):
    """Point pytree and serving extras of one block, padded to ``size`` rows (NumPy)."""
    sp = plan.space
    t = sp.tables
    c = r.codes
    _, kind, k_pad, n_pad, nb, mode, R, sync = bucket.key
    dt = cache.dtype
    P = len(r.ids)
    pad = np.concatenate([np.arange(P), np.full(size - P, P - 1, np.int64)])

    def col(key, dtype=np.int64, fill=np.nan):
        return sp.values(key, c[key], fill=fill, dtype=dtype)[pad]

    seq = col("seq_len")
    batch = col("batch", fill=1)
    k = np.arange(k_pad)[None, :]
    if kind == "gpipe":
        micro = col("microbatch")
        requests = np.clip(batch[:, None] - k * micro[:, None], 0, micro[:, None])
        valid = requests > 0
        items = ItemTable(tokens=np.where(valid, seq[:, None], 0).astype(np.int32),
                          prefix=np.zeros((size, k_pad), np.int32), requests=requests.astype(np.int32), last=valid,
                          valid=valid, group_last=np.broadcast_to(k, (size, k_pad)).astype(np.int32))
        part_pad = np.zeros((size, k_pad), np.int32)
    else:
        M = col("chunks")
        base, extra = np.divmod(seq, M)
        valid = k < M[:, None]
        tokens = np.where(valid, base[:, None] + (k < extra[:, None]), 0)
        prefix = np.cumsum(tokens, 1) - tokens
        items = ItemTable(tokens=tokens.astype(np.int32), prefix=prefix.astype(np.int32),
                          requests=np.where(valid, batch[:, None], 0).astype(np.int32),
                          last=k == (M - 1)[:, None], valid=valid,
                          group_last=np.broadcast_to((M - 1)[:, None], (size, k_pad)).astype(np.int32))
        part_pad = tokens.astype(np.int32)
    model = _gather([cache.model(m) for m in r.models], c["model"][pad])
    hardware = _gather([cache.hardware(h) for h in r.hw_specs], r.hw_inv[pad])
    # routes: per unique (hardware combination, stages, placement, scheme, pairing)
    u, inv = _unique_rows([r.hw_inv[pad], r.stages[pad], c["placement"][pad], c["scheme"][pad], c["pairing"][pad]])
    routes = [cache.route(r.hw_specs[h], int(n), n_pad, t["placement"][pl], t["scheme"][s], t["pairing"][pa], mode)
              for h, n, pl, s, pa in u]
    num_stages, hhops, hbw, pcode, shops, sbw = (np.stack([x[i] for x in routes])[inv] for i in range(6))
    layout = StageLayout.single_die(num_stages, hhops, hbw)
    mb = MBKRParams(p1=col("p1", np.float64).astype(dt), p2=col("p2", np.float64).astype(dt),
                    read_overlap=col("read_overlap", np.float64).astype(dt), pairing=pcode, stage_hops=shops,
                    stage_bandwidth=sbw)
    sync_arr = np.array([v == "synchronous" for v in t["admission"]], bool)[c["admission"][pad]]
    rel = np.array([v == "request" for v in t["release"]], bool)[c["release"][pad]]
    point = Point(items=items, model=model, hardware=hardware, layout=layout, synchronous=sync_arr,
                  release_request=rel, mbkr=mb)
    extra = {}
    if R:
        loads = col("load", np.float64)
        seeds = col("seed")
        kinds = c["arrivals"][pad]
        u, inv = _unique_rows([kinds.astype(np.float64), loads, seeds.astype(np.float64)])
        arr = [cache.arrivals(t["arrivals"][int(kd)], float(ld), R, int(sd)) for kd, ld, sd in u]
        extra = {"partition": part_pad, "seq_len": seq.astype(np.int32), "batch": batch.astype(np.int32),
                 "arrivals": np.stack(arr)[inv]}
    return point, extra


# --------------------------------------------------------------------------- the compiled block program

_COMPILED: dict = {}
STATS = {"compiles": 0, "traces": 0}


def _lean_one(point: Point, extra: dict, shape: SimShape, sshape: ServingShape | None) -> dict:
    """Scalar summaries of one point (what a sweep row needs; no item-level arrays leave the device)."""
    STATS["traces"] += 1
    o = evaluate(point, shape)
    live = jnp.arange(shape.n_pad) < point.layout.num_stages
    mx = lambda a: jnp.max(jnp.where(live, a, 0.0))
    r = dict(prefill_latency_s=o["prefill_latency_s"], raw_latency_s=o["raw_latency_s"], feasible=o["feasible"],
             throughput_rps=o["throughput_rps"], period_s=o["period_s"], bubble_fraction=o["bubble_fraction"],
             max_peak_mem_bytes=mx(o["peak_mem_bytes_per_stage"]), max_kv_peak_bytes=mx(o["kv_peak_bytes_per_stage"]),
             max_workspace_bytes=mx(o["workspace_bytes_per_stage"]),
             max_stage_weight_bytes=mx(o["weight_bytes_per_stage"]),
             usable_hbm_bytes=o["capacity_bytes"], max_stage_utilisation=mx(o["stage_utilisation"]))
    if shape.mbkr != "off":
        r.update({k: o[k] for k in MBKR_OUTPUTS})
    if sshape is not None:
        dt = point.model.hidden.dtype
        mbx = o["mbkr_extra_times"][0] if shape.mbkr != "off" else jnp.zeros((shape.k_pad, shape.n_pad), dt)
        e = e2e_latency(point, extra["partition"], extra["seq_len"], extra["batch"], extra["arrivals"], mbx, sshape)
        ok = o["feasible"]
        inf = jnp.asarray(jnp.inf, dt)
        r.update(e2e_mean_s=jnp.where(ok, e["mean_s"], inf), e2e_p50_s=jnp.where(ok, e["p50_s"], inf),
                 e2e_p99_s=jnp.where(ok, e["p99_s"], inf),
                 load_throughput_rps=jnp.where(ok, e["throughput_rps"], 0.0).astype(dt))
    return r


def _program(shape: SimShape, sshape, micro: int, mesh):
    from jax.sharding import PartitionSpec

    def local(points, extra):
        n = jax.tree_util.tree_leaves(points)[0].shape[0]
        split = lambda a: a.reshape((n // micro, micro) + a.shape[1:])
        xs = jax.tree_util.tree_map(split, (points, extra))
        out = jax.lax.map(jax.vmap(lambda pe: _lean_one(pe[0], pe[1], shape, sshape)), xs)
        return jax.tree_util.tree_map(lambda a: a.reshape((n,) + a.shape[2:]), out)

    spec = PartitionSpec("points")
    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False))


def _compiled(shape, sshape, micro, mesh, args, exact: bool):
    """AOT-compiled block program, cached per (shapes, devices, options) for the life of the process."""
    leaves = jax.tree_util.tree_leaves(args)
    sig = tuple((l.shape, str(l.dtype)) for l in leaves)
    key = (shape, sshape, micro, tuple(d.id for d in mesh.devices.flat), exact, sig)
    hit = _COMPILED.get(key)
    if hit is not None:
        return hit, 0.0
    t0 = time.perf_counter()
    opts = {"xla_disable_hlo_passes": "algsimp"} if exact else None
    c = _program(shape, sshape, micro, mesh).lower(*args).compile(compiler_options=opts)
    STATS["compiles"] += 1
    _COMPILED[key] = c
    return c, time.perf_counter() - t0


# --------------------------------------------------------------------------- rows


def _f32str(a: np.ndarray) -> np.ndarray:
    return np.asarray(a).astype(str).astype(object)


def _input_columns(plan: Plan, r: Resolved, P: int) -> dict[str, np.ndarray]:
    sp = plan.space
    c = r.codes
    cols = {}
    for k in INPUT_COLUMNS:
        if k in DIE_FIELDS:
            cols[k] = np.array([_fmt(getattr(h, k)) for h in r.hw_specs], dtype=object)[r.hw_inv]
        elif k in ("rows", "cols", "wafers"):
            cols[k] = np.array([_fmt(getattr(h, k)) for h in r.hw_specs], dtype=object)[r.hw_inv]
        elif k == "hardware":
            cols[k] = np.array([h.name for h in r.hw_specs], dtype=object)[r.hw_inv]
        elif k == "model":
            cols[k] = np.array([m.name for m in r.models], dtype=object)[c["model"]]
        elif k == "stages":
            cols[k] = r.stages.astype(str).astype(object)
        else:
            cols[k] = sp.str_tables[k][c[k]]
    return cols


def _needs_quoting(values) -> bool:
    return any(("," in v) or ('"' in v) or ("\n" in v) for v in values)


def _write_part(path: Path, plan: Plan, r: Resolved, outputs: dict[str, np.ndarray], prov: dict, bucket: Bucket):
    P = len(r.ids)
    cols = {"point_id": r.ids.astype(str).astype(object)}
    cols.update(_input_columns(plan, r, P))
    for k in OUTPUT_COLUMNS:
        cols[k] = outputs.get(k, np.full(P, "", dtype=object))
    for k in PROVENANCE_COLUMNS:
        cols[k] = np.full(P, str(prov[k] if k != "bucket" else bucket.index), dtype=object)
    ordered = [cols[k] for k in COLUMNS]
    if _needs_quoting(set(cols["model"]) | set(cols["hardware"]) | set(cols["reason"])):
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(zip(*ordered))
        text = buf.getvalue()
    else:   # nothing to quote: plain joins are several times faster than the csv module
        text = "\n".join([",".join(row) for row in zip(*ordered)]) + "\n"
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "w", newline="") as fh:
        fh.write(text)
    os.replace(tmp, path)


def _fast_outputs(raw: dict, r: Resolved, bucket: Bucket, plan: Plan) -> dict[str, np.ndarray]:
    P = len(r.ids)
    out = {}
    feas = np.asarray(raw["feasible"])[:P].astype(bool)
    out["feasible"] = np.where(feas, "true", "false").astype(object)
    out["reason"] = np.where(feas, "", "memory").astype(object)
    for k in ("prefill_latency_s", "raw_latency_s", "throughput_rps", "period_s", "bubble_fraction",
              "max_peak_mem_bytes", "max_kv_peak_bytes", "max_workspace_bytes", "max_stage_weight_bytes",
              "usable_hbm_bytes", "max_stage_utilisation"):
        out[k] = _f32str(np.asarray(raw[k])[:P])
    c = r.codes
    out["batch_used"] = plan.space.str_tables["batch"][c["batch"]]
    for k in MBKR_OUTPUTS:
        out[k] = _f32str(np.asarray(raw[k])[:P]) if k in raw else np.full(P, "0", dtype=object)
    if "e2e_mean_s" in raw:
        out["load_rps"] = plan.space.str_tables["load"][c["load"]]
        for k in ("e2e_mean_s", "e2e_p50_s", "e2e_p99_s", "load_throughput_rps"):
            out[k] = _f32str(np.asarray(raw[k])[:P])
    return out


def _impossible_outputs(r: Resolved) -> dict[str, np.ndarray]:
    P = len(r.ids)
    out = {"feasible": np.full(P, "false", dtype=object),
           "reason": np.array(REASONS, dtype=object)[r.reason.astype(np.int64)]}
    for k in ("prefill_latency_s", "raw_latency_s"):
        out[k] = np.full(P, "inf", dtype=object)
    out["throughput_rps"] = np.full(P, "0.0", dtype=object)
    return out


def _serial_outputs(plan: Plan, r: Resolved, dtype: str) -> dict[str, np.ndarray]:
    from . import compare

    sp = plan.space
    t = sp.tables
    rows = []
    for j in range(len(r.ids)):
        c = {k: int(v[j]) for k, v in r.codes.items()}
        v = {k: t[k][c[k]] for k in KEYS}
        hw = r.hw_specs[int(r.hw_inv[j])]
        m = r.models[c["model"]]
        mb = api.MBKRConfig(v["pairing"], v["p1"], v["p2"], v["read_overlap"])
        settings = compare.PlanSettings(chunks=v["chunks"], granularity=v["granularity"], chains=v["chains"],
                                        steps=v["steps"], objective=v["objective"], seed=v["seed"])
        res = compare.evaluate_scheme(m, hw, v["seq_len"], v["scheme"], load=v["load"], chunks=v["chunks"],
                                      granularity=v["granularity"], arrivals=v["arrivals"], requests=v["requests"],
                                      release=v["release"], admission=v["admission"], num_batches=v["num_batches"],
                                      mbkr=mb, settings=settings, dtype=dtype, seed=v["seed"],
                                      max_batch=v["max_batch"], with_max_seq=False)
        ex = res.extra
        rows.append({
            "feasible": "true" if res.feasible else "false", "reason": "" if res.feasible else "memory",
            "prefill_latency_s": _fmt(res.prefill_latency_s), "throughput_rps": _fmt(res.throughput_rps),
            "bubble_fraction": _fmt(res.bubble_fraction), "batch_used": str(res.batch),
            "max_stage_utilisation": _fmt(max(res.stage_utilisation) if res.stage_utilisation else 0.0),
            **{k: _fmt(ex.get(k, 0.0)) for k in ("spilled_bytes", "remote_read_s", "blocking_s")},
            "load_rps": _fmt(ex.get("load_rps")), "e2e_mean_s": _fmt(res.e2e_latency_mean_s),
            "e2e_p50_s": _fmt(res.e2e_latency_p50_s), "e2e_p99_s": _fmt(res.e2e_latency_p99_s),
            "load_throughput_rps": _fmt(res.load_throughput_rps),
            "partition": "-".join(str(int(x)) for x in res.partition),
        })
    return {k: np.array([row.get(k, "") for row in rows], dtype=object) for k in OUTPUT_COLUMNS}


# --------------------------------------------------------------------------- running


@dataclass
class SweepSummary:
    """What a sweep run did (times in seconds)."""

    name: str
    out_dir: str
    results: str | None
    points: int
    evaluated: int
    skipped: int
    feasible: int | None
    buckets: int
    blocks: int
    blocks_done: int
    compiles: int
    compile_s: float
    wall_s: float
    devices: int
    device_kind: str
    block_size: int
    micro_batch: int
    config_hash: str
    complete: bool
    bucket_labels: list = field(default_factory=list)

    @property
    def points_per_s(self) -> float:
        return self.evaluated / self.wall_s if self.wall_s > 0 else 0.0

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["points_per_s"] = self.points_per_s
        d["feasible_share"] = (self.feasible / self.points) if (self.feasible is not None and self.points) else None
        return d


def maybe_init_distributed() -> None:
    """``jax.distributed.initialize`` when the multi-host environment variables are set (see module doc)."""
    addr = os.environ.get("JAX_COORDINATOR_ADDRESS")
    nproc = os.environ.get("JAX_NUM_PROCESSES")
    pid = os.environ.get("JAX_PROCESS_ID")
    if addr and nproc and pid and not jax.distributed.is_initialized():
        jax.distributed.initialize(coordinator_address=addr, num_processes=int(nproc), process_id=int(pid))


def _devices(devices) -> list:
    local = jax.local_devices()
    if devices is None:
        return local
    if isinstance(devices, (int, np.integer)) and not isinstance(devices, bool):
        if not 1 <= devices <= len(local):
            raise ValueError(f"devices={devices}: this process has {len(local)} local devices")
        return local[: int(devices)]
    devices = list(devices)
    if not devices:
        raise ValueError("devices must name at least one device")
    return devices


def _part_name(cfg_hash: str, plan: Plan, b: Bucket, block: int, micro: int) -> str:
    h = hashlib.sha256(json.dumps([cfg_hash, plan.block_size, plan.serial_block_size, micro, __version__,
                                   list(b.key), block]).encode()).hexdigest()[:12]
    return f"b{b.index:03d}-{block:06d}-{h}.csv"


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def run_sweep(source, out_dir=None, *, resume: bool = False, devices=None, block_size: int | None = None,
              quiet: bool = False, limit: int | None = None, max_points: int | None = None,
              overwrite: bool = False, micro_batch: int | None = None) -> SweepSummary:
    """Run a sweep file (path, TOML text or dict) and write ``OUT/results.csv``.

    Args:
      source: sweep file path, TOML text, dict or :class:`SweepConfig`.
      out_dir: output directory (default ``sweep-results/<name>``).
      resume: skip blocks already written by an earlier (interrupted) run of the same sweep.
      devices: None (every local device), a count (the first n), or a list of devices.
      block_size: points per compiled call (default from the file, else 4096 on CPU / 32768 otherwise).
      quiet: no progress bar.
      limit: stop after about this many newly evaluated points (whole blocks); resume later.
      max_points: only the first ``max_points`` points of the sweep (changes the config hash).
      overwrite: delete an earlier run's files in ``out_dir`` first.
      micro_batch: points per vectorised step (default from the file, else 64 on CPU / 4096 otherwise).

    Returns:
      :class:`SweepSummary`.  ``results`` is None while the sweep is incomplete (``limit``).
    """
    t_start = time.perf_counter()
    maybe_init_distributed()
    cfg = load_sweep(source, max_points=max_points)
    devs = _devices(devices)
    nd = len(devs)
    platform = devs[0].platform
    bs = block_size or cfg.settings["block_size"] or (4096 if platform == "cpu" else 32768)
    bs = api._positive_int("block_size", bs)
    mb_set = micro_batch or cfg.settings["micro_batch"]
    if limit is not None:
        limit = api._positive_int("limit", limit)
    dtype = np.dtype(cfg.settings["dtype"])
    api._dtype(dtype)
    plan = Plan(cfg, bs, cfg.settings["serial_block_size"])
    out = Path(out_dir) if out_dir is not None else Path("sweep-results") / cfg.name
    parts = out / "parts"
    results = out / "results.csv"
    manifest = out / "manifest.json"
    nproc, pid = jax.process_count(), jax.process_index()
    cfg_hash = cfg.config_hash
    # micro-batch: fixed by the configuration and platform only, never by the device count
    micro_default = mb_set or (64 if platform == "cpu" else 4096)

    def micro_for(b: Bucket) -> int:
        return max(1, min(micro_default, bs, b.points))

    expected = {}
    for b in plan.buckets.values():
        for k in range(-(-b.points // plan.block_cap(b))):
            expected[(b.index, k)] = _part_name(cfg_hash, plan, b, k, micro_for(b) if b.kind == "fast" else 0)
    if pid == 0:
        existing = list(parts.glob("b*-*.csv")) if parts.exists() else []
        if (existing or results.exists() or manifest.exists()) and not resume:
            if not overwrite:
                raise ValueError(f"{out} already holds a sweep ({len(existing)} finished blocks); pass --resume to "
                                 f"continue it, --overwrite to start again, or choose another --out")
            for p in existing:
                p.unlink()
            for p in (results, manifest):
                if p.exists():
                    p.unlink()
        parts.mkdir(parents=True, exist_ok=True)
        keep = set(expected.values())
        for p in existing:
            if p.exists() and p.name not in keep:
                p.unlink()  # a block of another configuration or layout
        for p in parts.glob("*.tmp*"):
            p.unlink()
        man = {"name": cfg.name, "source": cfg.origin, "config_hash": cfg_hash, "version": __version__,
               "points": plan.points, "block_size": bs, "serial_block_size": plan.serial_block_size,
               "config": cfg.canonical(),
               "buckets": [{"index": b.index, "key": list(b.key), "label": b.label(), "points": b.points,
                            "blocks": -(-b.points // plan.block_cap(b))} for b in plan.buckets.values()]}
        _write_text_atomic(manifest, json.dumps(man, indent=1, default=str) + "\n")
    else:
        parts.mkdir(parents=True, exist_ok=True)
    from jax.sharding import AxisType, NamedSharding, PartitionSpec

    mesh = jax.make_mesh((nd,), ("points",), axis_types=(AxisType.Auto,), devices=devs)
    sharding = NamedSharding(mesh, PartitionSpec("points"))
    prov = {"mocap_jax_version": __version__, "config_hash": cfg_hash, "device_kind": devs[0].device_kind,
            "devices": nd}
    cache = TemplateCache(dtype)
    exact = (platform == "cpu") if cfg.settings["exact"] is None else bool(cfg.settings["exact"])
    compiles0 = STATS["compiles"]
    compile_s = 0.0
    skipped_pts = 0
    total_blocks = len(expected)
    sizes = {}
    for b in plan.buckets.values():
        cap = plan.block_cap(b)
        nblk = -(-b.points // cap)
        for k in range(nblk):
            sizes[(b.index, k)] = cap if k < nblk - 1 else b.points - cap * (nblk - 1)
    pending_pts = sum(n for key, n in sizes.items() if not (resume and (parts / expected[key]).exists()))
    to_eval = -(-pending_pts // nproc)
    if limit is not None:
        to_eval = min(to_eval, limit)
    bar = None
    if not quiet:
        from tqdm import tqdm

        bar = tqdm(total=to_eval, unit="pt", unit_scale=True, file=sys.stderr, dynamic_ncols=True,
                   desc=f"sweep {cfg.name}", smoothing=0.05)
    evaluated = 0
    submitted = 0
    done_blocks = 0
    pending = None

    def finish(p):
        nonlocal evaluated, done_blocks
        b, k, ids, name, r, handle = p
        if b.kind == "fast":
            raw = jax.device_get(handle)
            outputs = _fast_outputs(raw, r, b, plan)
        elif b.kind == "serial":
            outputs = _serial_outputs(plan, r, cfg.settings["dtype"])
        else:
            outputs = _impossible_outputs(r)
        _write_part(parts / name, plan, r, outputs, prov, b)
        evaluated += len(ids)
        done_blocks += 1
        if bar is not None:
            bar.update(len(ids))

    def my_blocks():
        """This process's blocks still to do, streamed (no per-point state is kept)."""
        nonlocal skipped_pts
        for g, (b, k, ids) in enumerate(plan.blocks()):
            if g % nproc != pid:
                continue
            name = expected[(b.index, k)]
            if resume and (parts / name).exists():
                skipped_pts += len(ids)
                continue
            yield b, k, ids, name

    try:
        for b, k, ids, name in my_blocks():
            if limit is not None and submitted >= limit:
                break
            submitted += len(ids)
            r = plan.resolver.resolve(ids)
            handle = None
            if b.kind == "fast":
                _, kind, k_pad, n_pad, nb, mode, R, sync = b.key
                shape = SimShape(k_pad=k_pad, n_pad=n_pad, num_batches=nb, timeline=False, mbkr=mode)
                sshape = ServingShape(k_pad=k_pad, n_pad=n_pad, requests=R, gpipe=kind == "gpipe",
                                      synchronous=sync) if R else None
                micro = micro_for(b)
                unit = micro * nd
                size = -(-min(bs, b.points) // unit) * unit
                point, extra = build_fast_inputs(plan, b, r, cache, size)
                args = jax.device_put((point, extra), sharding)
                prog, dtc = _compiled(shape, sshape, micro, mesh, args, exact)
                compile_s += dtc
                handle = prog(*args)
            cur = (b, k, ids, name, r, handle)
            if pending is not None:
                finish(pending)
            pending = cur
        if pending is not None:
            finish(pending)
            pending = None
    finally:
        if bar is not None:
            bar.close()
    complete = all((parts / n).exists() for n in expected.values()) if pid == 0 else False
    if nproc > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("mocap_jax sweep blocks")
        complete = all((parts / n).exists() for n in expected.values())
    feasible = None
    res_path = None
    if complete and pid == 0:
        feasible = _assemble(results, parts, plan, expected)
        res_path = str(results)
    elif complete:
        res_path = str(results)
    return SweepSummary(
        name=cfg.name, out_dir=str(out), results=res_path, points=plan.points, evaluated=evaluated,
        skipped=skipped_pts, feasible=feasible, buckets=len(plan.buckets), blocks=total_blocks,
        blocks_done=done_blocks, compiles=STATS["compiles"] - compiles0, compile_s=compile_s,
        wall_s=time.perf_counter() - t_start, devices=nd, device_kind=devs[0].device_kind, block_size=bs,
        micro_batch=micro_default, config_hash=cfg_hash, complete=complete,
        bucket_labels=[b.label() for b in sorted(plan.buckets.values(), key=lambda b: b.index)])


def _assemble(results: Path, parts: Path, plan: Plan, expected: dict) -> int:
    """Merge the part files (each sorted by point id) into one CSV in point order; return the feasible count.

    Streams lines (a k-way merge over the buckets), so memory stays bounded.
    """
    fi = COLUMNS.index("feasible")

    def stream(bidx: int):
        k = 0
        while (bidx, k) in expected:
            with open(parts / expected[(bidx, k)], newline="") as fh:
                for line in fh:
                    yield int(line[: line.index(",")]), line
            k += 1

    def feasible_of(line: str) -> bool:
        if '"' in line:
            return next(csv.reader([line]))[fi] == "true"
        return line.split(",", fi + 1)[fi] == "true"

    streams = [stream(b.index) for b in sorted(plan.buckets.values(), key=lambda b: b.index)]
    merged = streams[0] if len(streams) == 1 else heapq.merge(*streams, key=lambda x: x[0])
    tmp = results.with_name(results.name + f".tmp{os.getpid()}")
    feasible = 0
    with open(tmp, "w", newline="") as fh:
        fh.write(",".join(COLUMNS) + "\n")
        buf = []
        for _, line in merged:
            feasible += feasible_of(line)
            buf.append(line)
            if len(buf) >= 8192:
                fh.writelines(buf)
                buf.clear()
        fh.writelines(buf)
    os.replace(tmp, results)
    return feasible


def read_results(path) -> list[dict]:
    """Rows of a results CSV as dicts of strings (small sweeps; tests and notebooks)."""
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def expand(source, max_points: int | None = None) -> list[dict]:
    """Every point's inputs as dicts, in point order (validated; for inspection of small sweeps)."""
    cfg = load_sweep(source, max_points=max_points)
    plan = Plan(cfg, 1, 1)
    return [plan.space.point(i) for i in range(plan.points)]


def describe(source, block_size: int | None = None, max_points: int | None = None) -> dict:
    """Points, buckets and blocks of a sweep without evaluating anything (validates it fully).

    ``block_size`` defaults to the file's (else 4096, the CPU default).
    """
    cfg = load_sweep(source, max_points=max_points)
    plan = Plan(cfg, block_size or cfg.settings["block_size"] or 4096, cfg.settings["serial_block_size"])
    return {"name": cfg.name, "points": plan.points, "config_hash": cfg.config_hash,
            "buckets": [{"key": list(b.key), "label": b.label(), "points": b.points}
                        for b in sorted(plan.buckets.values(), key=lambda b: b.index)],
            "blocks": plan.num_blocks()}


__all__ = ["KEYS", "SETTINGS", "COLUMNS", "SweepConfig", "SweepSummary", "load_sweep", "run_sweep", "expand",
           "describe", "read_results", "maybe_init_distributed"]
