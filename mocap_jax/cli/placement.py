"""``mocap-jax placement``: the searched stage-to-die map for MBKR against the snake layout."""

from __future__ import annotations

import json

from .core import positive_int
from ..mbkr import PAIRINGS
from ..placement import grid_picture, search_placement, snake_report
from ..specs import get_hardware


def cmd_placement(args) -> int:
    hw = get_hardware(args.hardware)
    n = hw.num_dies if args.stages is None else args.stages
    if n > hw.num_dies:
        raise ValueError(f"{n} stages need {n} dies but {hw.name} has {hw.num_dies}")
    pairing = args.pairing if args.pairing in ("cross-half", "head-to-tail", "none") else "cross-half"
    kw = dict(handoff_weight=args.handoff_weight, pair_weight=args.pair_weight)
    snake = snake_report(hw, n, pairing, **kw)
    best = search_placement(hw, n, pairing, seed=args.seed, **kw)
    if args.json:
        print(json.dumps({"hardware": hw.name, "stages": n, "pairing": pairing, **kw,
                          "placement": best.placement.tolist(), "searched": best.to_dict(), "snake": snake.to_dict()}))
        return 0
    print(f"placement of {n} stages on {hw.name} ({pairing} pairs; cost = {args.handoff_weight} x hand-off hops "
          f"+ {args.pair_weight} x pair hops)")
    print(f"{'':10s} {'cost':>7s} {'pipeline hops':>14s} {'pair hops':>10s} {'max pipe':>9s} {'max pair':>9s} "
          f"{'max link share':>15s}")
    for r in (snake, best):
        print(f"{r.method:10s} {r.cost:7.1f} {r.pipeline_hops:14d} {r.pair_hops:10d} {r.max_pipeline_hops:9d} "
              f"{r.max_pair_hops:9d} {r.max_link_share:15d}")
    print("\nsearched map (stage number on each die):")
    print(grid_picture(hw, best.placement))
    return 0


def register(sub, bench_sub) -> None:
    p = sub.add_parser("placement", help="stage-to-die map minimising traffic-weighted hops (MBKR)")
    p.add_argument("--hardware", "-w", default="mocap-4x4")
    p.add_argument("--stages", type=positive_int, default=None)
    p.add_argument("--pairing", default="cross-half", choices=PAIRINGS)
    p.add_argument("--handoff-weight", type=float, default=1.0, help="weight of a pipeline hand-off hop")
    p.add_argument("--pair-weight", type=float, default=1.0, help="weight of an MBKR pair hop")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_placement)
