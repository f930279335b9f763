"""What every command shares: the argument parser that reports one line, argument types, output-path
checks and the one table formatter."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

from ..mbkr.pairing import DEFAULT_P1, DEFAULT_P2, DEFAULT_READ_OVERLAP, PAIRINGS, SPILL_POLICIES
from ..specs import LIMITS, SpecError


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line on stderr and exit code 2 (no usage block)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _integer_text(text: str, lo: int, what: str) -> int:
    try:
        f = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not math.isfinite(f) or not f.is_integer():
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    v = int(text) if text.strip().lstrip("+-").isdigit() else int(f)
    if v < lo:
        raise argparse.ArgumentTypeError(f"expected {what}, got {v}")
    if v > 2 ** 62:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text}, too large to represent")
    return v


def positive_int(text: str) -> int:
    return _integer_text(text, 1, "a positive integer")


def non_negative_int(text: str) -> int:
    return _integer_text(text, 0, "a non-negative integer")


def seed(text: str) -> int:
    v = _integer_text(text, 0, f"a seed, an integer in [0, {LIMITS['seed']}]")
    if v > LIMITS["seed"]:
        raise argparse.ArgumentTypeError(f"expected a seed, an integer in [0, {LIMITS['seed']}], got {text}")
    return v


def number(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return v


def batch_arg(text: str):
    return "auto" if text == "auto" else positive_int(text)


def int_list(text: str) -> list[int]:
    parts = [x for x in text.replace(" ", "").split(",") if x]
    if not parts:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    return [non_negative_int(x) for x in parts]


def placement_arg(text: str | None):
    """snake, searched, comma-separated die indices, or groups of them separated by ';' (with --tp)."""
    if text is None or text in ("snake", "searched"):
        return text
    if ";" in text:
        return [int_list(group) for group in text.split(";") if group.strip()]
    return int_list(text)


#: defaults of the MBKR flags (the simulator's own), one table for the parser and for the check that a flag was given
MBKR_DEFAULTS = {"pairing": "cross-half", "p1": DEFAULT_P1, "p2": DEFAULT_P2, "read_overlap": DEFAULT_READ_OVERLAP,
                 "spill": "overflow"}


def add_mbkr_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("MBKR (schemes mbkr, mocap)")
    g.add_argument("--pairing", default=MBKR_DEFAULTS["pairing"], choices=PAIRINGS, help="stage pairing policy")
    g.add_argument("--p1", type=number, default=DEFAULT_P1,
                   help=f"creditor threshold, fraction of a stage's KV budget (default {DEFAULT_P1})")
    g.add_argument("--p2", type=number, default=DEFAULT_P2,
                   help=f"debtor threshold and creditor hosting limit (default {DEFAULT_P2})")
    g.add_argument("--read-overlap", type=number, default=DEFAULT_READ_OVERLAP,
                   help="fraction of local attention time that hides a remote KV read")
    g.add_argument("--spill", default=MBKR_DEFAULTS["spill"], choices=SPILL_POLICIES,
                   help="overflow: move only what cannot stay local (default); eager: also what lies above p2")


def mbkr_kwargs(args) -> dict:
    return dict(pairing=args.pairing, p1=args.p1, p2=args.p2, read_overlap=args.read_overlap, spill=args.spill)


def check_output_file(path: str | os.PathLike) -> Path:
    """A file the command may write: its folder exists (or can be made) and is writable, and the
    path is not a folder.  Checked before any work."""
    p = Path(path)
    if p.exists() and p.is_dir():
        raise SpecError(f"{str(p)!r} is a directory; pass a file name")
    parent = p.parent if str(p.parent) else Path(".")
    check_output_dir(parent, allow_existing=True)
    return p


def check_figure_file(path: str | os.PathLike) -> Path:
    """A figure the command may write: :func:`check_output_file`, and an extension naming a figure format."""
    from ..figures.style import check_figure_path

    return check_output_file(check_figure_path(path))


def check_csv_file(path: str | os.PathLike) -> Path:
    """A CSV file the command may write: :func:`check_output_file`, and the ``.csv`` extension."""
    p = check_output_file(path)
    if p.suffix.lower() != ".csv":
        raise SpecError(f"{str(p)!r}: this command writes CSV; give the file the .csv extension")
    return p


def check_output_dir(path: str | os.PathLike, allow_existing: bool = True, marker: str | None = None) -> Path:
    """A folder the command may write into, checked before any work: not a file, not under a file,
    writable; with ``marker``, a non-empty folder must hold that file (an earlier run of the same kind)."""
    p = Path(path)
    for parent in [p] + list(p.parents):
        if parent.exists() and not parent.is_dir():
            raise SpecError(f"cannot write to {str(p)!r}: {str(parent)!r} is a file, not a directory")
        if parent.exists():
            break
    existing = next(q for q in [p] + list(p.parents) if q.exists() or q == Path(q.anchor or "."))
    if existing.exists():
        try:                     # a real write, since permission bits do not bind root or special file systems
            with tempfile.TemporaryFile(dir=existing):
                pass
        except OSError as e:
            raise SpecError(f"cannot write to {str(p)!r}: {str(existing)!r} is not writable ({e.strerror})") from None
    if p.is_dir() and marker is not None and any(p.iterdir()) and not (p / marker).exists():
        raise SpecError(f"{str(p)!r} is a non-empty directory that holds no earlier run ({marker} is missing); "
                        f"pass an empty or new directory")
    if p.exists() and not allow_existing:
        raise SpecError(f"{str(p)!r} exists; pass a new path")
    return p


def finite(v: Any):
    """JSON-safe: non-finite floats become None."""
    return v if not isinstance(v, float) or math.isfinite(v) else None


def dumps(obj) -> str:
    """JSON with non-finite floats as null."""
    def clean(x):
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return finite(x)
    return json.dumps(clean(obj))


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and its noun, singular for one: ``counted(1, "stage")`` is "1 stage"."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def rate(v: float) -> str:
    """A rate as text: whole numbers with separators from 100 up, three significant figures below."""
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def fmt(v: Any, unit: str = "", digits: int = 4) -> str:
    """A value as text: '-' for None and inf, numbers to ``digits`` significant figures."""
    if hasattr(v, "item") and getattr(v, "ndim", 1) == 0:
        v = v.item()
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.{digits}g}{unit}"
    if isinstance(v, int):
        return f"{v:,}{unit}"
    return f"{v}{unit}"


def table(rows: Sequence[dict], columns: Sequence[tuple[str, str]], digits: int = 4) -> str:
    """A plain-text table: ``columns`` are (key, header) pairs; numbers right-aligned."""
    cells = [[fmt(r.get(k), digits=digits) for k, _ in columns] for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, (_, h) in enumerate(columns)]
    line = lambda vals: "  ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in enumerate(zip(vals, widths)))
    return "\n".join([line([h for _, h in columns]), line(["-" * w for w in widths])] + [line(c) for c in cells])


def progress(message: str, quiet: bool = False) -> None:
    """One line of progress on stderr (long commands), on the terminal before any output after it."""
    if not quiet:
        from .stderr_filter import sync

        print(message, file=sys.stderr, flush=True)
        sync()


@contextlib.contextmanager
def progress_bar(description: str, unit: str, quiet: bool = False):
    """A progress bar on stderr for the duration of the block; yields a callable taking ``(done, total)``
    (or None when ``quiet``).  The bar appears at the first report, so input refused before the work
    starts gets its one line of error alone."""
    if quiet:
        yield None
        return
    bars = []

    def advance(done: int, total: int) -> None:
        if not bars:
            from tqdm import tqdm

            bars.append(tqdm(total=total, desc=description, unit=unit, file=sys.stderr, dynamic_ncols=True))
        bars[0].update(done - bars[0].n)

    try:
        yield advance
    finally:
        for bar in bars:
            bar.close()
        if bars:
            from .stderr_filter import sync

            sync()  # the bar's last redraw is on the terminal before the command's next output
