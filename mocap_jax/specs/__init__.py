"""What is simulated: models, hardware, the die mesh, and the checks every input passes.

* :mod:`.model` -- :class:`ModelSpec` and the model presets;
* :mod:`.hardware` -- :class:`HardwareSpec`, the MOCAP wafer and GPU-node presets;
* :mod:`.gpus` -- the GPU datasheet figures behind the GPU-node presets, with their sources;
* :mod:`.mesh` -- die grid geometry and dimension-order (XY) routing;
* :mod:`.lookup` -- resolving preset names, ``mocap-RxC`` meshes and JSON/TOML spec files;
* :mod:`.checks` -- the validation layer shared by the API, the CLI, spec and sweep files.

The specs are plain hashable Python; the array programs see them only as pytrees of
numbers (:mod:`mocap_jax.costs.params`), so sweeps can ``vmap`` over any numeric field.
"""

from .checks import LIMITS, SpecError
from .hardware import HARDWARE_PRESETS, HardwareSpec, gpu_node, mocap_wafer
from .lookup import get_hardware, get_model
from .model import MODEL_ALIASES, MODEL_PRESETS, STUDY_MODELS, ModelSpec

__all__ = [
    "LIMITS", "SpecError", "ModelSpec", "HardwareSpec", "MODEL_PRESETS", "MODEL_ALIASES", "HARDWARE_PRESETS",
    "STUDY_MODELS", "mocap_wafer", "gpu_node", "get_model", "get_hardware",
]
