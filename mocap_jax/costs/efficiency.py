"""GEMM efficiency as a function of the tokens a GEMM processes.

A GEMM kernel of ``P`` weights on ``n`` tokens does ``2 P n`` FLOPs at a plateau efficiency
``eff_gemm`` plus a fixed time ``gemm_fixed_s`` (launch, pipeline fill, the last partial wave),
so its compute time is ``2 P n / (peak x eff_gemm) + gemm_fixed_s``.  Written as an efficiency,

    eff(n) = eff_gemm / (1 + n_half / n),    n_half = gemm_fixed_s x peak x eff_gemm / (2 P)

a saturating curve in ``n`` that reaches half the plateau at ``n_half`` tokens; ``n_half`` grows
as the GEMM's weights shrink (a narrower tensor-parallel shard saturates later).  The roofline
still takes the larger of this compute time and the weight + activation read, so below the ridge
point the weight read dominates.  ``gemm_fixed_s = 0`` gives the flat ``eff_gemm`` of a plain
roofline.  The default ``gemm_fixed_s`` and the fit are in docs/cost_model.md.

Functions take an array namespace ``xp`` (``jax.numpy`` or ``numpy``); tokens, parameters and
kernels broadcast together.  Units: tokens, parameters, seconds.
"""

from __future__ import annotations

import jax.numpy as jnp

#: GEMM kernels of one dense block: fused QKV projection, output projection, fused gate + up, down.
DENSE_LAYER_GEMMS = 4
#: GEMM kernels of one MoE block: QKV, output, router, grouped gate + up, grouped down.
MOE_LAYER_GEMMS = 5


def half_tokens(params, kernels, peak_flops, eff_gemm, gemm_fixed_s):
    """Tokens at which ``kernels`` GEMM kernels holding ``params`` weights reach half the plateau."""
    return kernels * gemm_fixed_s * peak_flops * eff_gemm / (2.0 * params)


def gemm_efficiency(tokens, params, kernels, hw, xp=jnp):
    """Achieved / peak of GEMMs over ``params`` weights (in ``kernels`` kernels) on ``tokens`` tokens.

    ``hw`` supplies ``peak_flops``, ``eff_gemm`` and ``gemm_fixed_s``.  Where ``tokens`` or
    ``params`` is 0 (padding; no FLOPs) the plateau is returned.
    """
    active = (tokens > 0) & (params > 0)
    n_half = half_tokens(xp.where(active, params, 1.0), kernels, hw.peak_flops, hw.eff_gemm, hw.gemm_fixed_s)
    return hw.eff_gemm / (1.0 + xp.where(active, n_half / xp.where(active, tokens, 1.0), 0.0))
