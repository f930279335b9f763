"""Where a run's files go, and the checks on them made before any work.

``out`` is either a directory (``OUT/results.csv`` or ``OUT/results.parquet``, ``OUT/manifest.json``,
``OUT/parts/``) or a results file ending in ``.csv`` or ``.parquet``, whose manifest and parts then
live in the directory ``OUT.sweep`` beside it.  An ``out`` that does not exist yet and ends in
another data format's extension (``.json``, ``.tsv``, ``.xlsx``, ...) is refused rather than made a
directory of that name.  Before anything is computed, :func:`check` refuses,
with one line: an ``out`` that is a file (or lies under one), a location that cannot be written,
a non-empty directory that is not an earlier run of the same sweep, and a run whose files would not
fit the free disk space.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..specs import SpecError, checks
from .output import FORMATS

PART = re.compile(r"^b(\d{3,})-(\d{6,})-[0-9a-f]{12}\.(csv|parquet)$")
#: bytes a row takes on disk, an upper bound: million.toml's CSV rows average 405 B; Parquet's
#: typed, dictionary-encoded and compressed columns take a fraction of that
ROW_BYTES = {"csv": 512, "parquet": 256}
#: extensions of data formats the results are not written in: a new ``out`` ending in one names a
#: results file in a format we do not write, not a directory (a directory so named would surprise)
OTHER_FORMATS = (".json", ".jsonl", ".ndjson", ".tsv", ".txt", ".xlsx", ".xls", ".ods", ".pq", ".parq", ".feather",
                 ".arrow", ".ipc", ".orc", ".avro", ".h5", ".hdf5", ".npy", ".npz", ".pkl", ".pickle", ".db",
                 ".sqlite")


@dataclass(frozen=True)
class Layout:
    """The files of one run."""

    work: Path      # manifest.json and parts/
    results: Path   # the assembled results file
    format: str     # "csv" or "parquet"

    @property
    def parts(self) -> Path:
        return self.work / "parts"

    @property
    def manifest(self) -> Path:
        return self.work / "manifest.json"

    @property
    def file_mode(self) -> bool:
        return self.results.parent != self.work


def layout(out, name: str, fmt: str | None = None) -> Layout:
    """The layout for ``out`` (default ``sweep-results/NAME``); ``fmt`` defaults to the extension of
    ``out`` when it names a file, else ``csv``."""
    if fmt is not None:
        checks.choice("format", fmt, tuple(FORMATS))
    out = Path(out) if out is not None else Path("sweep-results") / name
    suffix = out.suffix.lower()
    if suffix in (".csv", ".parquet"):
        if fmt not in (None, suffix[1:]):
            raise SpecError(f"--out {out} ends in {suffix} but the format is {fmt}; use one or the other")
        return Layout(work=out.with_name(out.name + ".sweep"), results=out, format=suffix[1:])
    if suffix in OTHER_FORMATS and not os.path.lexists(out):
        raise SpecError(f"--out {out}: results are written as .csv or .parquet, not {suffix}; name a results file "
                        f"{out.stem}.csv or {out.stem}.parquet, or a directory")
    fmt = fmt or "csv"
    return Layout(work=out, results=out / f"results{FORMATS[fmt]}", format=fmt)


def _nearest_existing(p: Path) -> Path:
    p = p.absolute()
    while not os.path.lexists(p):
        p = p.parent
    return p


def _check_location(p: Path, what: str) -> None:
    """``p`` (to be a directory, or a file when ``what`` is 'file') is not blocked by a file above it."""
    if os.path.lexists(p):
        if what == "directory" and not p.is_dir():
            raise SpecError(f"--out {p} is a file, not a directory; choose a directory (or a name ending in "
                            f".csv/.parquet for the results file)")
        if what == "file" and p.is_dir():
            raise SpecError(f"--out {p} is a directory; a results file name must not name one")
        return
    anc = _nearest_existing(p)
    if not anc.is_dir():
        raise SpecError(f"--out {p}: {anc} is a file, not a directory")


def _check_writable(p: Path, shown: Path) -> None:
    """A file can be created in ``p``'s nearest existing directory (a real attempt: permissions, read-only
    file systems and quotas all show), or say why not."""
    anc = _nearest_existing(p)
    try:
        fd, probe = tempfile.mkstemp(prefix=".mocap-jax-probe-", dir=anc)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise SpecError(f"--out {shown}: cannot write there ({e.strerror or e} in {anc}); choose a writable "
                        f"location") from None


def _earlier_run(lay: Layout) -> dict | None:
    """The manifest of the run in ``lay.work``, ``{}`` for parts without one, None for an empty or
    missing directory; refuses a directory holding anything else."""
    if not lay.work.is_dir():
        return None
    entries = sorted(os.listdir(lay.work))
    if not entries:
        return None
    ours = {"manifest.json", "parts"} | {f"results{ext}" for ext in FORMATS.values()}
    foreign = [e for e in entries if e not in ours and ".tmp" not in e]
    if lay.parts.is_dir():
        foreign += [f"parts/{e}" for e in sorted(os.listdir(lay.parts)) if not PART.match(e) and ".tmp" not in e]
    if foreign:
        raise SpecError(f"--out {lay.work} is a non-empty directory that is not a sweep's output (it holds "
                        f"{foreign[0]!r}); choose an empty or new directory")
    if not lay.manifest.exists():
        return {}
    try:
        man = json.loads(lay.manifest.read_text())
        if not isinstance(man, dict) or "name" not in man:
            raise ValueError
    except (ValueError, OSError):
        raise SpecError(f"--out {lay.work}: {lay.manifest.name} is not a sweep manifest; choose another "
                        f"directory") from None
    return man


def check(lay: Layout, name: str, *, resume: bool, overwrite: bool) -> dict | None:
    """The checks on the output location that change nothing; returns the earlier run's manifest (or None)."""
    _check_location(lay.work, "directory")
    if lay.file_mode:
        _check_location(lay.results, "file")
    _check_writable(lay.work, lay.results if lay.file_mode else lay.work)
    if lay.parts.is_dir():
        _check_writable(lay.parts, lay.work)
    man = _earlier_run(lay)
    if man is not None:
        if man and man["name"] != name and not overwrite:
            raise SpecError(f"--out {lay.work} holds the sweep {man['name']!r}, not {name!r}; choose another "
                            f"--out, or pass --overwrite to replace it")
        if not resume and not overwrite:
            done = sum(1 for e in os.listdir(lay.parts) if PART.match(e)) if lay.parts.is_dir() else 0
            raise SpecError(f"{lay.work} already holds a sweep ({done} finished blocks); pass --resume to "
                            f"continue it, --overwrite to start again, or choose another --out")
    elif lay.file_mode and lay.results.exists() and not overwrite:
        raise SpecError(f"--out {lay.results} exists and is not from a run of this sweep (no {lay.work.name} "
                        f"beside it); pass --overwrite to replace it, or choose another name")
    return man


