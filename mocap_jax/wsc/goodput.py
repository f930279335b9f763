"""Instance goodput: the requests/s a prefill or a decode instance sustains within its SLO, per die.

Saturated, one instance at a time:

* prefill: chunked prefill with a token budget ``C`` per iteration.  A request of
  ``S`` prompt tokens costs ``S`` GEMM tokens, ``S (S + 1) / 2`` causal attention pairs
  and ``S (max(S, C) / C + 1) / 2`` KV tokens read; a representative iteration carries
  ``C`` tokens with the workload's token-weighted averages of those, so one request
  costs ``E[S] / C`` iterations.  TTFT of a mean request (no queueing),
  ``max(E[S] / C, 1)`` iterations, must be within ``ttft_slo_s``, and the instance must
  hold the KV of the workload's longest prompt.
* decode: continuous batching of ``B`` requests whose KV context averages
  ``E[O (S + (O + 1) / 2)] / E[O]`` tokens (time-weighted over a request's decode);
  memory reserves each request's final context ``E[O (S + O)] / E[O]``.  The batch is
  the one with the highest ``B / (E[O] x t_decode(B))`` among ``B <= max_batch``
  that fit the KV capacity and keep ``t_decode(B) <= tpot_slo_s``.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..costs import ModelParams, pytree
from ..costs.computed_once import LOOP_EMITTERS
from ..specs import LIMITS, checks
from . import perf
from .hardware import WaferParams
from .plan import TPPlan
from .workload import WorkloadParams

Array = Any


@pytree
class ServingTargets:
    """Serving knobs of the goodput evaluation (traced scalars)."""

    chunk_tokens: Array   # [] prefill token budget per iteration (chunked prefill), tokens
    tpot_slo_s: Array     # [] time-per-output-token SLO of a decode iteration, s
    ttft_slo_s: Array     # [] time-to-first-token SLO of a mean request's prefill (no queueing), s

    @staticmethod
    def make(chunk_tokens: float = 2048, tpot_slo_s: float = 0.1, ttft_slo_s: float = 10.0, dtype=jnp.float32):
        checks.integer("chunk_tokens", chunk_tokens, 1, LIMITS["seq_len"], " A whole number of tokens.")
        for name, v in (("tpot_slo_s", tpot_slo_s), ("ttft_slo_s", ttft_slo_s)):
            checks.positive(name, v, hint=" Give the SLO in seconds.")
        return ServingTargets(np.asarray(chunk_tokens, dtype), np.asarray(tpot_slo_s, dtype),
                              np.asarray(ttft_slo_s, dtype))


def workload_moments(wl: WorkloadParams, chunk_tokens):
    """Per-request expectations over the workload points (all scalars).

    Returns a dict with ``mean_prompt``, ``pairs`` (causal attention pairs),
    ``kv_read`` (KV tokens read over all chunks), ``mean_output``, ``ctx_mean``
    (time-weighted decode context, tokens), ``ctx_reserve`` (final context, tokens,
    output-weighted) and ``max_prompt``.
    """
    s, o, w = wl.prompt, wl.output, wl.weight
    c = chunk_tokens
    mean_o = jnp.sum(w * o)
    return {
        "mean_prompt": jnp.sum(w * s),
        "pairs": jnp.sum(w * s * (s + 1.0) / 2.0),
        "kv_read": jnp.sum(w * s * (jnp.maximum(s, c) / c + 1.0) / 2.0),
        "mean_output": mean_o,
        "ctx_mean": jnp.sum(w * o * (s + (o + 1.0) / 2.0)) / mean_o,
        "ctx_reserve": jnp.sum(w * o * (s + o)) / mean_o,
        "max_prompt": jnp.max(s),
    }


def instance_goodput(model: ModelParams, hw: WaferParams, plan: TPPlan, wl: WorkloadParams,
                     targets: ServingTargets, max_batch: int = 512) -> dict[str, Array]:
    """Goodput of one instance as a prefill instance and as a decode instance.

    Pure function of traced inputs; ``max_batch`` (the decode batch grid size) is
    static.  ``vmap`` over ``plan`` for many instance shapes, over ``hw`` for design points.

    Returns (scalars, per instance):
      prefill_fits, prefill_rps, prefill_rps_per_die, prefill_iter_s, ttft_s,
      decode_fits, decode_rps, decode_rps_per_die, decode_batch, tpot_s,
      decode_batch_slo (largest batch within the TPOT SLO, memory ignored),
      weight_bytes_per_die, kv_tokens_capacity (decode, per instance).
    """
    mo = workload_moments(wl, targets.chunk_tokens)
    C = targets.chunk_tokens
    es = mo["mean_prompt"]
    t_iter = perf.prefill_time(model, hw, plan, C, C * mo["pairs"] / es, C * mo["kv_read"] / es, C / es)
    t_req = es / C * t_iter
    ttft = jnp.maximum(es / C, 1.0) * t_iter
    weights = perf.weight_bytes_per_die(model, hw, plan)
    kv_tok = perf.kv_bytes_per_token_per_die(model, hw, plan)
    pre_need = weights + perf.workspace_bytes(model, hw, C) + mo["max_prompt"] * kv_tok
    prefill_fits = pre_need <= hw.usable_dram
    prefill_rps = jnp.where(prefill_fits & (ttft <= targets.ttft_slo_s), 1.0 / t_req, 0.0)

    b = jnp.arange(1, max_batch + 1, dtype=t_iter.dtype)
    t_dec = perf.decode_time(model, hw, plan, b, b * mo["ctx_mean"])
    cap = perf.kv_capacity_tokens(model, hw, plan, float(max_batch))
    b_mem = jnp.floor(cap / mo["ctx_reserve"])
    ok = (b <= b_mem) & (t_dec <= targets.tpot_slo_s)
    thr = jnp.where(ok, b / (mo["mean_output"] * t_dec), 0.0)
    best = jnp.argmax(thr)
    any_ok = jnp.any(ok)
    decode_rps = jnp.where(any_ok, thr[best], 0.0)
    return {
        "prefill_fits": prefill_fits,
        "prefill_rps": prefill_rps,
        "prefill_rps_per_die": prefill_rps / plan.dies,
        "prefill_iter_s": t_iter,
        "ttft_s": ttft,
        "decode_fits": b_mem >= 1,
        "decode_rps": decode_rps,
        "decode_rps_per_die": decode_rps / plan.dies,
        "decode_batch": jnp.where(any_ok, b[best], 0.0),
        "decode_batch_slo": jnp.max(jnp.where(t_dec <= targets.tpot_slo_s, b, 0.0)),
        "tpot_s": jnp.where(any_ok, t_dec[best], jnp.inf),
        "weight_bytes_per_die": weights,
        "kv_tokens_capacity": cap,
    }


@partial(jax.jit, static_argnames=("max_batch",), compiler_options=LOOP_EMITTERS)
def goodput_batch(model, hw, plans, wl, targets, max_batch):
    """``instance_goodput`` over hardware points ``[H]`` x instance plans ``[C]`` -> leaves ``[H, C]``.

    A call (at most a few hundred plans and hardware points) takes milliseconds and its compilation
    most of a second, so the program compiles with XLA:CPU's loop emitters
    (:data:`~mocap_jax.costs.computed_once.LOOP_EMITTERS`)."""
    per_hw = lambda h: jax.vmap(lambda p: instance_goodput(model, h, p, wl, targets, max_batch))(plans)
    return jax.vmap(per_hw)(hw)
