"""Values the compiled evaluation programs compute once and keep in memory.

XLA:CPU fuses an elementwise producer into each of its consumers and recomputes it for every
element a consumer reads.  That is cheap for one add, not for a whole cost model: left to
XLA, a table that broadcasts an item's block times over the stages (the stage times, read in the
recurrence's skewed layout and in item order) evaluates the per-item cost formulas once per stage
cell of every kernel that reads it; a static pair's event counts gather its timelines again in every
compare; and in its spill scan every ledger update recomputes the spill rule.  :func:`computed_once` marks such values (``lax.optimization_barrier``), and every
program that runs the evaluator is compiled with :data:`COMPILER_OPTIONS`, which keep the mark:
XLA:CPU otherwise removes barriers (its ``cse_barrier_expander`` pass) before it fuses.  The
options also keep small loops as loops (its ``small-while-loop-hoisting`` pass would emit a loop
with a small state, such as one configuration's spill scan, as a single kernel, whose emitter
aborts on a kept value).  The formulas are unchanged; a sum over a stored table may add in another
order than the fused one (the last float32 digit of a period or a bubble fraction).  Other
backends keep barriers without the options.
"""

from __future__ import annotations

import jax

#: the XLA:CPU pass that would drop :func:`computed_once`'s barriers before fusion
BARRIER_PASS = "cse_barrier_expander"
#: the XLA:CPU pass that would emit small loops as single kernels, which cannot hold a barrier
HOIST_PASS = "small-while-loop-hoisting"


def compiler_options(*disabled_passes: str) -> dict:
    """Compile options of a program that runs the evaluator: :data:`BARRIER_PASS` and
    :data:`HOIST_PASS` off, and ``disabled_passes`` (XLA pass names) too."""
    return {"xla_disable_hlo_passes": ",".join((*disabled_passes, BARRIER_PASS, HOIST_PASS))}


#: compile options of every program that runs the evaluator
COMPILER_OPTIONS = compiler_options()
#: XLA:CPU's loop emitters instead of its MLIR fusion emitters, which pay a fixed cost for each of a
#: program's hundreds of kernels; their kernels run the spill passes and the serving step several times
#: slower, so only programs whose call is almost all compilation use them (docs/performance.md,
#: "Programs whose call is almost all compilation").
LOOP_EMITTERS = {"xla_cpu_use_fusion_emitters": False}
#: compile options of an evaluator program whose call is almost all compilation (a single configuration,
#: or a block of a few)
COMPILE_BOUND_OPTIONS = {**COMPILER_OPTIONS, **LOOP_EMITTERS}


def computed_once(values):
    """``values`` (any pytree of arrays), computed once and stored for every consumer, instead of
    recomputed inside each consumer's fused kernel."""
    return jax.lax.optimization_barrier(values)


__all__ = ["BARRIER_PASS", "COMPILE_BOUND_OPTIONS", "COMPILER_OPTIONS", "HOIST_PASS", "LOOP_EMITTERS",
           "compiler_options", "computed_once"]
