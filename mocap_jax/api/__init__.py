"""Public Python API: validate inputs, build configurations, run the evaluator, wrap results.

Research code normally needs :func:`simulate` (one configuration, full detail),
:func:`simulate_batch` (thousands of configurations in one compiled call),
:func:`max_feasible_batch` and :func:`max_feasible_seq_len`.  All validation happens before
anything is traced: bad input raises ``ValueError`` with one message that says what is wrong
and how to fix it.
"""

from .batch import simulate_batch
from .compile_cache import disable_compilation_cache, enable_compilation_cache
from .config import ADMISSION_MODES, RELEASE_POLICIES, SCHEMES, Config, resolve
from .process import collect_garbage_less_often
from .search import largest_true, max_feasible_batch, max_feasible_seq_len
from .simulate import DEFAULT_MAX_BATCH, SimResult, simulate

__all__ = ["simulate", "simulate_batch", "max_feasible_batch", "max_feasible_seq_len", "largest_true", "resolve",
           "Config", "SimResult", "SCHEMES", "RELEASE_POLICIES", "ADMISSION_MODES", "DEFAULT_MAX_BATCH",
           "enable_compilation_cache", "disable_compilation_cache", "collect_garbage_less_often"]
