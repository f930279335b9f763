"""Running a sweep: checks, then blocks evaluated on the local devices, written as they finish, resumed,
split over hosts, and assembled.

Multi-host: when ``JAX_COORDINATOR_ADDRESS`` (host:port of process 0), ``JAX_NUM_PROCESSES`` and
``JAX_PROCESS_ID`` are set, :func:`run_sweep` calls ``jax.distributed.initialize``.  Every process
plans the same blocks and evaluates every ``num_processes``-th one on its own local devices into
the shared output directory; process 0 prepares the directory first and assembles the results
after a barrier, so the results equal a one-process run's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import jax
import numpy as np

from .. import __version__
from ..specs import SpecError, checks
from . import layout as files
from .config import MAX_BLOCK, load_sweep
from .evaluate import Evaluator
from ..specs.files import write_atomic
from .merge import CsvMerge, assemble
from .output import PartWriter
from .plan import Bucket, Plan


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
    format: str = "csv"
    bucket_labels: list = field(default_factory=list)
    #: merging the part files into the results file, seconds (part of ``wall_s``)
    assemble_s: float = 0.0

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
            raise SpecError(f"devices={devices}: use between 1 and {len(local)}, the local devices of this process")
        return local[: int(devices)]
    if isinstance(devices, (str, bytes)) or not isinstance(devices, Iterable):
        raise SpecError(f"devices must be None (every local device), a count, or a list of JAX devices; "
                        f"got {devices!r}")
    devices = list(devices)
    if not devices or not all(isinstance(d, jax.Device) for d in devices):
        raise SpecError(f"devices must name at least one device, each a JAX device (jax.local_devices()); "
                        f"got {devices!r}")
    return devices


def _check_flags(resume: bool, overwrite: bool) -> None:
    if resume and overwrite:
        raise SpecError("resume continues an earlier run and overwrite discards it; give one of them")


def check_run(source, out_dir=None, *, resume: bool = False, overwrite: bool = False, devices=None,
              format: str | None = None, max_points: int | None = None) -> None:
    """Make the checks :func:`run_sweep` makes before it evaluates anything, except free disk space,
    and change nothing: the sweep file, the flags, the devices and the output location (arguments as
    for :func:`run_sweep`).  A dry run uses it to say whether the run itself would start.

    Raises:
      SpecError: what the run would refuse, in the run's words.
    """
    _check_flags(resume, overwrite)
    cfg = load_sweep(source, max_points=max_points)
    _devices(devices)
    files.check(files.layout(out_dir, cfg.name, format), cfg.name, resume=resume, overwrite=overwrite)


def _barrier(failed: bool = False) -> bool:
    """Wait for every process; True if any process reported ``failed`` (one process: ``failed``)."""
    if jax.process_count() == 1:
        return failed
    from jax.experimental import multihost_utils

    return bool(np.any(multihost_utils.process_allgather(np.array([failed], np.int32))))


def _on_every_process(fn):
    """Run ``fn`` on every process and wait for all; if it failed anywhere, raise everywhere."""
    err = None
    try:
        out = fn()
    except Exception as e:   # re-raised below, after the other processes know
        err = e
    if _barrier(err is not None):
        raise err if err is not None else SpecError("another process of this multi-host run stopped; see its "
                                                    "message")
    return out


class _Parts:
    """Names of a run's part files: ``bBBB-KKKKKK-HASH.EXT`` for block K of bucket B, where HASH covers
    the configuration, the block layout and the package version (so a changed run never reuses them)."""

    def __init__(self, plan: Plan, cfg_hash: str, micro_batch: int, fmt: str):
        self.plan, self.cfg_hash, self.micro_batch, self.format = plan, cfg_hash, micro_batch, fmt
        self.buckets = plan.ordered()

    def micro(self, b: Bucket) -> int:
        """Points per vectorised step: fixed by the configuration and platform, never by the device count."""
        return max(1, min(self.micro_batch, self.plan.block_size, b.points)) if b.kind == "fast" else 0

    def name(self, b: Bucket, block: int) -> str:
        plan = self.plan
        h = hashlib.sha256(json.dumps([self.cfg_hash, plan.block_size, plan.serial_block_size, self.micro(b),
                                       __version__, list(b.key), block]).encode()).hexdigest()[:12]
        return f"b{b.index:03d}-{block:06d}-{h}.{self.format}"

    def block(self, name: str) -> tuple[Bucket, int] | None:
        """The block a file name belongs to in this run, or None."""
        m = files.PART.match(name)
        if not m or int(m[1]) >= len(self.buckets):
            return None
        b, k = self.buckets[int(m[1])], int(m[2])
        return (b, k) if k < self.plan.bucket_blocks(b) and name == self.name(b, k) else None

    def existing(self, directory) -> set:
        """Names of this run's part files already in ``directory``."""
        return {e for e in os.listdir(directory) if self.block(e)} if directory.is_dir() else set()

    def points(self, names) -> int:
        return sum(self.plan.block_points(*self.block(e)) for e in names)

    def all(self) -> list[list[str]]:
        return [[self.name(b, k) for k in range(self.plan.bucket_blocks(b))] for b in self.buckets]


