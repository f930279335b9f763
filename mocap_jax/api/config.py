"""One configuration, resolved and validated: what every entry point builds before anything is traced.

:func:`resolve` turns user arguments (preset names or spec objects, scheme, lengths, batches,
policies, MBKR settings, placement) into a :class:`Config`, raising one
:class:`~mocap_jax.specs.SpecError` (a ``ValueError``) that says what is wrong and how to fix it.
A :class:`Config` knows its item table, its static shape and its pytree of numbers.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import numpy as np

from .. import costs
from ..costs import HardwareParams, ModelParams
from ..mbkr.pairing import DEFAULT_P1, DEFAULT_P2, DEFAULT_READ_OVERLAP, PAIRINGS
from ..prefill.evaluate import Point
from ..prefill.points import MBKRSettings, build_point
from ..schedule.items import ItemTable, chunked_items, gpipe_items, pad_items, uniform_partition
from ..schedule.shape import Admission, MBKRMode, Release, SimShape, bucket
from ..specs import LIMITS, HardwareSpec, ModelSpec, SpecError, checks, get_hardware, get_model
from ..specs.checks import float_dtype as check_dtype
from ..specs.mesh import snake_placement, stage_groups

SCHEMES = ("gpipe", "terapipe", "mbkr")
RELEASE_POLICIES = tuple(p.value for p in Release)
ADMISSION_MODES = tuple(a.value for a in Admission)
DEFAULT_CHUNKS = 16


def check_partition(partition, seq_len: int) -> np.ndarray:
    """Chunk sizes: positive integers summing to ``seq_len``, at most ``LIMITS['chunks']`` of them."""
    part = checks.integers("partition", partition, 1, LIMITS["seq_len"])
    if part.ndim != 1 or part.size == 0:
        raise SpecError(f"partition must be a non-empty list of chunk sizes, got shape {part.shape}")
    if part.size > LIMITS["chunks"]:
        raise SpecError(f"partition has {part.size} chunks; at most {LIMITS['chunks']} are supported")
    if int(part.sum()) != int(seq_len):
        raise SpecError(f"partition sums to {int(part.sum())} tokens but seq_len is {seq_len}: "
                        f"chunk sizes must add up to the sequence length")
    return part


def check_tensor_parallel(model: ModelSpec, hw: HardwareSpec, tp) -> int:
    """Dies per stage group: a positive integer that divides the model's heads the way engines require."""
    t = checks.integer("tp", tp, 1, LIMITS["dies"], " Pass the dies (GPUs) per pipeline stage, e.g. tp=4.")
    if t > hw.num_dies:
        raise SpecError(f"tp={t} needs {t} dies per stage but {hw.name} has {hw.num_dies}; use a smaller tp")
    problem = costs.tensor_parallel.heads_problem(model.q_heads, model.kv_heads, model.attention == "gqa", t)
    if problem:
        choose = (f"choose a tp that divides {model.q_heads}" if model.q_heads % t else
                  f"choose a divisor or a multiple of {model.kv_heads}")
        raise SpecError(f"tp={t} {problem} of {model.name}; {choose}")
    return t


def check_stages(model: ModelSpec, hw: HardwareSpec, stages, tp: int = 1) -> int:
    n = hw.num_dies // tp if stages is None else checks.integer("stages", stages, 1, LIMITS["dies"])
    if n * tp > hw.num_dies:
        raise SpecError(f"{n} stages of {tp} dies need {n * tp} dies but {hw.name} has {hw.num_dies}; "
                        f"use fewer stages, a smaller tp or a larger mesh")
    if n > model.layers:
        raise SpecError(f"{model.name} has {model.layers} layers, fewer than {n} pipeline stages; "
                        f"pass stages <= {model.layers} or a smaller mesh")
    return n


@functools.lru_cache(maxsize=256)
def _heaviest_stage(model: ModelSpec, hw: HardwareSpec, n: int, tp: int) -> tuple[int, float]:
    """The stage holding the most weight bytes per die and those bytes (cached: every simulation asks)."""
    w = costs.stage_weight_bytes(ModelParams.from_spec(model, np.float64), HardwareParams.from_spec(hw, np.float64),
                                 n, n, xp=np, tensor_parallel=float(tp))
    worst = int(np.argmax(w))
    return worst, float(w[worst])


