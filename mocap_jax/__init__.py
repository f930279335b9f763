"""mocap_jax: a JAX-vectorised simulator of long-context prefill-only LLM inference on
wafer-scale chips (MOCAP: chunked pipelining, MBKR, LBCP, against GPipe and TeraPipe)
and of prefill/decode serving co-exploration on a wafer (WSC-LLM).

See README.md for a tour; DESIGN references (§) point to the project brief.
"""

__version__ = "0.1.0"

from .specs import (  # noqa: E402
    HARDWARE_PRESETS, MODEL_PRESETS, HardwareSpec, ModelSpec, SpecError, get_hardware, get_model, gpu_node, mocap_wafer,
)
from .api import (  # noqa: E402
    SCHEMES, SimResult, max_feasible_batch, max_feasible_seq_len, simulate, simulate_batch, uniform_partition,
)
from .pipeline import finish_times, pipeline_latency  # noqa: E402
