"""``mocap-jax reproduce``: the MOCAP study on embedded defaults."""

from __future__ import annotations

from .. import api
from ..study import StudyConfig, run_study, summary_table


def cmd_reproduce(args) -> int:
    cfg = StudyConfig(quick=args.quick, seed=args.seed)
    if args.models:
        cfg.models = tuple(m.strip() for m in args.models.split(","))
        for m in cfg.models:
            api.get_model(m)
    res = run_study(cfg, args.results, args.figures, log=(lambda *a, **k: None) if args.quiet else print)
    print()
    print(summary_table(res))
    return 0


def register(sub, bench_sub) -> None:
    p = sub.add_parser("reproduce", help="the MOCAP study on embedded defaults: tables and figures")
    p.add_argument("--results", default="results", help="directory for the CSV tables")
    p.add_argument("--figures", default="figures", help="directory for the PNG figures")
    p.add_argument("--models", default=None, help="comma-separated subset of the study models")
    p.add_argument("--quick", action="store_true", help="one model, two lengths, short annealing (a smoke run)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_reproduce)
