"""The sweep file: its schema, and reading and validating it (one message naming the key and the file).

A sweep is a TOML file (or TOML text, or a dict with the same tables) with four tables:
``[sweep]`` (settings of the run), ``[fixed]`` (one value per key), ``[grid]`` / ``[[grid]]``
(lists of values: cartesian products) and ``[[points]]`` (explicit rows).  Every value is
checked here, through :mod:`mocap_jax.specs.checks`, before anything is planned or traced:
integers for counts (no bools, no fractions), finite numbers, choices with a suggestion for a
near miss, and the limits the simulator represents (:data:`mocap_jax.specs.LIMITS`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from ..specs import LIMITS, SpecError, checks, mocap_wafer
from .evaluate import (ADMISSION_MODES, ARRIVALS, DEFAULT_P1, DEFAULT_P2, DEFAULT_READ_OVERLAP, OBJECTIVES, PAIRINGS,
                       RELEASE_POLICIES)

FAST_SCHEMES = ("gpipe", "terapipe", "mbkr")
SERIAL_SCHEMES = ("terapipe-dp", "lbcp", "mocap")
ALL_SCHEMES = FAST_SCHEMES + SERIAL_SCHEMES
DIE_FIELDS = ("peak_flops", "hbm_capacity", "hbm_bandwidth", "link_bandwidth", "cross_wafer_bandwidth",
              "link_latency_s", "eff_gemm", "eff_attention", "eff_hbm", "eff_link", "usable_hbm_fraction",
              "weight_bytes", "kv_bytes", "activation_bytes", "mlp_token_tile", "activation_buffer_scale",
              "layer_overhead_s", "gemm_fixed_s")
FRACTION_DIE_FIELDS = ("eff_gemm", "eff_attention", "eff_hbm", "eff_link", "usable_hbm_fraction")
LATENCY_DIE_FIELDS = ("link_latency_s", "layer_overhead_s", "gemm_fixed_s")

#: points per compiled call: a block's inputs are held in host and device memory at once
MAX_BLOCK = 2 ** 24


def _count(hi: int, lo: int = 1) -> Callable[[str, Any], int]:
    return lambda name, v: checks.integer(name, v, lo, hi)


def _optional(check: Callable) -> Callable:
    return lambda name, v: None if v is None else check(name, v)


def _choice(choices: tuple) -> Callable[[str, Any], str]:
    return lambda name, v: checks.choice(name, v, choices)


def _batch(name: str, v: Any):
    return v if v == "auto" else checks.integer(name, v, 1, LIMITS["batch"],
                                                hint=' Or write "auto" for the largest feasible batch.')


def _die(name: str, v: Any) -> float:
    """One per-die parameter: its range, then the hardware spec's own rule for the field."""
    if name in FRACTION_DIE_FIELDS:
        f = checks.fraction(name, v, open_low=True)
    elif name in LATENCY_DIE_FIELDS:
        f = checks.number(name, v, 0.0, LIMITS["latency_s"])
    elif name == "activation_buffer_scale":
        f = checks.number(name, v, 0.0, 64.0)
    elif name == "mlp_token_tile":
        f = float(checks.integer(name, v, 0, LIMITS["seq_len"], hint=" Tokens per MLP tile, or 0 for untiled."))
    else:
        f = checks.positive(name, v)
    mocap_wafer(**{name: f})
    return f


@dataclass(frozen=True)
class Key:
    """One sweepable key (or ``[sweep]`` setting): its check, default and documentation."""

    check: Callable[[str, Any], Any]   # (name, value) -> normalised value, or raises SpecError
    default: Any
    doc: str


