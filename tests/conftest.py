"""Test set-up: eight fake CPU devices so sharded code paths run, and float64 available.

Set before JAX is imported anywhere.  Tests that compare float32 with float64 pass
dtypes explicitly; the package's default stays float32.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
