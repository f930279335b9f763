"""Resolving what the user named: a preset, a ``mocap-RxC`` mesh, a JSON/TOML spec file, or a spec object."""

from __future__ import annotations

import dataclasses
import json
import re
import tomllib
from pathlib import Path
from typing import Any, Mapping

from .checks import LIMITS, SpecError, suggest
from .gpus import GPUS
from .hardware import HARDWARE_PRESETS, HardwareSpec, gpu_node, mocap_wafer
from .model import MODEL_ALIASES, MODEL_PRESETS, ModelSpec


def _load_file(path: Path) -> Mapping[str, Any]:
    try:
        text = path.read_bytes()
    except OSError as e:
        raise SpecError(f"cannot read spec file {str(path)!r}: {e.strerror}") from None
    try:
        if path.suffix.lower() == ".toml":
            return tomllib.loads(text.decode("utf-8-sig"))
        return json.loads(text.decode("utf-8-sig"))
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SpecError(f"spec file {str(path)!r} is not valid {path.suffix.lstrip('.').upper() or 'JSON'}: {e}") from None
    except RecursionError:
        raise SpecError(f"spec file {str(path)!r} nests too deeply to be a spec: a spec is one table of fields") from None


def _spec_table(data: Any, key: str, origin: str) -> Mapping[str, Any]:
    """The table of fields in a loaded spec file: the whole file, or its ``[key]`` table."""
    if not isinstance(data, Mapping):
        raise SpecError(f"{origin}: a spec file holds one table/object of fields, got {type(data).__name__}")
    table = data.get(key, data)
    if not isinstance(table, Mapping):
        raise SpecError(f"{origin}: [{key}] must be a table/object of fields, got {type(table).__name__}")
    return table


def _from_mapping(cls, data: Mapping[str, Any], origin: str):
    if not isinstance(data, Mapping):
        raise SpecError(f"{origin}: expected a table/object of fields, got {type(data).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise SpecError(f"{origin}: unknown field(s) {unknown}.{suggest(unknown[0], names, 0.4)} "
                        f"Known fields: {sorted(names)}")
    required = [f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    missing = [k for k in required if k not in data and k != "name"]
    if missing:
        raise SpecError(f"{origin}: missing required field(s) {missing}")
    kwargs = dict(data)
    kwargs.setdefault("name", Path(origin).stem)
    for f in dataclasses.fields(cls):
        if f.name in kwargs and f.type in ("float", "float | None") and isinstance(kwargs[f.name], int) \
                and not isinstance(kwargs[f.name], bool):
            try:
                kwargs[f.name] = float(kwargs[f.name])
            except OverflowError:
                raise SpecError(f"{origin}: {f.name} = {kwargs[f.name]} is too large to represent") from None
    try:
        return cls(**kwargs)
    except SpecError as e:
        raise SpecError(f"{origin}: {e}") from None
    except TypeError as e:
        raise SpecError(f"{origin}: {e}") from None


def _parse_mesh_name(name: str) -> HardwareSpec | None:
    """``mocap-RxC`` or ``mocap-RxCxWw`` (W wafers side by side)."""
    m = re.fullmatch(r"mocap-(\d+)x(\d+)(?:x(\d+)w)?", name)
    if not m:
        return None
    r, c, w = int(m.group(1)), int(m.group(2)), int(m.group(3) or 1)
    if min(r, c, w) <= 0:
        raise SpecError(f"hardware {name!r}: rows, cols and wafers must be positive")
    if r * c * w > LIMITS["dies"]:
        raise SpecError(f"hardware {name!r}: {r * c * w:,} dies exceed the largest mesh the simulator represents, "
                        f"{LIMITS['dies']:,} dies; use a smaller mesh")
    return mocap_wafer(r, c, wafers=w)


def _parse_gpu_name(name: str) -> HardwareSpec | None:
    """``KIND-xG``, ``KIND-xGxNn`` (N nodes) and either with ``-fp8`` (e.g. ``h100-x4``, ``h20-x8x4n-fp8``)."""
    m = re.fullmatch(r"([a-z0-9]+)-x(\d+)(?:x(\d+)n)?(-fp8)?", name)
    if not m or m.group(1) not in GPUS:
        return None
    return gpu_node(m.group(1), int(m.group(2)), int(m.group(3) or 1), "fp8" if m.group(4) else "bf16")


def get_model(name_or_spec: "str | ModelSpec | Path") -> ModelSpec:
    """Resolve a preset name, a path to a JSON/TOML file, or pass a ModelSpec through."""
    if isinstance(name_or_spec, ModelSpec):
        return name_or_spec
    name = str(name_or_spec)
    key = name.lower()
    key = MODEL_ALIASES.get(key, key)
    if key in MODEL_PRESETS:
        return MODEL_PRESETS[key]
    p = Path(name)
    if p.suffix.lower() in (".json", ".toml"):
        data = _load_file(p)
        return _from_mapping(ModelSpec, _spec_table(data, "model", str(p)), str(p))
    raise SpecError(f"unknown model {name!r}.{suggest(key, list(MODEL_PRESETS) + list(MODEL_ALIASES), 0.4)} "
                    f"Run `mocap-jax models` for the list, or pass a .json/.toml spec file.")


def get_hardware(name_or_spec: "str | HardwareSpec | Path") -> HardwareSpec:
    """Resolve a preset name (also any ``mocap-RxC`` / ``mocap-RxCxWw``, and GPU nodes ``KIND-xG[xNn][-fp8]``
    such as ``h100-x4`` or ``h20-x8x4n-fp8``), a spec file, or a HardwareSpec."""
    if isinstance(name_or_spec, HardwareSpec):
        return name_or_spec
    name = str(name_or_spec)
    key = name.lower()
    if key in HARDWARE_PRESETS:
        return HARDWARE_PRESETS[key]
    mesh = _parse_mesh_name(key)
    if mesh is not None:
        return mesh
    gpus = _parse_gpu_name(key)
    if gpus is not None:
        return gpus
    p = Path(name)
    if p.suffix.lower() in (".json", ".toml"):
        data = _load_file(p)
        return _from_mapping(HardwareSpec, _spec_table(data, "hardware", str(p)), str(p))
    raise SpecError(f"unknown hardware {name!r}.{suggest(key, HARDWARE_PRESETS, 0.4)} "
                    f"Run `mocap-jax hardware` for the list, use mocap-RxC for any mesh, KIND-xG[xNn][-fp8] for GPU nodes (e.g. h100-x4), or pass a .json/.toml spec file.")
