"""Points -> resolved configurations: hardware and model specs, stage counts, impossible combinations
and shape-bucket keys, vectorised over arrays of point ids (host side, NumPy).

A shape bucket is the static structure one compiled program serves (item and stage padding,
batches, MBKR mode, serving shape); everything else is a traced number.  The bucket and the
impossibility reason of a point depend only on the keys in :data:`PLAN_KEYS`, and on ``load``,
``pairing`` and ``admission`` only through :data:`PLAN_FEATURES`; the planner relies on this to
count a grid's points per bucket without enumerating them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import costs
from ..costs import HardwareParams, ModelParams
from ..specs import LIMITS, HardwareSpec, SpecError, get_hardware, get_model, mesh
from .arrays import power_of_two_bucket, unique_rows
from .config import DIE_FIELDS, SERIAL_SCHEMES
from .space import Space

REASONS = ("", "stages>dies", "stages>layers", "chunks>seq_len", "granularity", "weights", "p1>p2",
           "gpipe-load-microbatch", "serial-batch", "serial-stages", "microbatches", "tp-heads", "tp-tiling",
           "e2e-load")
HW_KEYS = ("hardware", "rows", "cols", "wafers") + DIE_FIELDS
#: the keys a point's bucket and impossibility reason are computed from (of the die fields, only
#: those in the weights check: a stage's weights against hbm_capacity x usable_hbm_fraction)
PLAN_KEYS = frozenset({"hardware", "rows", "cols", "wafers", "hbm_capacity", "usable_hbm_fraction", "weight_bytes",
                       "model", "stages", "tp", "scheme", "seq_len", "chunks", "granularity", "batch", "microbatch",
                       "p1", "p2", "load", "requests", "admission", "release", "num_batches", "pairing",
                       "max_batch"})
#: keys that enter only through one property of their value: values with equal property are interchangeable
PLAN_FEATURES = {"load": lambda v: v is None, "pairing": lambda v: v if v in ("dynamic", "none") else "static",
                 "admission": lambda v: v == "synchronous", "release": lambda v: v == "request"}


@dataclass
class Resolved:
    """The resolved configuration of a set of points (arrays over ``ids``)."""

    space: Space
    ids: np.ndarray          # int64 [P] point ids
    codes: dict              # key -> int32 [P] value-table index
    hw_specs: list           # HardwareSpec per unique hardware combination
    hw_inv: np.ndarray       # [P] index into hw_specs
    models: list             # ModelSpec per model code
    stages: np.ndarray       # int64 [P] pipeline stages N
    tp: np.ndarray           # int64 [P] dies per stage group
    scheme: np.ndarray       # object [P] scheme names
    reason: np.ndarray       # int8 [P] index into REASONS (0: possible)

    def values(self, key: str, dtype=np.int64, fill=np.nan) -> np.ndarray:
        """``[P]`` numeric values of a key (``fill`` where unset or not a number)."""
        return self.space.values(key, self.codes[key], fill=fill, dtype=dtype)

    def objects(self, key: str) -> np.ndarray:
        """``[P]`` values of a key as Python objects (None where unset)."""
        return self.space.objects(key, self.codes[key])

    def reason_names(self) -> np.ndarray:
        """``[P]`` object array of impossibility reasons (``""``: possible)."""
        return np.array(REASONS, dtype=object)[self.reason.astype(np.int64)]

    def hardware(self, j: int) -> HardwareSpec:
        return self.hw_specs[int(self.hw_inv[j])]

    def point(self, j: int) -> dict:
        """Every key's value at point ``ids[j]``."""
        return {k: self.space.tables[k][int(c[j])] for k, c in self.codes.items()}