KEYS: dict[str, Key] = {
    "model": Key(checks.text, "llama3-70b", "model preset or .json/.toml spec file (relative to the sweep file)"),
    "hardware": Key(checks.text, "mocap-4x4", "hardware preset, mocap-RxC[xWw], or spec file"),
    "rows": Key(_optional(_count(LIMITS["dies"])), None, "mesh rows (overrides the hardware's)"),
    "cols": Key(_optional(_count(LIMITS["dies"])), None, "mesh columns per wafer (overrides the hardware's)"),
    "wafers": Key(_optional(_count(LIMITS["dies"])), None, "wafers side by side (overrides the hardware's)"),
    "stages": Key(_optional(_count(LIMITS["dies"])), None, "pipeline stages (default: dies / tp)"),
    "tp": Key(_count(LIMITS["dies"]), 1, "dies per pipeline stage (a tensor-parallel stage group)"),
    **{f: Key(_optional(_die), None, f"per-die {f} (overrides the hardware's; see HardwareSpec)") for f in DIE_FIELDS},
    "seq_len": Key(_count(LIMITS["seq_len"]), 65536, "prompt tokens per request"),
    "chunks": Key(_count(LIMITS["chunks"]), 16, "chunks per request (chunked schemes; LBCP: chunk count M)"),
    "batch": Key(_batch, 1, "requests per batch, or \"auto\" (largest feasible B', slow path)"),
    "microbatch": Key(_count(LIMITS["batch"]), 1, "requests per GPipe microbatch"),
    "scheme": Key(_choice(ALL_SCHEMES), "terapipe", "pipelining scheme"),
    "placement": Key(_choice(("default", "snake", "searched")), "default",
                     "stage-to-die map (default: searched for MBKR, snake otherwise)"),
    "release": Key(_choice(RELEASE_POLICIES), "stage", "KV release policy"),
    "admission": Key(_choice(ADMISSION_MODES), "streaming", "batch admission"),
    "num_batches": Key(_count(LIMITS["num_batches"]), 2, "consecutive batches simulated"),
    "pairing": Key(_choice(PAIRINGS), "cross-half", "MBKR pairing"),
    "p1": Key(checks.fraction, DEFAULT_P1, "MBKR creditor threshold (fraction of KV budget)"),
    "p2": Key(checks.fraction, DEFAULT_P2, "MBKR debtor threshold (fraction of KV budget)"),
    "read_overlap": Key(checks.fraction, DEFAULT_READ_OVERLAP, "fraction of local attention hiding a remote read"),
    "load": Key(_optional(checks.load), None, "request rate (requests/s) for end-to-end latency; omit for "
                                                  "prefill only"),
    "requests": Key(_count(LIMITS["requests"]), 256, "simulated requests for end-to-end latency"),
    "arrivals": Key(_choice(ARRIVALS), "poisson", "arrival process"),
    "granularity": Key(_count(LIMITS["seq_len"]), 256, "LBCP chunk granularity g (tokens)"),
    "chains": Key(_count(LIMITS["chains"]), 256, "LBCP annealing chains"),
    "steps": Key(_count(LIMITS["steps"]), 600, "LBCP annealing steps"),
    "objective": Key(_choice(OBJECTIVES), "prefill", "LBCP objective"),
    "max_batch": Key(_count(LIMITS["batch"]), 256, "upper end of the batch = \"auto\" search"),
    "seed": Key(_count(LIMITS["seed"], lo=0), 0, "seed of arrivals and annealing (default: [sweep] seed)"),
}

SETTINGS: dict[str, Key] = {
    "name": Key(checks.text, "sweep", "name (default output directory sweep-results/NAME)"),
    "description": Key(lambda name, v: v if v == "" else checks.text(name, v), "", "free text"),
    "seed": Key(_count(LIMITS["seed"], lo=0), 0, "default seed of every point"),
    "block_size": Key(_count(MAX_BLOCK, lo=0), 0, "points per compiled call (0: 4096 on CPU, 32768 on accelerators)"),
    "micro_batch": Key(_count(MAX_BLOCK, lo=0), 0, "points per vectorised step inside a block (0: 64 on CPU, "
                                                   "4096 otherwise)"),
    "serial_block_size": Key(_count(MAX_BLOCK), 8, "points per block of the one-at-a-time schemes"),
    "dtype": Key(_choice(("float32", "float64")), "float32", "float32 or float64"),
    "impossible": Key(_choice(("error", "infeasible")), "error",
                      "impossible combinations: raise, or record as infeasible rows"),
    "exact": Key(_optional(checks.flag), None, "bit-identical results for any device count (XLA algebraic "
                                               "simplifier off); default: true on CPU, false on accelerators"),
}
TABLES = ("sweep", "fixed", "grid", "points")


