"""``mocap-jax reproduce`` (the MOCAP study on embedded defaults) and ``mocap-jax claims`` (the claims ledger)."""

from __future__ import annotations

import time
from pathlib import Path

from ..specs import get_model
from ..study import claims
from ..study.reproduce import (StudyConfig, comparison_settings, run_claims, run_study, study_comparison, study_lengths,
                               summary_table, write_csv)
from ..study.steps import StepStore
from .common import check_output_dir, dumps, progress, positive_int, seed


def study_models(text: str) -> tuple[str, ...]:
    """The models of ``--models`` (comma-separated), each checked before any work."""
    models = tuple(m.strip() for m in text.split(","))
    for m in models:
        get_model(m)
    return models


def cmd_reproduce(args) -> int:
    check_output_dir(args.results)
    check_output_dir(args.figures)
    cfg = StudyConfig(quick=args.quick, seed=args.seed, chunks=args.chunks)
    if args.models:
        cfg.models = study_models(args.models)
    if args.no_sensitivity:
        cfg.sensitivity = False
    res = run_study(cfg, args.results, args.figures, log=lambda m: progress(m, args.quiet), resume=args.resume)
    print(summary_table(res))
    return 0


def cmd_claims(args) -> int:
    path = Path(args.results) / "claims.json"
    if path.exists() and not args.run:
        ledger = claims.read_ledger(path)
        source = f"from {path} (written by mocap-jax reproduce; --run recomputes)"
    else:
        out_dir = check_output_dir(args.results)
        cfg = StudyConfig(max_lengths=args.lengths, sensitivity=not args.no_sensitivity, seed=args.seed,
                          chunks=args.chunks, min_seq_len=args.min_seq_len)
        if args.models:
            cfg.models = study_models(args.models)

        t0 = time.perf_counter()
        stamp = lambda: f"[{time.perf_counter() - t0:6.1f}s]"
        log = lambda m: progress(m, args.quiet)
        lengths_of = {model: tuple(study_lengths(model, cfg)[0]) for model in cfg.models}
        count = sum(len(v) for v in lengths_of.values())
        why = "" if args.run else f"{path} not found (mocap-jax reproduce writes it), so "
        log(f"claims: {why}{count} comparisons run now ({', '.join(cfg.models)}), then the claims"
            + ("" if args.no_sensitivity else " and their sensitivity (--no-sensitivity skips it)"))
        steps = StepStore(out_dir / ".claims-steps", args.resume)
        rows = []
        for model, lengths in lengths_of.items():
            for S in lengths:
                out = study_comparison(steps, model, cfg.hardware, S, ("gpipe", "terapipe", "terapipe-dp", "mocap"),
                                       comparison_settings(cfg, S))
                rows += [{"model": model, "seq_len": S, "load_rps": out["load_rps"], **r} for r in out["schemes"]]
                log(f"{stamp()} claims: {model} S = {S:,} compared")
        out_dir.mkdir(parents=True, exist_ok=True)
        rows_path = out_dir / "claims_rows.csv"
        write_csv(rows_path, rows)
        log(f"{stamp()} claims: comparison rows written to {rows_path}")
        ledger, _ = run_claims(cfg, rows, lengths_of, log=log, stamp=stamp, steps=steps)
        if not args.no_sensitivity:
            claims.plot_sensitivity(ledger, Path(args.figures) / "claims_sensitivity.png")
        if steps.reused:
            log(f"{stamp()} claims: finished steps taken from an earlier run: {steps.reused}")
        steps.finish()
        source = "computed now"
    if args.json:
        print(dumps({"source": source, "ledger": ledger}))
    else:
        print(f"claims ledger ({source})")
        print(claims.format_ledger(ledger))
    return 0


RESUME_HELP = ("take the comparisons and sensitivity variants an interrupted run finished from {dir} "
               "(kept until a run completes) instead of running them again; after changing the simulator's "
               "code, run without it")


def register(sub, bench_sub) -> None:
    p = sub.add_parser("reproduce", help="the MOCAP study on embedded defaults: tables, figures, claims ledger")
    p.add_argument("--results", default="results", help="directory for the CSV tables")
    p.add_argument("--figures", default="figures", help="directory for the PNG figures")
    p.add_argument("--models", default=None, help="comma-separated subset of the study models")
    p.add_argument("--quick", action="store_true", help="one model, two lengths, short annealing (a smoke run)")
    p.add_argument("--no-sensitivity", action="store_true", help="skip the claims' sensitivity runs")
    p.add_argument("--chunks", type=positive_int, default=StudyConfig.chunks,
                   help="chunk count M of the chunked schemes (TeraPipe, MBKR, LBCP, MOCAP)")
    p.add_argument("--seed", type=seed, default=1)
    p.add_argument("--resume", action="store_true", help=RESUME_HELP.format(dir="RESULTS/.reproduce-steps"))
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_reproduce)

    p = sub.add_parser("claims", help="the MOCAP paper's headline claims against this simulator, with sensitivity")
    p.add_argument("--results", default="results",
                   help="where reproduce wrote claims.json (with --run: where claims_rows.csv goes)")
    p.add_argument("--figures", default="figures", help="where the tornado figure goes (with --run)")
    p.add_argument("--run", action="store_true", help="recompute instead of reading results/claims.json")
    p.add_argument("--models", default=None, help="comma-separated subset of the study models (with --run)")
    p.add_argument("--lengths", type=positive_int, default=2, help="sequence lengths per model (with --run)")
    p.add_argument("--min-seq-len", type=positive_int, default=StudyConfig.min_seq_len,
                   help="shortest sequence length; the others are 4x apart (with --run)")
    p.add_argument("--no-sensitivity", action="store_true")
    p.add_argument("--chunks", type=positive_int, default=StudyConfig.chunks,
                   help="chunk count M of the chunked schemes (with --run)")
    p.add_argument("--seed", type=seed, default=1)
    p.add_argument("--resume", action="store_true",
                   help=RESUME_HELP.format(dir="RESULTS/.claims-steps") + " (with --run)")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_claims)
