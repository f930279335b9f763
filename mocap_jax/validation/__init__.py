"""Validation of the simulator.

* :mod:`.reference` -- an independent event-driven reference simulator of ``docs/semantics.md``;
* :mod:`.agreement` -- the vectorised evaluator against the reference where their semantics are
  identical, over random configurations;
* :mod:`.agreement_mbkr` -- the array program's MBKR against the reference near the memory limit;
* :mod:`.benchmark` -- the speed of the vectorised evaluator against the reference;
* :mod:`.calibration` -- the cost model against measured chunked-prefill execution;
* :mod:`.profiles` -- the cost model against measured GPU operator profiles (Vidur CSV layout);
* :mod:`.published` -- the simulator against published end-to-end prefill measurements.

``mocap-jax validate`` and ``mocap-jax bench reference`` (:mod:`mocap_jax.cli.validate`) run them.
Submodules are imported on demand (calibration runs JAX models).
"""
