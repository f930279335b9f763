"""mocap_jax: a JAX-vectorised simulator of long-context prefill-only LLM inference on
wafer-scale chips (MOCAP: chunked pipelining, MBKR, LBCP, against GPipe and TeraPipe)
and of prefill/decode serving co-exploration on a wafer (WSC-LLM).

See README.md for a tour and docs/architecture.md for where each rule lives.
"""

__version__ = "0.2.0"

from .api import (  # noqa: E402
    SCHEMES, SimResult, collect_garbage_less_often, disable_compilation_cache, enable_compilation_cache,
    max_feasible_batch, max_feasible_seq_len, simulate, simulate_batch,
)
from .schedule.items import uniform_partition  # noqa: E402
from .schedule.recurrence import finish_times, pipeline_latency  # noqa: E402
from .specs import (  # noqa: E402
    HARDWARE_PRESETS, MODEL_PRESETS, HardwareSpec, ModelSpec, SpecError, get_hardware, get_model, gpu_node, mocap_wafer,
)
