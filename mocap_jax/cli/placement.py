"""``mocap-jax placement``: the searched stage-to-die map for MBKR against the snake layout (with ``--tp``:
which group tile each tensor-parallel stage group occupies, against the default groups)."""

from __future__ import annotations

from ..mbkr.pairing import PAIRINGS
from ..mbkr.placement import grid_picture, search_placement, snake_report
from ..specs import LIMITS, SpecError, checks, get_hardware, mesh
from .common import dumps, number, positive_int, seed, table


def cmd_placement(args) -> int:
    hw = get_hardware(args.hardware)
    tp = args.tp
    if tp > hw.num_dies:
        raise SpecError(f"--tp {tp} needs {tp} dies per stage but {hw.name} has {hw.num_dies}; use a smaller --tp")
    if tp > 1 and hw.topology == "mesh":
        try:
            mesh.group_tiles(hw, tp)
        except ValueError as e:
            raise SpecError(str(e)) from None
    n = hw.num_dies // tp if args.stages is None else args.stages
    if n * tp > hw.num_dies:
        raise SpecError(f"{n} stages of {tp} dies need {n * tp} dies but {hw.name} has {hw.num_dies}; "
                        f"use fewer --stages or a smaller --tp")
    if n > LIMITS["layers"]:
        raise SpecError(f"{n} stages exceed the {LIMITS['layers']} a pipeline may have")
    for name in ("handoff_weight", "pair_weight"):
        checks.number(f"--{name.replace('_', '-')}", getattr(args, name), 0.0, 1e6)
    pairing = args.pairing if args.pairing in ("cross-half", "head-to-tail", "none") else "cross-half"
    kw = dict(handoff_weight=args.handoff_weight, pair_weight=args.pair_weight)
    snake = snake_report(hw, n, pairing, tp=tp, **kw)
    best = search_placement(hw, n, pairing, seed=args.seed, tp=tp, **kw)
    if args.json:
        print(dumps({"hardware": hw.name, "stages": n, "tp": tp, "pairing": pairing, **kw,
                          "placement": best.placement.tolist(), "searched": best.to_dict(), "snake": snake.to_dict()}))
        return 0
    groups = f" (stage groups of {tp} dies)" if tp > 1 else ""
    print(f"placement of {n} stages{groups} on {hw.name} ({pairing} pairs; cost = {args.handoff_weight} x hand-off hops "
          f"+ {args.pair_weight} x pair hops)")
    print(table([r.to_dict() for r in (snake, best)],
                [("method", "placement"), ("cost", "cost"), ("pipeline_hops", "pipeline hops"), ("pair_hops", "pair hops"),
                 ("max_pipeline_hops", "max pipe"), ("max_pair_hops", "max pair"), ("max_link_share", "max link share")]))
    print("\nsearched map (stage number on each die):")
    print(grid_picture(hw, best.placement))
    return 0


def register(sub, bench_sub) -> None:
    p = sub.add_parser("placement", help="stage-to-die map minimising traffic-weighted hops (MBKR)")
    p.add_argument("--hardware", "-w", default="mocap-4x4")
    p.add_argument("--stages", type=positive_int, default=None, help="pipeline stages (default: dies / tp)")
    p.add_argument("--tp", type=positive_int, default=1, help="dies per stage group (tensor parallelism)")
    p.add_argument("--pairing", default="cross-half", choices=PAIRINGS)
    p.add_argument("--handoff-weight", type=number, default=1.0, help="weight of a pipeline hand-off hop")
    p.add_argument("--pair-weight", type=number, default=1.0, help="weight of an MBKR pair hop")
    p.add_argument("--seed", type=seed, default=1)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_placement)