def run_sweep(source, out_dir=None, *, resume: bool = False, devices=None, block_size: int | None = None,
              quiet: bool = False, limit: int | None = None, max_points: int | None = None,
              overwrite: bool = False, micro_batch: int | None = None, format: str | None = None) -> SweepSummary:
    """Run a sweep file (path, TOML text or dict) and write its results file.

    Args:
      source: sweep file path, TOML text, dict or :class:`~.config.SweepConfig`.
      out_dir: output directory (default ``sweep-results/<name>``), or a results file ending in
        ``.csv`` / ``.parquet`` (its manifest and parts then go to ``<out_dir>.sweep``).
      resume: skip blocks already written by an earlier (interrupted) run of the same sweep.
      devices: None (every local device), a count (the first n), or a list of devices.
      block_size: points per compiled call (default from the file, else 4096 on CPU / 32768 otherwise).
      quiet: no progress bar.
      limit: stop after about this many newly evaluated points (whole blocks); resume later.
      max_points: only the first ``max_points`` points of the sweep (changes the config hash).
      overwrite: delete an earlier run's files in ``out_dir`` first.
      micro_batch: points per vectorised step (default from the file, else 64 on CPU / 4096 otherwise).
      format: ``"csv"`` or ``"parquet"`` (default: the extension of ``out_dir``, else CSV).

    Returns:
      :class:`SweepSummary`.  ``results`` is None while the sweep is incomplete (``limit``).
    """
    t_start = time.perf_counter()
    _check_flags(resume, overwrite)
    maybe_init_distributed()
    cfg = load_sweep(source, max_points=max_points)
    devs = _devices(devices)
    nd, platform = len(devs), devs[0].platform
    bs = checks.integer("block_size", block_size or cfg.settings["block_size"] or (4096 if platform == "cpu" else 32768),
                        1, MAX_BLOCK)
    micro_default = checks.integer("micro_batch", micro_batch or cfg.settings["micro_batch"] or
                                   (64 if platform == "cpu" else 4096), 1, MAX_BLOCK)
    if limit is not None:
        limit = checks.integer("limit", limit, 1, 2 ** 62)
    lay = files.layout(out_dir, cfg.name, format)
    plan = Plan(cfg, bs, cfg.settings["serial_block_size"])
    nproc, pid = jax.process_count(), jax.process_index()
    names = _Parts(plan, cfg.config_hash, micro_default, lay.format)

    def check() -> set:
        files.check(lay, cfg.name, resume=resume, overwrite=overwrite)
        done = names.existing(lay.parts) if resume else set()
        pending = plan.points - names.points(done)
        rows = pending if limit is None else min(pending, (limit + bs) * nproc)
        files.check_disk(lay, rows + (plan.points if rows == pending else 0))
        return done

    def prepare() -> None:
        files.clear(lay, done)
        man = {"name": cfg.name, "source": cfg.origin, "config_hash": cfg.config_hash, "version": __version__,
               "points": plan.points, "block_size": bs, "serial_block_size": plan.serial_block_size,
               "format": lay.format, "config": cfg.canonical(),
               "buckets": [{"index": b.index, "key": list(b.key), "label": b.label(), "points": b.points,
                            "blocks": plan.bucket_blocks(b)} for b in names.buckets]}
        write_atomic(lay.manifest, json.dumps(man, indent=1, default=str) + "\n")

    done = _on_every_process(check)   # every process checks before process 0 changes anything
    _on_every_process(prepare if pid == 0 else lambda: None)
    dtype = np.dtype(cfg.settings["dtype"])
    exact = (platform == "cpu") if cfg.settings["exact"] is None else bool(cfg.settings["exact"])
    evaluator = Evaluator(devs, dtype, exact)
    prov = {"mocap_jax_version": __version__, "config_hash": cfg.config_hash, "device_kind": devs[0].device_kind,
            "devices": nd}
    writer = PartWriter(plan.space, lay.format, prov, dtype)
    bar = None
    if not quiet:
        from tqdm import tqdm

        total = -(-(plan.points - names.points(done)) // nproc)
        bar = tqdm(total=total if limit is None else min(total, limit), unit="pt", unit_scale=True, file=sys.stderr,
                   dynamic_ncols=True, desc=f"sweep {cfg.name}", smoothing=0.05)
    counts = {"evaluated": 0, "skipped": 0, "blocks": 0}
    # one process writing CSV merges each part into the results file as it is written (every part
    # arrives in its bucket's block order), so that merge overlaps the evaluation; otherwise process 0
    # merges every part at the end.  An incomplete run drops the partial file and keeps its parts.
    merge = CsvMerge(lay.results, [plan.bucket_blocks(b) for b in names.buckets]) \
        if nproc == 1 and lay.format == "csv" else None

    def evaluate_blocks() -> None:
        """This process's blocks: each written by a writer thread while the next ones evaluate (at most
        two blocks' results wait to be written, so memory stays bounded by the block size).  Formatting
        a part file is Python work that would otherwise hold up the next block's start."""
        submitted, writing = 0, []
        with ThreadPoolExecutor(1, thread_name_prefix="sweep-writer") as pool:
            for g, (b, k, ids) in enumerate(plan.blocks()):
                if g % nproc != pid:
                    continue
                name = names.name(b, k)
                if name in done:
                    counts["skipped"] += len(ids)
                    if merge is not None:   # in order with the parts being written
                        writing.append(pool.submit(merge.add, b.index, lay.parts / name))
                    continue
                if limit is not None and submitted >= limit:
                    break
                submitted += len(ids)
                r = plan.resolver.resolve(ids)
                micro = names.micro(b)
                unit = max(micro, 1) * nd
                size = -(-min(bs, b.points) // unit) * unit
                job = evaluator.start(b.key, r, micro=micro, size=size, label=b.label())
                while len(writing) >= 2:
                    writing.pop(0).result()
                writing.append(pool.submit(write, b, name, r, job))
            for w in writing:
                w.result()

    def write(b: Bucket, name: str, r, job) -> None:
        writer.write(lay.parts / name, r, job.result(), b.index)
        if merge is not None:
            merge.add(b.index, lay.parts / name)
        counts["evaluated"] += len(r.ids)
        counts["blocks"] += 1
        if bar is not None:
            bar.update(len(r.ids))

    try:
        try:
            _on_every_process(evaluate_blocks)
        finally:
            if bar is not None:
                bar.close()
        complete = len(names.existing(lay.parts)) == plan.num_blocks()

        def assemble_results() -> int | None:   # process 0; the others wait for it
            if not complete or pid != 0:
                return None
            if merge is not None:
                return merge.finish()
            return assemble(lay.results, [[lay.parts / e for e in bucket] for bucket in names.all()], writer)

        t_assemble = time.perf_counter()
        feasible = _on_every_process(assemble_results)
        assemble_s = time.perf_counter() - t_assemble
    finally:
        if merge is not None:
            merge.discard()                     # nothing left to drop once finished
    return SweepSummary(
        name=cfg.name, out_dir=str(lay.work), results=str(lay.results) if complete else None, points=plan.points,
        evaluated=counts["evaluated"], skipped=counts["skipped"], feasible=feasible, buckets=len(names.buckets),
        blocks=plan.num_blocks(), blocks_done=counts["blocks"], compiles=evaluator.compiles, compile_s=evaluator.compile_s,
        wall_s=time.perf_counter() - t_start, devices=nd, device_kind=devs[0].device_kind, block_size=bs,
        micro_batch=micro_default, config_hash=cfg.config_hash, complete=complete, format=lay.format,
        bucket_labels=[b.label() for b in names.buckets], assemble_s=assemble_s)
