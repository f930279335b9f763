"""Output files written whole or not at all: a run killed mid-write never leaves half a file.

Every file the package writes for a user (tables, step results, manifests, reports) goes through
:func:`write_atomic`: the text goes to a temporary file in the same directory, then ``os.replace``
puts it in place, which is atomic on one file system.
"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import Any, Callable, Sequence


def write_atomic(path: str | os.PathLike, data: bytes | str) -> Path:
    """Write ``data`` to ``path`` (creating its directory) through a temporary file and ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb" if isinstance(data, bytes) else "w", newline=None if isinstance(data, bytes) else "") as fh:
        fh.write(data)
    os.replace(tmp, path)
    return path


def write_rows(path: str | os.PathLike, rows: Sequence[dict[str, Any]],
               cell: Callable[[str, Any], Any] | None = None) -> Path:
    """Dict rows as CSV, atomically: the union of their keys in first-seen order, ``""`` where a row
    lacks a key, each value passed through ``cell(key, value)`` where given."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=keys)
    w.writeheader()
    for r in rows:
        w.writerow({k: cell(k, v) if cell else v for k, v in r.items()})
    return write_atomic(path, buf.getvalue())
