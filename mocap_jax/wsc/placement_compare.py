"""Alpha sensitivity of instance placement: the TransferCost of decode-centred, random and searched
placements side by side (``mocap-jax wsc-llm place``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..specs import SpecError, checks
from .hardware import WaferSpec
from .layout import check_alpha, enumerate_layouts
from .placement import (anneal_placements, decode_centred_placement, exhaustive_placement, random_placement,
                        transfer_cost)


@dataclass
class PlacementComparison:
    alpha: float
    decode_centred: float
    random_mean: float
    random_std: float
    random_min: float
    searched: float
    search_method: str

    def to_dict(self):
        return dict(self.__dict__)


#: random layouts of one comparison: each is drawn in Python with 50 restarts (about 4 ms on a 2-core
#: CPU), so this bound is about seven minutes
MAX_RANDOM_SAMPLES = 100_000


def compare_placements(wafer: WaferSpec, prefill_shape, n_prefill: int, decode_shape, n_decode: int,
                       alphas: Sequence[float] = (1.0, 1.5, 2.0, 3.0), random_samples: int = 100, chains: int = 32,
                       steps: int = 2000, seed: int = 0, exhaustive_limit: int = 20_000):
    """Alpha sensitivity: TransferCost of decode-centred, random and searched placements per alpha.

    The searched optimum is exhaustive when the mesh has at most ``exhaustive_limit``
    layouts, annealing otherwise.

    Returns:
      (rows ``[PlacementComparison]``, best layouts per alpha ``{alpha: Layout}``).
    """
    for a in alphas:
        check_alpha(a)
    random_samples = checks.integer("random_samples", random_samples, 1, MAX_RANDOM_SAMPLES)
    rng = np.random.default_rng(seed)
    randoms = []
    for _ in range(random_samples):
        try:
            randoms.append(random_placement(wafer, prefill_shape, n_prefill, decode_shape, n_decode, rng, restarts=50))
        except SpecError:
            break
    try:
        pre, dec, layouts = enumerate_layouts(wafer, tuple(prefill_shape), n_prefill, tuple(decode_shape), n_decode,
                                              exhaustive_limit)
        exhaustive = True
    except SpecError:
        exhaustive = False
    rows, best = [], {}
    heuristics = [decode_centred_placement(wafer, prefill_shape, n_prefill, decode_shape, n_decode, a) for a in alphas]
    annealed = None if exhaustive else anneal_placements(wafer, heuristics, alphas, chains, steps, seed)
    for k, a in enumerate(alphas):
        dc = heuristics[k]
        c_dc = transfer_cost(wafer, dc, a).cost
        rc = np.asarray([transfer_cost(wafer, l, a).cost for l in randoms]) if randoms else np.asarray([np.nan])
        if exhaustive:
            lay, c_s, _ = exhaustive_placement(wafer, prefill_shape, n_prefill, decode_shape, n_decode, a,
                                               exhaustive_limit)
            method = "exhaustive"
        else:
            lay, c_s, method = annealed[k].layout, annealed[k].cost, "anneal"
        best[a] = lay
        rows.append(PlacementComparison(float(a), c_dc, float(rc.mean()), float(rc.std()), float(rc.min()), c_s,
                                        method))
    return rows, best


__all__ = ["PlacementComparison", "compare_placements"]
