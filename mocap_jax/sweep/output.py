"""Sweep output: the columns, CSV and Parquet part files (atomic), and the final, point-ordered results.

Every block becomes one part file, written to a temporary name and renamed into place
(``os.replace``), so a part file is either complete or absent: a run killed at any moment leaves
a directory that ``resume`` continues.  The parts are merged in point order into the results file
by :mod:`mocap_jax.sweep.merge`.

Two formats, chosen by the results file's extension:

* ``.csv``: text, one row per point, cells that do not apply empty; numbers as the shortest text
  that reads back to the same float32/float64 value; identical inputs give byte-identical files.
* ``.parquet``: typed columns (Parquet through pyarrow, readable by pandas and polars); simulated
  outputs keep the run's float dtype, cells that do not apply are null, and ``batch`` is null for
  ``"auto"``.  Needs the optional dependency: ``pip install "mocap_jax[parquet]"``.
"""

from __future__ import annotations

import csv
import io
import math
import os
from pathlib import Path

import numpy as np

from ..specs import SpecError
from ..specs.files import write_atomic
from .config import DIE_FIELDS

FORMATS = {"csv": ".csv", "parquet": ".parquet"}
OUTPUT_COLUMNS = (
    "feasible", "reason", "prefill_latency_s", "raw_latency_s", "throughput_rps", "period_s", "bubble_fraction",
    "batch_used", "max_peak_mem_bytes", "max_kv_peak_bytes", "max_stage_weight_bytes",
    "usable_hbm_bytes", "max_stage_utilisation", "spilled_bytes", "remote_read_s", "remote_read_unhidden_s",
    "spill_write_s", "blocking_s", "migrate_s", "mbkr_converged", "load_rps", "e2e_mean_s", "e2e_p50_s", "e2e_p99_s",
    "load_throughput_rps", "partition",
)
INPUT_COLUMNS = ("scheme", "model", "hardware", "rows", "cols", "wafers", "stages", "tp", "seq_len", "chunks", "batch",
                 "microbatch", "placement", "release", "admission", "num_batches", "pairing", "p1", "p2",
                 "read_overlap", "load", "requests", "arrivals", "granularity", "chains", "steps", "objective",
                 "max_batch", "seed") + DIE_FIELDS
RESOLVED_INPUTS = ("model", "hardware", "rows", "cols", "wafers", "stages") + DIE_FIELDS
PROVENANCE_COLUMNS = ("mocap_jax_version", "config_hash", "device_kind", "devices", "bucket")
COLUMNS = ("point_id",) + INPUT_COLUMNS + OUTPUT_COLUMNS + PROVENANCE_COLUMNS
assert len(set(COLUMNS)) == len(COLUMNS)
#: position of the ``feasible`` column in a results row
FEASIBLE_COLUMN = COLUMNS.index("feasible")

# Parquet column types ("sim": the run's float dtype)
_STRINGS = {"scheme", "model", "hardware", "placement", "release", "admission", "pairing", "arrivals", "objective",
    "reason", "partition", "mocap_jax_version", "config_hash", "device_kind"}
_INTS = {"point_id", "rows", "cols", "wafers", "stages", "tp", "seq_len", "chunks", "batch", "microbatch", "num_batches",
         "requests", "granularity", "chains", "steps", "max_batch", "seed", "batch_used", "devices", "bucket"}
_NUMPY_TYPES = {"bool": np.bool_, "int64": np.int64, "float": np.float32, "double": np.float64}
_FLOAT64 = {"p1", "p2", "read_overlap", "load", "load_rps", *DIE_FIELDS}


def fmt(v) -> str:
    """A value as CSV text (empty for None)."""
    if v is None:
        return ""
    if isinstance(v, (bool, np.bool_)):
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


def pyarrow():
    """The pyarrow module, or one clear error saying how to install it."""
    try:
        import pyarrow as pa
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise SpecError('Parquet output needs pyarrow: pip install "mocap_jax[parquet]" (or pip install pyarrow), '
                        'or write CSV') from None
    return pa


