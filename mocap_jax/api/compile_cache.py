"""A persistent compilation cache: compiled programs kept on disk between processes.

Most of a short command's wall time is XLA compiling the evaluator (``mocap-jax simulate
--scheme mbkr`` on a 2-core CPU: 15.6 s in a fresh process, 4.6 s when its programs are on disk,
1.8 s of which is importing).  This turns on JAX's own persistent cache, whose key covers the
program, its compile options, the XLA flags, the jax/jaxlib versions and the device, so a hit is
the executable the compiler would have produced.  Entries are written under a file lock
(``filelock``), so concurrent processes (e.g. a multi-process sweep) share one folder,
and the folder is kept under ``max_bytes`` by evicting the least recently used programs.

Where: ``$MOCAP_JAX_CACHE_DIR`` if set (``off`` disables the cache), else
``$XDG_CACHE_HOME/mocap_jax/xla`` (``~/.cache/mocap_jax/xla``).
"""

from __future__ import annotations

import os
from pathlib import Path

import jax

#: environment variable naming the cache folder (or ``off``)
CACHE_DIR_ENV = "MOCAP_JAX_CACHE_DIR"
#: the folder's size bound (bytes); a ``simulate`` call's programs take about 1 MB
DEFAULT_MAX_BYTES = 2 * 1024 ** 3
_OFF = ("", "0", "off", "none", "false", "no")


def cache_dir_of(text: str) -> Path | None:
    """The folder a user named (``None`` for ``off``)."""
    return None if text.strip().lower() in _OFF else Path(text).expanduser()


def default_cache_dir() -> Path | None:
    """The cache folder the environment asks for: ``$MOCAP_JAX_CACHE_DIR`` (``None`` if it says
    ``off``), else the user's cache folder."""
    value = os.environ.get(CACHE_DIR_ENV)
    if value is not None:
        return cache_dir_of(value)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "mocap_jax" / "xla"


def enable_compilation_cache(path: str | os.PathLike | None = None, max_bytes: int = DEFAULT_MAX_BYTES) -> Path | None:
    """Keep compiled programs in ``path`` (default :func:`default_cache_dir`; ``"off"`` disables);
    returns the folder, or ``None`` where the cache stays off (asked to, or the folder cannot be
    created).

    Call it before the first computation of the process: JAX decides once per process whether it
    uses the cache.  Every program is stored, however short its compilation, because a command
    compiles many small ones: of the 15.6 s above, storing only the programs that took over 0.5 s
    to compile saved 6.7 s, storing all of them (about 160, 1 MB) 11 s.
    """
    folder = default_cache_dir() if path is None else cache_dir_of(os.fspath(path))
    if folder is None:
        disable_compilation_cache()
        return None
    if max_bytes <= 0:
        raise ValueError(f"max_bytes must be positive, got {max_bytes}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:               # e.g. a read-only home: run without a cache rather than fail
        disable_compilation_cache()
        return None
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_compilation_cache_max_size", int(max_bytes))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return folder


def disable_compilation_cache() -> None:
    """Compile everything afresh in this process (benchmarks that report compile time)."""
    jax.config.update("jax_compilation_cache_dir", None)
