"""Event-driven reference simulator: an independent statement of ``docs/semantics.md``.

The vectorised evaluator is checked against this package.  It shares with the array program
only the spec types, the mesh routing (:mod:`mocap_jax.specs.mesh`) and the per-operation cost
formulas of :mod:`mocap_jax.costs.stage`, evaluated with NumPy in float64; everything else is
derived here from the contract, event by event at the instants things happen:

* :mod:`.items` -- request groups and items (chunked, GPipe, TeraPipe plans of several groups);
* :mod:`.quantities` -- per-item, per-stage times, hand-offs, KV and activation bytes, budgets;
* :mod:`.ledger` -- the KV each stage holds and hosts, by group, with a conservation audit;
* :mod:`.spill` -- MBKR's roles, room, spill rule and pairings;
* :mod:`.engine` -- the event loop (admission, stage service order, hand-offs, releases, MBKR
  reads, writes, blocking and migration, memory at every start);
* :mod:`.result` -- feasibility and the summary metrics;
* :mod:`.simulate` -- the entry points :func:`reference_simulate` and :func:`reference_run`.

MBKR spills are decided at each item's actual start; the array program decides them on the
previous pass's timeline, and ``mocap-jax validate`` reports the difference.  The simulation runs
in Python (slow) and is meant for validation and small studies; sweeps use :mod:`mocap_jax.api`.
"""

from .items import Item, build_items, scheme_groups, uniform_partition
from .result import ReferenceResult
from .simulate import ADMISSION_MODES, RELEASE_POLICIES, SCHEMES, reference_run, reference_simulate
from .spill import FIT_TOLERANCE, PAIRINGS, RANK_RESOLUTION, SPILL_POLICIES, MBKRSettings, static_partners

__all__ = ["ADMISSION_MODES", "FIT_TOLERANCE", "Item", "MBKRSettings", "PAIRINGS", "RANK_RESOLUTION",
           "RELEASE_POLICIES", "ReferenceResult", "SCHEMES", "SPILL_POLICIES", "build_items", "reference_run",
           "reference_simulate", "scheme_groups", "static_partners", "uniform_partition"]
