"""State of the batched serving program: typed pytrees of fixed-capacity arrays.

Queues are fixed-capacity arrays of request indices (``N`` entries: a request enters each
queue once), a decode instance's batch is a slot table of ``B`` slots, and each request's KV
allocation is a row of an ``[N, D]`` table.  :func:`initial_state` builds the state of one
design point before its first event.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from ..costs import pytree
from .serving_inputs import ServingInputs, ServingShape

Array = Any


@pytree
class RequestState:
    """What happened to each request."""

    first_token_t: Array       # [N] s, prefill done (the first token); inf until then
    finish_t: Array            # [N] s, last token; inf until then
    ready_t: Array             # [N] s, its KV has arrived at the decode instance; inf until placed
    prefill_instance: Array    # [N] int32, -1 until it arrives
    decode_instance: Array     # [N] int32, -1 until placed
    placed_t: Array            # [N] s, its KV was placed; inf until then
    dropped: Array             # [N] bool, its KV fits nowhere it is allowed
    allocation: Array          # [N, D] bytes of its KV on each die
    next_arrival: Array        # [] int32, index of the next request to arrive


@pytree
class PrefillState:
    """FCFS queues and the running iteration of each prefill instance."""

    queue: Array               # [P, N] int32 request indices in FCFS order
    head: Array                # [P] int32 queue position of the first unplaced request
    tail: Array                # [P] int32 queue length (positions used)
    pending: Array             # [P] int32 prefilled requests at the head, not yet placed
    progress: Array            # [P] tokens prefilled of the first unprefilled request
    busy: Array                # [P] bool, an iteration is running
    next_t: Array              # [P] s, next event (iteration end, wake-up, retry); inf if none
    completes: Array           # [P] int32 requests the running iteration completes
    next_progress: Array       # [P] tokens of the first unprefilled request after the iteration


@pytree
class DecodeState:
    """FCFS queues, batches and remote KV of each decode instance."""

    queue: Array               # [Q, N] int32 request indices in placement order
    head: Array                # [Q] int32 queue position of the first request not yet admitted
    tail: Array                # [Q] int32 queue length
    load: Array                # [Q] int32 requests assigned and unfinished
    next_t: Array              # [Q] s, next boundary (iteration end or wake-up); inf if idle
    continuing: Array          # [Q] bool, the boundary at next_t continues one cut short at the same time
    leap_ends: Array           # [Q, K] s, ends of the iterations after the last processed boundary
    leap_count: Array          # [Q] int32 quiet boundaries fast-forwarded since then (at leap_ends[:count])
    remote_context: Array      # [Q, D] KV tokens of the batch held on each die outside the instance
    remote_growth: Array       # [Q, D] tokens the batch adds on each outside die per iteration
    slot_request: Array        # [Q, B] int32 request in each batch slot, -1 if empty
    slot_generated: Array      # [Q, B] tokens generated so far
    slot_prompt: Array         # [Q, B] prompt tokens
    slot_output: Array         # [Q, B] output tokens wanted


@pytree
class TrafficState:
    """Demand on the link and DRAM resources of the streams in flight (contention model; bytes/s)."""

    prefill_link: Array        # [P, L] demand of each prefill instance's running iteration
    prefill_dram: Array        # [P, D]
    decode_link: Array         # [Q, L] demand of each decode instance's running iteration(s)
    decode_dram: Array         # [Q, D]
    instance_link: Array       # [L] sum of the instances' rows above
    instance_dram: Array       # [D]
    transfer_link: Array       # [M, L] demand of recent KV transfers
    transfer_end: Array        # [M] s, when each of them ends
    transfer_next: Array       # [] int32, slot the next transfer takes


@pytree
class Totals:
    """Wafer-wide bookkeeping."""

    free: Array                # [D] bytes free for KV
    kv_area: Array             # [] byte-seconds of KV held (integral over time of the KV placed)
    kv_peak: Array             # [] bytes, most KV held at once
    last_t: Array              # [] s, time of the latest event
    events: Array              # [] int32 events of the contract processed
    leaped: Array              # [] int32 quiet decode boundaries fast-forwarded
    overflow: Array            # [] bool, a fixed-capacity table overflowed (results invalid)


@pytree
class ServingState:
    """Everything the scan carries for one design point."""

    requests: RequestState
    prefill: PrefillState
    decode: DecodeState
    traffic: TrafficState
    totals: Totals


def initial_state(inp: ServingInputs, sh: ServingShape) -> ServingState:
    """The state before the first event (leaves have no batch axis; ``vmap`` for many points)."""
    N, D, P, Q, B = sh.requests, sh.dies, sh.prefill, sh.decode, sh.slots
    ft = inp.requests.arrival.dtype
    inf = lambda *s: jnp.full(s, jnp.inf, ft)
    zf = lambda *s: jnp.zeros(s, ft)
    zi = lambda *s: jnp.zeros(s, jnp.int32)
    L = 4 * D if sh.contention else 1
    M = sh.transfers if sh.contention else 1
    Dt = D if sh.contention else 1
    return ServingState(
        requests=RequestState(first_token_t=inf(N), finish_t=inf(N), ready_t=inf(N),
                              prefill_instance=jnp.full(N, -1, jnp.int32), decode_instance=jnp.full(N, -1, jnp.int32),
                              placed_t=inf(N),
                              dropped=jnp.zeros(N, bool), allocation=zf(N, D), next_arrival=zi()),
        prefill=PrefillState(queue=zi(P, N), head=zi(P), tail=zi(P), pending=zi(P), progress=zf(P),
                             busy=jnp.zeros(P, bool), next_t=inf(P), completes=zi(P), next_progress=zf(P)),
        decode=DecodeState(queue=zi(Q, N), head=zi(Q), tail=zi(Q), load=zi(Q), next_t=inf(Q),
                           continuing=jnp.zeros(Q, bool), leap_ends=inf(Q, max(sh.leap, 1)), leap_count=zi(Q), remote_context=zf(Q, D), remote_growth=zf(Q, D),
                           slot_request=jnp.full((Q, B), -1, jnp.int32), slot_generated=zf(Q, B),
                           slot_prompt=zf(Q, B), slot_output=zf(Q, B)),
        traffic=TrafficState(prefill_link=zf(P, L), prefill_dram=zf(P, Dt), decode_link=zf(Q, L),
                             decode_dram=zf(Q, Dt), instance_link=zf(L), instance_dram=zf(Dt), transfer_link=zf(M, L),
                             transfer_end=zf(M), transfer_next=zi()),
        totals=Totals(free=inp.layout.free0, kv_area=zf(), kv_peak=zf(),
                      last_t=inp.requests.arrival[0], events=zi(), leaped=zi(), overflow=jnp.zeros((), bool)),
    )


__all__ = ["RequestState", "PrefillState", "DecodeState", "TrafficState", "Totals", "ServingState", "initial_state"]
