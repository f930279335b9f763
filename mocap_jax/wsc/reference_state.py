"""State of the event-driven WSC-LLM serving reference (:mod:`mocap_jax.wsc.reference`): streams in
flight, prefill and decode instances, and the run's per-request output."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np


@dataclass
class Stream:
    """An iteration or a KV transfer in flight (contention model)."""

    link_demand: np.ndarray           # [L] bytes/s it would use alone
    dram_demand: np.ndarray           # [D]
    duration: Callable                # shares (link [L], DRAM [D]) -> seconds
    seconds: float                    # duration at the current shares
    since: float                      # when its progress was last brought up to date
    done: float = 0.0                 # fraction of its work done
    shares: Any = None


@dataclass
class PrefillInstance:
    queue: deque = field(default_factory=deque)   # unplaced requests in FCFS order (prefilled ones first)
    pend: int = 0                                  # prefilled, not yet placed (at the queue front)
    prog: float = 0.0                              # tokens prefilled of the first unprefilled request
    busy: bool = False
    it_complete: int = 0                           # requests the running iteration completes
    it_prog: float = 0.0                           # progress of the first unprefilled after it
    version: int = 0


@dataclass
class DecodeInstance:
    queue: deque = field(default_factory=deque)   # placed requests waiting for a slot (placement order)
    batch: list = field(default_factory=list)     # [request, tokens generated so far]
    load: int = 0                                  # assigned, unfinished
    version: int = 0


@dataclass
class ReferenceOutput:
    """Per-request times (absolute seconds, inf = never) and aggregates of one reference run."""

    ttft_t: np.ndarray
    finish_t: np.ndarray
    ready_t: np.ndarray
    pinst: np.ndarray
    dinst: np.ndarray
    dropped: np.ndarray
    kv_area: float
    kv_peak: float
    end_s: float
    events: int
    wall_s: float