@dataclass
class SweepConfig:
    """A validated sweep definition (see ``sweeps/README.md``).

    ``grids`` is a list of ``{key: [values]}`` (cartesian products, the last key varying
    fastest), ``rows`` the explicit ``[[points]]`` (``{key: value}``), ``fixed`` the scalars
    applied to every point, ``settings`` the ``[sweep]`` table, ``base_dir`` the directory
    spec files are relative to.
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
        """What the results depend on (the configuration hash covers exactly this)."""
        s = {k: v for k, v in self.settings.items() if k in ("seed", "dtype", "impossible", "exact")}
        return {"settings": s, "fixed": self.fixed, "grids": self.grids, "rows": self.rows,
                "max_points": self.max_points}

    @property
    def config_hash(self) -> str:
        text = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _parse_toml(text: str, origin: str) -> dict:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{origin}: not valid TOML: {e}") from None
    except RecursionError:
        raise SpecError(f"{origin}: values are nested too deeply to read") from None


def _read(source) -> tuple[dict, str, Path]:
    """The raw tables of a source, its name for messages, and the directory spec files are relative to."""
    if isinstance(source, Mapping):
        return dict(source), "<sweep dict>", Path.cwd()
    if isinstance(source, str) and "\n" in source:
        return _parse_toml(source, "<sweep text>"), "<sweep text>", Path.cwd()
    if not isinstance(source, (str, os.PathLike)):
        raise SpecError(f"a sweep is a path to a .toml file, TOML text or a dict, got {type(source).__name__}")
    path = Path(source)
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except OSError as e:
        raise SpecError(f"cannot read sweep file {str(path)!r}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise SpecError(f"{path}: not UTF-8 text") from None
    return _parse_toml(text, str(path)), str(path), path.resolve().parent


def _value(origin: str, where: str, name: str, key: Key, v):
    try:
        return key.check(name, v)
    except SpecError as e:
        raise SpecError(f"{origin}: {where} {e} ({name}: {key.doc})") from None


def _check_key(origin: str, where: str, k: str) -> Key:
    if k not in KEYS:
        raise SpecError(f"{origin}: {where} unknown key {k!r}.{checks.suggest(k, KEYS)} Known keys: {', '.join(KEYS)}")
    return KEYS[k]


def _single(origin: str, where: str, k: str, v):
    if isinstance(v, (list, dict)):
        hint = " (put lists of values in [grid])" if where == "[fixed]" else ""
        raise SpecError(f"{origin}: {where} {k}: expected a single value{hint}, got {v!r}")
    return _value(origin, where, k, _check_key(origin, where, k), v)


def _settings(origin: str, data: dict) -> dict:
    settings = {k: s.default for k, s in SETTINGS.items()}
    sw = data.get("sweep", {})
    if not isinstance(sw, Mapping):
        raise SpecError(f"{origin}: [sweep] must be a table of settings")
    for k, v in sw.items():
        if k not in SETTINGS:
            raise SpecError(f"{origin}: [sweep] unknown setting {k!r}.{checks.suggest(k, SETTINGS)} "
                            f"Known settings: {', '.join(SETTINGS)}")
        settings[k] = _value(origin, "[sweep]", k, SETTINGS[k], v)
    if settings["name"] == "sweep" and origin.endswith(".toml"):
        settings["name"] = Path(origin).stem
    if settings["dtype"] == "float64":
        import jax

        if not jax.config.jax_enable_x64:
            raise SpecError(f"{origin}: [sweep] dtype = \"float64\" needs 64-bit JAX: set JAX_ENABLE_X64=1 "
                            f"(or jax.config.update('jax_enable_x64', True)) before running the sweep")
    return settings


def _grids(origin: str, data: dict, fixed: dict) -> list:
    grid_raw = data.get("grid", [])
    grid_list = [grid_raw] if isinstance(grid_raw, Mapping) else grid_raw
    if not isinstance(grid_list, list):
        raise SpecError(f"{origin}: [grid] must be a table of key = [values] (or [[grid]] tables)")
    grids = []
    for gi, g in enumerate(grid_list):
        where = "[grid]" if isinstance(grid_raw, Mapping) else f"[[grid]] #{gi + 1}"
        if not isinstance(g, Mapping):
            raise SpecError(f"{origin}: {where} must be a table of key = [values]")
        if not g:
            raise SpecError(f"{origin}: {where} is empty; give at least one key = [values]")
        axes = {}
        for k, vals in g.items():
            key = _check_key(origin, where, k)
            if k in fixed:
                raise SpecError(f"{origin}: {where} {k}: also set in [fixed]; keep it in one place")
            if not isinstance(vals, list):
                raise SpecError(f"{origin}: {where} {k}: expected a list of values (put single values in "
                                f"[fixed]), got {vals!r}")
            if not vals:
                raise SpecError(f"{origin}: {where} {k}: empty list; give at least one value")
            axes[k] = [_value(origin, where, k, key, v) for v in vals]
        grids.append(axes)
    return grids


def load_sweep(source, *, max_points: int | None = None) -> SweepConfig:
    """Read and validate a sweep: a path to a TOML file, TOML text (a ``str`` with newlines), a dict,
    or a :class:`SweepConfig` (copied; ``max_points`` replaces its own).

    Raises :class:`mocap_jax.specs.SpecError` (a ``ValueError``) naming the file and the key for
    anything wrong in it.
    """
    if max_points is not None:
        max_points = checks.integer("max_points", max_points, 1, 2 ** 62)
    if isinstance(source, SweepConfig):
        cfg = dataclasses.replace(source)
        if max_points is not None:
            cfg.max_points = max_points
        return cfg
    data, origin, base = _read(source)
    unknown = [k for k in data if k not in TABLES]
    if unknown:
        raise SpecError(f"{origin}: unknown table [{unknown[0]}].{checks.suggest(unknown[0], TABLES)} "
                        f"A sweep file has [sweep], [fixed], [grid] (or [[grid]]) and [[points]].")
    settings = _settings(origin, data)
    fixed_raw = data.get("fixed", {})
    if not isinstance(fixed_raw, Mapping):
        raise SpecError(f"{origin}: [fixed] must be a table of key = value")
    fixed = {k: _single(origin, "[fixed]", k, v) for k, v in fixed_raw.items()}
    grids = _grids(origin, data, fixed)
    rows_raw = data.get("points", [])
    if not isinstance(rows_raw, list) or any(not isinstance(r, Mapping) for r in rows_raw):
        raise SpecError(f"{origin}: points must be written as [[points]] tables of key = value")
    rows = [{k: _single(origin, f"[[points]] #{ri + 1}", k, v) for k, v in r.items()} for ri, r in enumerate(rows_raw)]
    if not grids and not rows:
        raise SpecError(f"{origin}: no points; add a [grid] table of key = [values] or [[points]] rows")
    return SweepConfig(origin=origin, settings=settings, fixed=fixed, grids=grids, rows=rows, base_dir=base,
                       max_points=max_points)