def check_weights_fit(model: ModelSpec, hw: HardwareSpec, n: int, tp: int = 1) -> None:
    """Refuse a model whose largest stage cannot even hold its weights."""
    worst, weights = _heaviest_stage(model, hw, n, tp)
    usable = hw.hbm_capacity * hw.usable_hbm_fraction
    if weights > usable:
        need = model.total_params * hw.weight_bytes / usable
        raise SpecError(
            f"{model.name} does not fit {hw.name}: stage {worst} needs {weights / 1e9:.1f} GB of weights but a die "
            f"has {usable / 1e9:.1f} GB usable; use a mesh of at least ~{math.ceil(need)} dies "
            f"(e.g. --hardware mocap-RxC), a larger tp or a smaller model")


@functools.lru_cache(maxsize=64)
def searched_placement(hw: HardwareSpec, n: int, pairing: str, tp: int = 1) -> np.ndarray:
    """The placement minimising traffic-weighted hops for a pairing (cached): ``[N]`` dies, or with
    ``tp > 1`` the ``[N, tp]`` dies of each stage group (the group tile each stage occupies)."""
    from ..mbkr.placement import search_placement

    static = pairing if pairing in ("cross-half", "head-to-tail") else "cross-half"
    return search_placement(hw, n, static, tp=tp).placement


def _named_placement(placement, scheme: str, pairing: str) -> str | None:
    """The placement rule a name (or ``None``) stands for: searched for MBKR with partners, else snake."""
    if placement is None:
        return "searched" if scheme == "mbkr" and pairing != "none" else "snake"
    if isinstance(placement, str):
        if placement not in ("snake", "searched"):
            raise SpecError(f"placement must be 'snake', 'searched' or a list of die indices (with tp > 1: a list "
                            f"of groups of die indices), got {placement!r}.{checks.suggest(placement, ('snake', 'searched'))}")
        return placement
    return None


def check_group_placement(hw: HardwareSpec, placement, n: int, tp: int, scheme: str = "terapipe",
                          pairing: str = "cross-half") -> np.ndarray:
    """Dies of each stage group, ``[N, tp]``: the default groups ("snake"), the searched groups
    ("searched"; ``None`` means searched for MBKR with partners) or a nested list."""
    rule = _named_placement(placement, scheme, pairing)
    if rule is not None:
        try:
            return stage_groups(hw, n, tp) if rule == "snake" else searched_placement(hw, n, pairing, tp)
        except ValueError as e:
            raise SpecError(f"{e}, or list the dies of each group as placement") from None
    groups = checks.integers("placement", placement, 0, hw.num_dies - 1)
    if groups.shape != (n, tp) or len(np.unique(groups)) != n * tp:
        raise SpecError(f"placement must list {n} groups of {tp} distinct die indices in [0, {hw.num_dies}) "
                        f"(each group in ring order), got {np.asarray(placement).tolist()}")
    return groups


def check_placement(hw: HardwareSpec, placement, n: int, scheme: str, pairing: str, tp: int = 1) -> np.ndarray:
    """``None`` (searched for MBKR, snake otherwise), ``"snake"``, ``"searched"`` or N distinct die indices;
    with ``tp > 1`` the dies of each stage group (:func:`check_group_placement`)."""
    if tp > 1:
        return check_group_placement(hw, placement, n, tp, scheme, pairing)
    rule = _named_placement(placement, scheme, pairing)
    if rule is not None:
        return snake_placement(hw, n) if rule == "snake" else searched_placement(hw, n, pairing)
    pl = checks.integers("placement", placement, 0, hw.num_dies - 1)
    if pl.shape != (n,) or len(set(pl.tolist())) != n:
        raise SpecError(f"placement must list {n} distinct die indices in [0, {hw.num_dies}), got {np.asarray(placement).tolist()}")
    return pl


