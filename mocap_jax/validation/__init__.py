"""Validation of the simulator (DESIGN §9).

* :mod:`.reference` -- an independent event-driven (SimPy) reference simulator;
* :mod:`.agreement` -- the vectorised simulator against the reference over random configurations;
* :mod:`.calibrate` -- the §4 cost model against measured chunked-prefill execution;
* :mod:`.cli` -- ``mocap-jax validate`` and ``mocap-jax bench reference``.

Submodules are imported on demand (the reference needs SimPy, calibration runs JAX models).
"""
