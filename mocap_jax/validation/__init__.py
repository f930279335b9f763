"""Validation of the simulator (DESIGN §9).

* :mod:`.reference` -- an independent event-driven (SimPy) reference simulator;
* :mod:`.agreement` -- the vectorised simulator against the reference over random configurations;
* :mod:`.calibrate` -- the §4 cost model against measured chunked-prefill execution;
* :mod:`.profiles` -- the cost model against measured GPU operator profiles (Vidur CSV layout);
* :mod:`.published` -- the simulator against published end-to-end prefill measurements;
* :mod:`.cli` -- ``mocap-jax validate`` and ``mocap-jax bench reference``.

Submodules are imported on demand (the reference needs SimPy, calibration runs JAX models).
"""