def check_disk(lay: Layout, rows: int) -> None:
    """Refuse a run whose part and results files (``rows`` rows in all) would not fit the free space."""
    need = rows * ROW_BYTES[lay.format]
    free = shutil.disk_usage(_nearest_existing(lay.work)).free
    if need > free:
        raise SpecError(f"--out {lay.work}: the run would write about {need / 1e9:,.1f} GB ({rows:,} rows of part "
                        f"and results files at up to {ROW_BYTES[lay.format]} B each) but {free / 1e9:,.1f} GB is "
                        f"free there; free space, choose another --out, or run part of it (--limit, max_points)")


def clear(lay: Layout, keep: set | None) -> None:
    """Remove an earlier run's files: every part not in ``keep`` (all with None), the results file,
    the manifest, and temporary files left by an interrupted write."""
    for d in (lay.work, lay.parts):
        if not d.is_dir():
            continue
        for e in os.listdir(d):
            p = d / e
            if ".tmp" in e or (d == lay.parts and PART.match(e) and (keep is None or e not in keep)):
                p.unlink()
    for p in (lay.results, lay.manifest):
        if p.exists():
            p.unlink()
    tmp_dir = lay.results.parent
    if lay.file_mode and tmp_dir.is_dir():
        for e in os.listdir(tmp_dir):
            if e.startswith(lay.results.name + ".tmp"):
                (tmp_dir / e).unlink()
    try:
        lay.parts.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SpecError(f"--out {lay.work}: cannot create it ({e.strerror or e})") from None
