"""The event-driven reference's per-iteration costs: the instance cost model of :mod:`mocap_jax.wsc.perf`, jitted.

One :class:`IterationCosts` per design point: prefill and decode iteration times at given DRAM
and collective shares, decode iterations with remote reads on routes, and the bytes an iteration
moves (for its demand on links and DRAM).  The jitted functions are module-level and take the
model, hardware and plan numbers as arguments, so design points of the same shapes share their
compiled code.  Float64 when ``jax_enable_x64`` is on.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import perf
from .hardware import WaferParams
from .plan import model_params, tp_plan
from .setup import ServingSetup


def _scaled(hw: WaferParams, own, coll) -> WaferParams:
    return hw.replace(dram_bandwidth=hw.dram_bandwidth * own, link_bandwidth=hw.link_bandwidth * coll,
                      node_bandwidth=hw.node_bandwidth * coll)


@jax.jit
def _prefill(model, hw, plan, chunk, prefix, last, mask, own, coll):
    return perf.prefill_iteration_time(model, _scaled(hw, own, coll), plan, chunk, prefix, last, mask)


@jax.jit
def _traffic(model, hw, plan, tokens, kv_read, head):
    return perf.iteration_traffic(model, hw, plan, tokens, kv_read, head)


@jax.jit
def _decode_table_remote(model, hw, plan, n, ctx, rt, hops, inter, ingress):
    remote = perf.RemoteKV(tokens=rt, hops=hops, internode=inter, ingress_links=ingress)
    return perf.decode_time(model, hw, plan, n, ctx, remote)


@jax.jit
def _decode_local(model, hw, plan, n, ctx):
    return perf.decode_time(model, hw, plan, n, ctx, None)


@jax.jit
def _decode_links(model, hw, plan, n, ctx, local, link_bytes, link_rate, dram_bytes, dram_rate, latency, own, coll):
    remote = perf.remote_read_time(link_bytes, link_rate, dram_bytes, dram_rate, latency)
    return perf.iteration_time(model, _scaled(hw, own, coll), plan, n, ctx, local, n, remote)


class IterationCosts:
    """Per-iteration costs and traffic of one set-up."""

    def __init__(self, setup: ServingSetup):
        dt = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
        self.dtype = np.dtype(dt)
        self.model = model_params(setup.model, dt)
        self.hw = WaferParams.from_spec(setup.wafer, dt)
        self.pplan = tp_plan(setup.model, setup.wafer, setup.prefill, dt)
        self.dplan = tp_plan(setup.model, setup.wafer, setup.decode, dt)
        self.kv_per_token_block = float(np.asarray(self.model.kv_elements_per_token_layer
                                                   * self.dplan.kv_read_amplification * self.hw.kv_bytes))
        self.layers = float(setup.model.layers)

    def prefill(self, chunk, prefix, last, mask, own, coll):
        return _prefill(self.model, self.hw, self.pplan, chunk, prefix, last, mask, own, coll)

    def prefill_traffic(self, tokens, kv_read, head):
        return _traffic(self.model, self.hw, self.pplan, tokens, kv_read, head)

    def decode_table_remote(self, n, ctx, rt, hops, inter, ingress):
        return _decode_table_remote(self.model, self.hw, self.dplan, n, ctx, rt, hops, inter, ingress)

    def decode_local(self, n, ctx):
        return _decode_local(self.model, self.hw, self.dplan, n, ctx)

    def decode_links(self, n, ctx, local, link_bytes, link_rate, dram_bytes, dram_rate, latency, own, coll):
        return _decode_links(self.model, self.hw, self.dplan, n, ctx, local, link_bytes, link_rate, dram_bytes,
                             dram_rate, latency, own, coll)

    def decode_traffic(self, n, local):
        return _traffic(self.model, self.hw, self.dplan, n, local, n)


__all__ = ["IterationCosts"]