class Resolver:
    """Turns value codes into specs, stage counts, impossibility reasons and bucket keys (cached)."""

    def __init__(self, space: Space):
        self.space = space
        self.cfg = space.cfg
        self._hw: dict[tuple, HardwareSpec] = {}
        self._weights: dict[tuple, float] = {}
        self._tiles: dict[tuple, bool] = {}
        self.models = [self._spec(get_model, "model", v) for v in space.tables["model"]]
        self.hardware_bases = [self._spec(get_hardware, "hardware", v) for v in space.tables["hardware"]]

    def _spec(self, get, what: str, v: str):
        p = Path(v)
        if p.suffix.lower() in (".json", ".toml") and not p.is_absolute() and (self.cfg.base_dir / p).exists():
            v = str(self.cfg.base_dir / p)
        try:
            return get(v)
        except ValueError as e:
            raise SpecError(f"{self.cfg.origin}: {what}: {e}") from None

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
            prefix = "mocap" if base.name.startswith("mocap-") else base.name
            geo["name"] = f"{prefix}-{r}x{c}" + (f"x{w}w" if w > 1 else "")
        die = {f: t[f][c] for f, c in zip(DIE_FIELDS, row[4:]) if t[f][c] is not None}
        try:
            spec = base.replace(**geo, **die)
        except SpecError as e:
            raise SpecError(f"{self.cfg.origin}: hardware: {e}") from None
        if spec.num_dies > LIMITS["dies"]:
            raise SpecError(f"{self.cfg.origin}: hardware {spec.name} has {spec.num_dies:,} dies, more than the "
                            f"{LIMITS['dies']:,} the simulator represents (its routing tables are dies x dies); "
                            f"use fewer rows, cols or wafers")
        self._hw[row] = spec
        return spec

    def _weight_excess(self, model_code: int, spec: HardwareSpec, n: int, tp: int = 1) -> float:
        """Largest stage's weight bytes per die minus a die's usable HBM (> 0: the model does not fit)."""
        key = (model_code, spec, n, tp)
        if key not in self._weights:
            mp = ModelParams.from_spec(self.models[model_code], np.float64)
            hp = HardwareParams.from_spec(spec, np.float64)
            w = costs.stage_weight_bytes(mp, hp, n, n, xp=np, tensor_parallel=float(tp))
            self._weights[key] = float(np.max(w)) - spec.hbm_capacity * spec.usable_hbm_fraction
        return self._weights[key]

    def _tiles_mesh(self, spec: HardwareSpec, tp: int) -> bool:
        """Whether stage groups of ``tp`` dies exist on the hardware (an ``r x c`` rectangle tiling a mesh;
        any group of devices on a switch)."""
        key = (spec, tp)
        if key not in self._tiles:
            fits = tp <= spec.num_dies
            if fits and spec.topology == "mesh":
                try:
                    mesh.group_tiles(spec, tp)
                except ValueError:
                    fits = False
            self._tiles[key] = fits
        return self._tiles[key]

    def _heads_problem(self, model_code: int, tp: int) -> str:
        m = self.models[model_code]
        return costs.tensor_parallel.heads_problem(m.q_heads, m.kv_heads, m.attention == "gqa", tp)

    def resolve(self, ids: np.ndarray) -> Resolved:
        sp = self.space
        c = sp.codes(ids)
        t = sp.tables
        uniq, hw_inv = unique_rows([c[k] for k in HW_KEYS])
        specs = [self.hw_spec(tuple(int(x) for x in row)) for row in uniq]
        dies = np.array([s.num_dies for s in specs], np.int64)[hw_inv]
        st = sp.values("stages", c["stages"], fill=-1, dtype=np.int64)
        tp = sp.values("tp", c["tp"], dtype=np.int64)
        stages = np.where(st < 0, dies // tp, st)
        scheme = np.array(t["scheme"], dtype=object)[c["scheme"]]
        layers = np.array([m.layers for m in self.models], np.int64)[c["model"]]
        val = lambda k, **kw: sp.values(k, c[k], **kw)
        seq, chunks, gran = (val(k, dtype=np.int64) for k in ("seq_len", "chunks", "granularity"))
        flag = lambda k, f: np.array([f(v) for v in t[k]], bool)[c[k]]
        auto = flag("batch", lambda v: v == "auto")
        has_load = flag("load", lambda v: v is not None)
        micro = val("microbatch", dtype=np.int64)
        batch = val("batch", fill=1, dtype=np.int64)
        serial = np.isin(scheme, SERIAL_SCHEMES)
        chunked = np.isin(scheme, ("terapipe", "mbkr"))
        reason = np.zeros(len(ids), np.int8)

        def mark(mask, code):
            reason[mask & (reason == 0)] = REASONS.index(code)

        stages_given = flag("stages", lambda v: v is not None)
        mark(serial & ~auto, "serial-batch")
        mark((serial | auto) & stages_given, "serial-stages")
        u, inv = unique_rows([c["model"], tp])
        mark(np.array([self._heads_problem(int(m), int(t)) != "" for m, t in u], bool)[inv], "tp-heads")
        u, inv = unique_rows([hw_inv, tp])
        mark(~np.array([self._tiles_mesh(specs[int(h)], int(t)) for h, t in u], bool)[inv], "tp-tiling")
        mark(stages * tp > dies, "stages>dies")
        mark(stages > layers, "stages>layers")
        mark(chunked & (chunks > seq), "chunks>seq_len")
        mark(serial & ((seq % gran != 0) | ((scheme != "terapipe-dp") & (chunks * gran > seq))), "granularity")
        mark((scheme == "gpipe") & has_load & (micro != 1), "gpipe-load-microbatch")
        mark((scheme == "gpipe") & ~auto & (-(-batch // micro) > LIMITS["chunks"]), "microbatches")
        mark(val("p1") > val("p2"), "p1>p2")
        e2e = flag("objective", lambda v: v == "e2e")
        mark(np.isin(scheme, ("lbcp", "mocap")) & e2e & ~has_load, "e2e-load")
        ok = reason == 0
        if ok.any():   # weights per die: per unique (model, hardware combination, stages, tp)
            u, inv = unique_rows([c["model"][ok], hw_inv[ok], stages[ok], tp[ok]])
            over = np.array([self._weight_excess(int(m), specs[h], int(n), int(t)) > 0 for m, h, n, t in u], bool)
            full = np.zeros(len(ids), bool)
            full[ok] = over[inv]
            mark(full, "weights")
        return Resolved(space=sp, ids=np.asarray(ids, np.int64), codes=c, hw_specs=specs, hw_inv=hw_inv,
                        models=self.models, stages=stages, tp=tp, scheme=scheme, reason=reason)

    def explain(self, r: Resolved, j: int) -> str:
        """One-line message for the impossible point ``r.ids[j]``, naming the keys."""
        v = r.point(j)
        code = REASONS[int(r.reason[j])]
        hw = r.hardware(j)
        m = self.models[int(r.codes["model"][j])]
        n, t = int(r.stages[j]), int(r.tp[j])
        S, M, g, scheme = v["seq_len"], v["chunks"], v["granularity"], v["scheme"]
        if code == "stages>dies":
            if t > 1:
                return (f"stages = {n} of tp = {t} dies need {n * t} dies but hardware {hw.name} has {hw.num_dies}; "
                        f"use fewer stages, a smaller tp or a larger mesh")
            return (f"stages = {n} is more than the {hw.num_dies} dies of hardware {hw.name}; use fewer stages or a "
                    f"larger mesh")
        if code == "tp-heads":
            return (f"tp = {t} {self._heads_problem(int(r.codes['model'][j]), t)} of model {m.name}; choose a tp "
                    f"that splits them")
        if code == "tp-tiling":
            if t > hw.num_dies:
                return f"tp = {t} is more than the {hw.num_dies} dies of hardware {hw.name}; use a smaller tp"
            return (f"no rectangle of tp = {t} dies tiles the {hw.rows}x{hw.grid_cols} grid of hardware {hw.name}; "
                    f"choose a tp that is a product of divisors of the rows and columns")
        if code == "stages>layers":
            return (f"model {m.name} has {m.layers} layers, fewer than the {n} pipeline stages of hardware "
                    f"{hw.name}; use a smaller mesh (rows/cols) or set stages <= {m.layers}")
        if code == "chunks>seq_len":
            return f"chunks = {M} is more than seq_len = {S} tokens; use fewer chunks or longer sequences"
        if code == "granularity":
            if S % g:
                return f"granularity = {g} does not divide seq_len = {S} (scheme {scheme}); choose g dividing every seq_len"
            return (f"chunks = {M} chunks of granularity = {g} tokens need seq_len >= {M * g}, but seq_len = {S} "
                    f"(scheme {scheme})")
        if code == "weights":
            usable = hw.hbm_capacity * hw.usable_hbm_fraction
            w = self._weight_excess(int(r.codes["model"][j]), hw, n, t) + usable
            return (f"model {m.name} does not fit hardware {hw.name}: a stage needs {w / 1e9:.1f} GB of weights per die "
                    f"but a die has {usable / 1e9:.1f} GB usable (hbm_capacity x usable_hbm_fraction); use a larger "
                    f"mesh, a larger tp or a smaller model")
        if code == "p1>p2":
            return f"p1 = {v['p1']} is above p2 = {v['p2']}; MBKR needs p1 <= p2"
        if code == "e2e-load":
            return (f"scheme {scheme} with objective = \"e2e\" scores partitions by their end-to-end latency at a "
                    f"request rate: give it a load (requests/s)")
        if code == "gpipe-load-microbatch":
            return "scheme gpipe with a load (end-to-end latency) needs microbatch = 1"
        if code == "microbatches":
            return (f"scheme gpipe with batch = {v['batch']} and microbatch = {v['microbatch']} makes "
                    f"{-(-v['batch'] // v['microbatch']):,} microbatches, more than the {LIMITS['chunks']:,} items "
                    f"per batch the simulator represents; use a larger microbatch")
        if code == "serial-batch":
            return (f"scheme {scheme} always runs at its largest feasible batch: set batch = \"auto\" for it "
                    f"(use a separate [[grid]] table for the slow schemes)")
        assert code == "serial-stages", code
        return (f"scheme {scheme} (or batch = \"auto\") runs through compare.evaluate_scheme, which uses every "
                f"die: stages cannot be set for it")

    def bucket_keys(self, r: Resolved) -> tuple[list[tuple], np.ndarray]:
        """Distinct bucket keys and each point's index into them.

        A key is ``("fast", kind, k_pad, n_pad, num_batches, mbkr mode, requests, synchronous, request release)``
        (kind ``"gpipe"`` or ``"chunked"``, requests 0 without a load; admission and release are static
        structure of the compiled program), ``("serial",)`` or ``("impossible",)``.
        """
        t = self.space.tables
        flag = lambda k, f: np.array([f(v) for v in t[k]], bool)[r.codes[k]]
        serial = np.isin(r.scheme, SERIAL_SCHEMES) | flag("batch", lambda v: v == "auto")
        gp = r.scheme == "gpipe"
        batch = r.values("batch", fill=1)
        items = np.where(gp, -(-batch // r.values("microbatch")), r.values("chunks"))
        k_pad = power_of_two_bucket(items)
        n_pad = power_of_two_bucket(r.stages)
        # MBKR without partners spills nothing: exactly the plain program
        unpaired = flag("pairing", lambda v: v == "none")
        mode = np.where((r.scheme == "mbkr") & ~unpaired,
                        np.where(flag("pairing", lambda v: v == "dynamic"), 2, 1), 0)
        has_load = flag("load", lambda v: v is not None)
        R = np.where(has_load, r.values("requests"), 0)
        sync = flag("admission", lambda v: v == "synchronous")
        request = flag("release", lambda v: v == "request")
        kind = np.where(r.reason > 0, 2, np.where(serial, 1, 0))
        u, inv = unique_rows([kind, gp.astype(np.int64), k_pad, n_pad, r.values("num_batches"), mode, R,
                              sync.astype(np.int64), request.astype(np.int64)])
        keys = []
        for row in u:
            kd, g, kp, npad, b, md, rr, sy, rq = (int(x) for x in row)
            if kd == 2:
                keys.append(("impossible",))
            elif kd == 1:
                keys.append(("serial",))
            else:
                keys.append(("fast", "gpipe" if g else "chunked", kp, npad, b, ("off", "static", "dynamic")[md], rr,
                             bool(sy), bool(rq)))
        return keys, inv
