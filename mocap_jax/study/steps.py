"""Finished steps of a long study kept on disk, so that an interrupted run resumes where it stopped.

``mocap-jax reproduce`` runs for more than an hour and ``mocap-jax claims --run`` for tens of minutes,
as a sequence of independent steps (one comparison per model and length, one sensitivity variant
after another).  Each finished step's result is written, atomically, to one JSON file in the
store's directory, named by a hash of everything the step depends on (its inputs and the package
version).  A run with ``resume=True`` takes a step's result from its file when the file's inputs
equal the step's; any other step runs.  A run that finishes removes the directory.  The inputs
name the package version, not the code: after changing the simulator itself, run without resume.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Callable

from ..specs.files import write_atomic


def _plain(obj: Any) -> Any:
    """A step input as JSON: dataclasses by their fields, anything else by its ``repr``."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    return repr(obj)


class StepStore:
    """Results of finished steps under ``directory`` (one JSON file per step).

    Args:
      directory: where the step files go (created on the first write).
      resume: take a step's result from its file when an earlier run wrote it with the same inputs.
    """

    def __init__(self, directory: str | os.PathLike, resume: bool = False):
        self.directory = Path(directory)
        self.resume = resume
        self.reused = 0
        self.last_reused = False  # whether the latest step came from its file

    def run(self, label: str, inputs: dict, compute: Callable[[], Any]) -> Any:
        """``compute()``, or with ``resume`` the value an earlier run stored for the same ``label`` and ``inputs``.

        The value must be JSON data (dicts, lists, strings, numbers including inf, booleans, None).
        """
        from .. import __version__

        key = json.dumps({"step": label, "version": __version__, **inputs}, sort_keys=True, default=_plain)
        slug = re.sub(r"[^A-Za-z0-9.]+", "-", label).strip("-")[:60]
        path = self.directory / f"{slug}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
        if self.resume and path.exists():
            try:
                stored = json.loads(path.read_text())
                if stored["key"] == key:
                    self.reused += 1
                    self.last_reused = True
                    return stored["value"]
            except (ValueError, KeyError, TypeError):
                pass  # a file this store did not write whole: compute the step again
        self.last_reused = False
        value = compute()
        write_atomic(path, json.dumps({"key": key, "value": value}))
        return value

    def finish(self) -> None:
        """Remove the stored steps once the run that needed them is complete."""
        shutil.rmtree(self.directory, ignore_errors=True)
