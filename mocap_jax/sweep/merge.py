"""The results file of a sweep: its part files merged in point order.

A part file holds one block's rows, sorted by point id; each bucket's blocks follow one another in
id order.  The merge streams them (memory stays bounded by one part per bucket) into a temporary
file beside the results file and renames it into place once every part is in, so the results file
is either complete or absent.  A CSV merge can take each part as the sweep writes it
(:class:`CsvMerge`), so the results are written while the sweep runs; :func:`assemble` merges
finished parts (Parquet by row groups of :data:`ROW_GROUP` ids).
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np

from .output import COLUMNS, FEASIBLE_COLUMN, PartWriter


def assemble(results: Path, parts: list[list[Path]], writer: PartWriter | None = None) -> int:
    """Merge the part files (``parts[bucket]`` in block order, each sorted by point id) into one
    results file in point order; return the number of feasible points."""
    if results.suffix == ".parquet":
        return _assemble_parquet(results, parts, writer)
    merge = CsvMerge(results, [len(files) for files in parts])
    try:
        for bucket, files in enumerate(parts):
            for path in files:
                merge.add(bucket, path, write=False)
        return merge.finish()
    except BaseException:
        merge.discard()
        raise


class CsvMerge:
    """The results CSV, merged from the part files in point order, as far as the parts at hand allow.

    Each bucket's parts hold increasing point ids and arrive in block order (:meth:`add`), so every
    line up to the smallest last id of the buckets' current parts can be written as soon as every
    bucket with parts still to come has one at hand: those lines of every current part are put in
    order together (one sort of their ids), and a bucket's next part is read once its current one is
    used up.  Memory stays bounded by one part per bucket; a sweep adds each part as it is written,
    so the results file is written while the sweep runs.  The file appears under its name only when
    :meth:`finish` has merged every part (until then it is a temporary file beside it).

    Args:
      results: the results file.
      blocks: ``[bucket]`` number of parts of each bucket.
    """

    def __init__(self, results: Path, blocks: list[int]):
        self.results = results
        self.tmp = results.with_name(f"{results.name}.tmp{os.getpid()}")
        self.left = list(blocks)                         # parts of each bucket not yet used up
        self.paths = [[] for _ in blocks]                # parts added, not yet read
        self.current = [None] * len(blocks)              # (ids, lines) of each bucket's part in use
        self.feasible = 0
        self.fh = open(self.tmp, "wb")
        self.fh.write((",".join(COLUMNS) + "\n").encode())

    def add(self, bucket: int, path: Path, write: bool = True) -> None:
        """The next part of ``bucket``; with ``write``, merge every line it makes writable."""
        self.paths[bucket].append(path)
        if write:
            self._write()

    def _head(self, b: int):
        """Bucket ``b``'s part in use (read from disk when needed), or None if none is at hand."""
        while self.current[b] is None and self.paths[b]:
            with open(self.paths[b].pop(0), newline="") as fh:
                lines = fh.readlines()
            if lines:
                self.current[b] = np.fromiter((int(x[: x.index(",")]) for x in lines), np.int64, len(lines)), lines
            else:
                self.left[b] -= 1
        return self.current[b]

    def _write(self) -> None:
        while True:
            live = [b for b, n in enumerate(self.left) if n > 0]
            heads = [self._head(b) for b in live]
            if not live or any(h is None for h in heads):
                return
            bound = min(h[0][-1] for h in heads)
            ids, lines = [], []
            for b, (hid, hlines) in zip(live, heads):
                n = int(np.searchsorted(hid, bound, side="right"))
                ids.append(hid[:n])
                lines += hlines[:n]
                if n < len(hlines):
                    self.current[b] = hid[n:], hlines[n:]
                else:
                    self.current[b] = None
                    self.left[b] -= 1
            order = np.argsort(np.concatenate(ids), kind="stable")
            lines = [lines[i] for i in order.tolist()]
            text = "".join(lines).encode()
            self.feasible += _count_feasible(text, lines)
            self.fh.write(text)

    def finish(self) -> int:
        """Merge what is left, put the file under its name; the number of feasible points."""
        self._write()
        missing = [b for b, n in enumerate(self.left) if n > 0]
        if missing:
            raise RuntimeError(f"results of buckets {missing} are incomplete: parts missing")
        self.fh.close()
        os.replace(self.tmp, self.results)
        return self.feasible

    def discard(self) -> None:
        """Drop the partial file (an interrupted or incomplete sweep keeps its parts, not this); after
        :meth:`finish`, nothing is left to drop."""
        self.fh.close()
        self.tmp.unlink(missing_ok=True)


def _count_feasible(text: bytes, lines: list[str]) -> int:
    """Rows of ``lines`` (``text``: the same, UTF-8) whose ``feasible`` cell is true.  A line without
    quotes has one comma fewer than the columns, so the cell follows a known comma of the text."""
    buf = np.frombuffer(text, np.uint8)
    commas = np.flatnonzero(buf == ord(","))
    per = len(COLUMNS) - 1
    if b'"' in text or len(commas) != per * len(lines):
        return sum(next(csv.reader([x]))[FEASIBLE_COLUMN] == "true" for x in lines)
    # the cell is followed by more columns, so its five bytes lie inside the text
    at = commas.reshape(len(lines), per)[:, FEASIBLE_COLUMN - 1] + 1
    cell = buf[at[:, None] + np.arange(5)]
    return int(np.sum(np.all(cell == np.frombuffer(b"true,", np.uint8), axis=1)))


#: rows per row group of the assembled Parquet file
ROW_GROUP = 1 << 16


def _assemble_parquet(results: Path, parts: list[list[Path]], writer: PartWriter) -> int:
    """Window merge: row group ``g`` holds ids ``[g * ROW_GROUP, (g + 1) * ROW_GROUP)``, taken from the
    head of every bucket's stream of parts (each stream is sorted, every id appears once)."""
    pa = writer.pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    streams = [iter(files) for files in parts]
    heads = [None] * len(parts)   # the loaded, not yet written rows of each stream (a Table)
    tmp = results.with_name(f"{results.name}.tmp{os.getpid()}")
    feasible = 0
    lo = 0
    with pq.ParquetWriter(tmp, writer.schema()) as out:
        while True:
            hi = lo + ROW_GROUP
            pieces = []
            for i, files in enumerate(streams):
                while heads[i] is None or (len(heads[i]) and heads[i]["point_id"][-1].as_py() < hi):
                    nxt = next(files, None)
                    if nxt is None:
                        break
                    t = pq.read_table(nxt)
                    heads[i] = t if heads[i] is None else pa.concat_tables([heads[i], t])
                h = heads[i]
                if h is None or not len(h):
                    continue
                n = int(np.searchsorted(h["point_id"].to_numpy(), hi))
                pieces.append(h.slice(0, n))
                heads[i] = h.slice(n)
            pieces = [p for p in pieces if len(p)]
            if not pieces:
                break
            group = pa.concat_tables(pieces)
            group = group.take(pc.sort_indices(group["point_id"]))
            feasible += int(pc.sum(group["feasible"].cast(pa.int64())).as_py() or 0)
            out.write_table(group)
            lo = hi
    os.replace(tmp, results)
    return feasible


__all__ = ["assemble", "CsvMerge", "ROW_GROUP"]