class PartWriter:
    """Turns a block's resolved inputs and output columns into one part file (CSV or Parquet)."""

    def __init__(self, space, fmt_name: str, provenance: dict, dtype):
        self.space = space
        self.format = fmt_name
        self.provenance = provenance
        self.dtype = np.dtype(dtype)
        # keys written as given (the rest are resolved: model and hardware names, mesh and die values)
        self._text = {k: np.array([fmt(v) for v in t], dtype=object) for k, t in space.tables.items()
                      if k in INPUT_COLUMNS and k not in RESOLVED_INPUTS}
        if fmt_name == "parquet":
            self.pa = pyarrow()

    def _csv_inputs(self, r) -> dict:
        cols = {}
        for k in INPUT_COLUMNS:
            if k == "stages":
                cols[k] = _csv_cells(r.stages, len(r.ids))
            elif k in self._text:
                cols[k] = _pick(self._text[k], r.codes[k])
            else:   # resolved models or hardware: distinct texts (a die field not swept has one for all)
                values, index = _resolved_values(k, r)
                texts, which = np.unique(np.array([fmt(v) for v in values], dtype=object), return_inverse=True)
                cols[k] = _pick(texts, which.reshape(-1)[index])
        return cols

    def _arrow_inputs(self, r) -> dict:
        pa = self.pa
        cols = {"stages": pa.array(r.stages, pa.int64())}
        for k in INPUT_COLUMNS:
            if k == "stages":
                continue
            if k in self._text:
                values, index = [None if v == "auto" else v for v in self.space.tables[k]], r.codes[k]
            else:
                values, index = _resolved_values(k, r)
            cols[k] = pa.array(values, type=self.arrow_type(k)).take(pa.array(index))
        return cols

    def write(self, path: Path, r, outputs: dict, bucket: int) -> None:
        if self.format == "csv":
            write_atomic(path, self.csv_text(r, outputs, bucket))
        else:
            import pyarrow.parquet as pq

            tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
            pq.write_table(self.table(r, outputs, bucket), tmp)
            os.replace(tmp, path)

    def csv_text(self, r, outputs: dict, bucket: int) -> str:
        P = len(r.ids)
        cols = {"point_id": r.ids.astype(str).astype(object), **self._csv_inputs(r)}
        for k in OUTPUT_COLUMNS:
            cols[k] = _csv_cells(outputs.get(k), P)
        for k in PROVENANCE_COLUMNS:
            cols[k] = str(bucket if k == "bucket" else self.provenance[k])
        ordered = [cols[k] for k in COLUMNS]
        texts = lambda c: {c} if isinstance(c, str) else set(c)      # a column's distinct texts
        if any(("," in v) or ('"' in v) or ("\n" in v) for k in ("model", "hardware", "reason")
               for v in texts(cols[k])):
            buf = io.StringIO()
            full = [np.full(P, c, dtype=object) if isinstance(c, str) else c for c in ordered]
            csv.writer(buf, lineterminator="\n").writerows(zip(*full))
            return buf.getvalue()
        return _lines(ordered, P)

    def arrow_type(self, k: str):
        pa = self.pa
        if k in ("feasible", "mbkr_converged"):
            return pa.bool_()
        if k in _STRINGS:
            return pa.string()
        if k in _INTS:
            return pa.int64()
        if k in _FLOAT64:
            return pa.float64()
        return pa.float32() if self.dtype == np.float32 else pa.float64()

    def schema(self):
        return self.pa.schema([(k, self.arrow_type(k)) for k in COLUMNS])

    def table(self, r, outputs: dict, bucket: int):
        pa = self.pa
        P = len(r.ids)
        cols = {"point_id": pa.array(r.ids, pa.int64()), **self._arrow_inputs(r)}
        for k in OUTPUT_COLUMNS:
            v = outputs.get(k)
            if v is None:
                v = np.full(P, None, dtype=object)
            elif k in ("reason", "partition"):
                v = np.array([x or None for x in v], dtype=object)
            cols[k] = v
        for k in PROVENANCE_COLUMNS:
            cols[k] = np.full(P, bucket if k == "bucket" else self.provenance[k],
                              dtype=np.int64 if k in _INTS else object)
        arrays = []
        for k in COLUMNS:
            v, t = cols[k], self.arrow_type(k)
            if isinstance(v, pa.Array):
                arrays.append(v)
            elif v.dtype == object:
                arrays.append(pa.array(v.tolist(), type=t))
            else:
                arrays.append(pa.array(v.astype(_NUMPY_TYPES[str(t)]), type=t))
        return pa.Table.from_arrays(arrays, schema=self.schema())


def _resolved_values(k: str, r) -> tuple[list, np.ndarray]:
    """Distinct values of a resolved input column and each point's index into them."""
    if k == "model":
        return [m.name for m in r.models], r.codes["model"]
    return [h.name if k == "hardware" else getattr(h, k) for h in r.hw_specs], r.hw_inv


# A block's CSV cells, column by column: one text per row, or a single text when every row has the
# same (a block of a sweep repeats most inputs and the provenance in every row); :func:`_lines` then
# writes a shared text once into the line pattern instead of joining it into each row.

def _csv_cells(v, P: int):
    """The CSV texts of one column of ``P`` values (``None``: empty cells)."""
    if v is None:
        return ""
    if v.dtype.kind not in "biuf":      # texts (or None), each distinct one formatted once
        texts = _Texts()
        cells = np.array(list(map(texts.__getitem__, v.tolist())), dtype=object)
        return cells[0] if len(texts) == 1 else cells
    # each distinct number formatted once (by bit pattern, so -0.0 stays itself)
    bits, inv = np.unique(v.view(f"u{v.dtype.itemsize}"), return_inverse=True)
    distinct = bits.view(v.dtype)
    texts = (np.where(distinct, "true", "false") if v.dtype == bool else distinct.astype(str)).astype(object)
    return texts[0] if len(texts) == 1 else texts[inv.reshape(-1)]


class _Texts(dict):
    """:func:`fmt` of each distinct text column value (strings or None), formatted once."""

    def __missing__(self, v):
        text = self[v] = fmt(v)
        return text


def _pick(texts: np.ndarray, index: np.ndarray):
    """``texts[index]``, or the one text when every row has the same index."""
    index = np.asarray(index)
    if len(index) and (index == index[0]).all():
        return texts[index[0]]
    return texts[index]


def _lines(columns: list, P: int) -> str:
    """CSV lines of ``P`` rows from columns of texts (nothing to quote).  The texts shared by every row
    and the commas between them become one separator each, so each row joins only its own cells:
    one ``str.join`` of the rows' cells and separators interleaved (the csv module, or a join per
    row, costs several times more)."""
    pieces, own, sep = [], [], []
    for i, c in enumerate(columns):
        sep.append("," if i else "")
        if isinstance(c, str):
            sep.append(c)
        else:
            pieces.append("".join(sep))
            own.append(c)
            sep = []
    pieces.append("".join(sep) + "\n")
    cells = np.empty((P, 2 * len(own) + 1), dtype=object)
    cells[:, 0::2] = pieces
    for j, c in enumerate(own):
        cells[:, 2 * j + 1] = c
    return "".join(cells.ravel().tolist())


def read_results(path) -> list[dict]:
    """Rows of a results file as dicts (small sweeps; tests and notebooks): strings from a CSV file,
    typed values (None where a cell does not apply) from a Parquet file."""
    path = Path(path)
    if path.suffix == ".parquet":
        pyarrow()
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))