@dataclass(frozen=True)
class Config:
    """A resolved configuration (host-side, hashable parts plus NumPy arrays).

    Attributes:
      model, hardware: the specs.
      scheme: ``gpipe``, ``terapipe`` or ``mbkr``.
      seq_len: prompt tokens per request; batch: requests per batch.
      partition: ``[M]`` chunk sizes (chunked schemes; ``[S]`` one item for GPipe bookkeeping).
      microbatch: requests per GPipe microbatch.
      num_batches: consecutive batches simulated.
      release, admission: policies.
      placement: ``[N]`` die of each stage, or ``[N, tp]`` dies of each tensor-parallel stage group.
      mbkr: MBKR settings (used by ``mbkr``).
      dtype: float32 or float64.
    """

    model: ModelSpec
    hardware: HardwareSpec
    scheme: str
    seq_len: int
    batch: int
    partition: np.ndarray
    microbatch: int
    num_batches: int
    release: Release
    admission: Admission
    placement: np.ndarray
    mbkr: MBKRSettings
    dtype: np.dtype
    tp: int = 1

    @property
    def stages(self) -> int:
        return len(self.placement)

    @property
    def items_per_batch(self) -> int:
        return -(-self.batch // self.microbatch) if self.scheme == "gpipe" else len(self.partition)

    @property
    def mbkr_mode(self) -> MBKRMode:
        return self.mbkr.mode if self.scheme == "mbkr" else MBKRMode.OFF

    def shape(self, items: int | None = None, timeline_points: int = 0) -> SimShape:
        """The bucket of this configuration (``items`` slots: default the bucket of its item count)."""
        k = bucket(self.items_per_batch) if items is None else items
        return SimShape(items=k, stages=bucket(self.stages), batches=self.num_batches,
                        groups=k if self.scheme == "gpipe" else 1, release=self.release, admission=self.admission,
                        mbkr=self.mbkr_mode, spill=self.mbkr.spill_policy, timeline_points=timeline_points)

    def items(self, slots: int | None = None) -> ItemTable:
        """Host-side items of one batch, padded to ``slots`` (default the shape's bucket)."""
        slots = self.shape().items if slots is None else slots
        if self.scheme == "gpipe":
            return gpipe_items(self.seq_len, self.batch, self.microbatch, slots)
        return pad_items(chunked_items(self.partition, self.batch), slots)

    def point(self, slots: int | None = None) -> Point:
        return build_point(self.model, self.hardware, self.items(slots), self.placement, bucket(self.stages),
                           self.dtype, self.mbkr)

    def with_batch(self, batch: int) -> "Config":
        return replace(self, batch=int(batch))


def check_chunks(chunks) -> int:
    """A chunk count M of a chunked scheme, at most ``LIMITS["chunks"]``."""
    return checks.integer("chunks", chunks, 1, LIMITS["chunks"], above=" Use fewer, longer chunks.")


GPIPE_PARTITION = ("partition applies to the chunked schemes (terapipe, mbkr), not gpipe; GPipe splits the batch "
                   "by microbatch instead")


def resolve(model, hardware, seq_len, scheme: str = "terapipe", *, chunks=None, batch=1, partition=None,
            release: str = "stage", admission: str = "streaming", num_batches=2, microbatch=1, placement=None,
            stages=None, dtype="float32", pairing: str = "cross-half", p1=DEFAULT_P1, p2=DEFAULT_P2,
            read_overlap=DEFAULT_READ_OVERLAP, spill: str = "overflow", tp=1) -> Config:
    """Validate every argument of a simulation and build its :class:`Config` (``batch`` must be an int)."""
    m, hw = get_model(model), get_hardware(hardware)
    checks.choice("scheme", scheme, SCHEMES)
    rel = Release(checks.choice("release policy", release, RELEASE_POLICIES))
    adm = Admission(checks.choice("admission mode", admission, ADMISSION_MODES))
    S = checks.integer("seq_len", seq_len, 1, LIMITS["seq_len"], " Pass the prompt length in tokens, e.g. 65536.")
    B = checks.integer("batch", batch, 1, LIMITS["batch"], " Pass a number of requests.")
    nb = checks.integer("num_batches", num_batches, 1, LIMITS["num_batches"])
    micro = checks.integer("microbatch", microbatch, 1, LIMITS["batch"])
    if partition is not None:
        if scheme == "gpipe":
            raise SpecError(GPIPE_PARTITION)
        part = check_partition(partition, S)
        if chunks is not None and check_chunks(chunks) != len(part):
            raise SpecError(f"chunks={chunks} but the partition has {len(part)} chunks; pass one or the other")
    else:
        M = DEFAULT_CHUNKS if chunks is None else check_chunks(chunks)
        if scheme != "gpipe" and M > S:
            raise SpecError(f"{M} chunks need at least {M} tokens but seq_len is {S}; use fewer chunks")
        part = uniform_partition(S, M) if scheme != "gpipe" else np.array([S])
    if scheme == "gpipe" and -(-B // micro) > LIMITS["chunks"]:
        raise SpecError(f"{-(-B // micro)} GPipe microbatches exceed the {LIMITS['chunks']} items per batch the "
                        f"simulator holds; use a larger microbatch")
    settings = MBKRSettings(checks.choice("pairing", pairing, PAIRINGS), p1, p2, read_overlap, spill)
    t = check_tensor_parallel(m, hw, tp)
    n = check_stages(m, hw, stages, t)
    check_weights_fit(m, hw, n, t)
    pl = check_placement(hw, placement, n, scheme, pairing, t)
    return Config(model=m, hardware=hw, scheme=scheme, seq_len=S, batch=B, partition=part, microbatch=micro,
                  num_batches=nb, release=rel, admission=adm, placement=pl, mbkr=settings, dtype=check_dtype(dtype),
                  tp=t)
