"""Test set-up: eight fake CPU devices so sharded code paths run, and float64 available.

Set before JAX is imported anywhere.  Tests that compare float32 with float64 pass
dtypes explicitly; the package's default stays float32.  The persistent compilation cache is off
(the commands tests run would otherwise write to the user's cache folder; a run-wide cache saved
no time, since nearly every program is compiled by one test only).  The garbage collector runs as
under the command line (``mocap_jax.api.process``): the suite's time is mostly tracing and compiling.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("MOCAP_JAX_CACHE_DIR", "off")

import ast  # noqa: E402
import contextlib  # noqa: E402
import inspect  # noqa: E402

import jax  # noqa: E402
import pytest  # noqa: E402

from mocap_jax.api.process import collect_garbage_less_often  # noqa: E402

jax.config.update("jax_enable_x64", True)
collect_garbage_less_often()


@pytest.fixture
def imports_of():
    """``imports_of(module)``: the set of its imports, ``"module:name,name"`` for ``from`` imports
    and the module name for plain ones (for checks that a module stays independent of others)."""

    def collect(module) -> set:
        imported = set()
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            if isinstance(node, ast.ImportFrom):
                imported.add((node.module or "") + ":" + ",".join(a.name for a in node.names))
            elif isinstance(node, ast.Import):
                imported.update(a.name for a in node.names)
        return imported

    return collect


@pytest.fixture
def programs_compiled():
    """``with programs_compiled() as compiled:`` counts the XLA programs compiled inside the block
    (``len(compiled)``), an operation run outside ``jit`` counting as a program of its own."""

    @contextlib.contextmanager
    def count():
        compiled = []

        def listen(event, duration, **kwargs):
            if event == "/jax/core/compile/backend_compile_duration":
                compiled.append(duration)

        jax.monitoring.register_event_duration_secs_listener(listen)
        try:
            yield compiled
        finally:
            jax.monitoring.unregister_event_duration_listener(listen)

    return count
