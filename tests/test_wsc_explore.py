"""Design-space exploration, de-confounded baselines, figures and their CLI (tiny sizes)."""

import csv
import math
import dataclasses
import json

import numpy as np
import pytest

from mocap_jax.cli import main
from mocap_jax.cli.wsc_explore import bench_explore
from mocap_jax.specs import SpecError
from mocap_jax.wsc import baselines as bl
from mocap_jax.wsc import bursts
from mocap_jax.wsc import explore as ex
from mocap_jax.wsc import figures as fg
from mocap_jax.wsc import ranking as rk
from mocap_jax.wsc import robustness as rb
from mocap_jax.wsc import serving as sv
from mocap_jax.wsc import setup as su

CONFIG = su.ServingConfig(max_batch=32)
TINY = ["--max-batch", "32"]


def test_template_points():
    pts = ex.template_points()
    assert len(pts) == 2 * 3 * 3
    p = pts[0]
    assert (p.rows, p.cols) == (6, 9) and p.dram_tbps == p.dram_gb / 32  # 32 GB <-> 1 TB/s, 64 <-> 2, 96 <-> 3
    assert {(q.dram_gb, q.dram_tbps) for q in pts} == {(32, 1), (64, 2), (96, 3)}
    full = ex.template_points(((6, 9),), (32, 64), (2.0,), dram_tbps=(1, 3))
    assert [(q.dram_gb, q.dram_tbps) for q in full] == [(32, 1), (32, 3), (64, 1), (64, 3)]
    assert p.spec().dram_capacity == 32e9 and p.spec().num_dies == 54
    assert ex.parse_grids("6x9, 5X8") == ((6, 9), (5, 8))
    for bad in ("6by9", "0x3", ""):
        with pytest.raises(SpecError):
            ex.parse_grids(bad)
    with pytest.raises(SpecError, match="positive"):
        ex.template_points(dram_gb=(32, -1))


#: the (points done, points) the exploration of the ``explored`` fixture reported
PROGRESS = []


def small_sweep() -> ex.Sweep:
    hw = ex.template_points(((4, 4),), dram_gb=(32, 64), d2d_tbps=(1.5, 2.5))
    return ex.Sweep(("llama2-7b",), ("azure-code", "azure-conv"), (1.0, 2.0), tuple(hw), requests=40, seed=1)


@pytest.fixture(scope="module")
def explored():
    return ex.explore(small_sweep(), CONFIG, progress=lambda done, total: PROGRESS.append((done, total)))


def test_bench_explore_reports_progress_across_its_runs(explored, monkeypatch):
    events = []
    pool = sv._LanePool
    monkeypatch.setattr(sv, "_LanePool", lambda *a: (events.append("compile"), pool(*a))[1])
    r = bench_explore(small_sweep(), CONFIG, repeat=2, progress=lambda done, total: events.append((done, total)))
    assert len(r["runs"]) == 2 and r["points"] == explored.timing["points"] == 16
    assert r["devices"] >= 1 and r["cpu"] and r["cpus"] >= 1     # same-CPU ratios need the CPU named
    # each run reports before its program compiles (a bar shows meanwhile); one count over both runs
    assert events[:2] == [(0, 32), "compile"] and events.count("compile") == 2
    seen = [e for e in events if e != "compile"]
    assert {total for _, total in seen} == {32} and seen[-1] == (32, 32) and (16, 32) in seen
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)


def test_explore_rows_best_and_csv(explored, tmp_path):
    res = explored
    assert len(res.rows) == 4 * 2 * 2 and res.timing["groups"] == 1  # one compiled program for every point
    # progress: from none done once compiled, never backwards, to every point
    done = [d for d, _ in PROGRESS]
    assert PROGRESS[0] == (0, 16) and PROGRESS[-1] == (16, 16) and {t for _, t in PROGRESS} == {16}
    assert done == sorted(done) and len(set(done)) == len(done)
    assert all(r["feasible"] and r["finished"] == 40 for r in res.rows)
    # common random numbers: every hardware point of a (workload, load) saw the same trace
    for w in ("azure-code", "azure-conv"):
        rates = {r["rate_rps"] for r in res.rows if r["workload"] == w and r["load"] == 1.0}
        assert len(rates) == 1
    # the best design per workload maximises its score among the explored points
    sc = rk.scores(res.rows)
    assert {b["subset"] for b in res.best} == {"all", "shoreline"}  # 32 GB / 1 TB/s / 2.5 TB/s is on the line
    assert [b["hardware"] for b in res.best if b["subset"] == "shoreline"] == ["4x4 32GB 1TB/s D2D 2.5TB/s"] * 2
    for b in [b for b in res.best if b["subset"] == "all"]:
        mine = sc[(b["hardware"], "llama2-7b", b["workload"])]["score"]
        assert mine == max(v["score"] for (h, m, w), v in sc.items() if w == b["workload"])
        assert b["score_geomean"] == pytest.approx(1.0)
    assert {b["workload"] for b in res.best_per_model} == {"azure-code", "azure-conv"}
    path = res.write_csv(tmp_path / "x.csv")
    rows = list(csv.DictReader(path.open()))
    assert len(rows) == len(res.rows) and {"dram_gb", "d2d_tbps", "goodput_rps", "e2e_p99_s", "tokens_per_s"} <= set(rows[0])


def test_design_space_figure_run_and_plot(explored, tmp_path):
    data = fg.run_design_space(explored)
    assert data["goodput"].shape == (2, 1, 2, 2)  # workloads x models x D2D x (grid, DRAM)
    assert np.nanmax(data["goodput_norm"]) == pytest.approx(1.0)
    for i, (y, x) in enumerate(data["best_cell"]):
        assert data["goodput_norm"][i, 0, y, x] == pytest.approx(1.0)
    path = fg.plot_design_space(data, tmp_path / "wsc_design_space.png")
    assert path.exists() and path.stat().st_size > 10_000


def test_ranking_counts_the_points_whose_goodput_is_only_the_offered_rate():
    """Points that met every SLO at every rate score the offered rates alike: the ranking says how many."""
    hw = ex.template_points(((4, 4),), dram_gb=(32, 64, 96), d2d_tbps=(2.0,))

    def row(h, load, attainment, e2e, feasible=True):
        return dict(grid=f"{h.rows}x{h.cols}", dram_gb=h.dram_gb, dram_tbps=h.dram_tbps, d2d_tbps=h.d2d_tbps, model="m",
                    workload="w", load=load, feasible=feasible, slo_attainment=attainment,
                    goodput_rps=10.0 * load * attainment if feasible else 0.0, e2e_mean_s=e2e)

    a, b, c = hw
    rows = [row(a, 1, 1.0, 2.0), row(a, 2, 1.0, 3.0),      # every SLO met at both rates
            row(b, 1, 1.0, 1.0), row(b, 2, 1.0, 1.5),      # the same goodput, lower E2E: ranked first
            row(c, 1, 1.0, 1.0), row(c, 2, 0.5, 9.0)]      # saturated at the higher rate
    _, per_model = rk.best_designs(rows, hw, ["m"], ["w"])
    (best,) = [p for p in per_model if p["subset"] == "all"]
    assert best["hardware"] == b.label and best["goodput_sum_rps"] == 30.0
    assert (best["points_meeting_every_slo"], best["points"]) == (2, 3)
    rows[-2:] = [row(c, load, 0.0, math.inf, feasible=False) for load in (1, 2)]   # a point that cannot serve m
    _, per_model = rk.best_designs(rows, hw, ["m"], ["w"])
    assert [(p["points_meeting_every_slo"], p["points"]) for p in per_model if p["subset"] == "all"] == [(2, 2)]


def test_burst_check_takes_the_best_the_runner_up_and_the_best_of_each_other_grid_and_dram():
    hw = ex.template_points(((4, 4),), dram_gb=(32, 64, 96), d2d_tbps=(1.5, 2.5))
    score = {(96, 1.5): 30.0, (96, 2.5): 29.0, (64, 1.5): 20.0, (64, 2.5): 25.0, (32, 1.5): 10.0, (32, 2.5): 0.0}
    rows = [dict(grid="4x4", dram_gb=h.dram_gb, dram_tbps=h.dram_tbps, d2d_tbps=h.d2d_tbps, model="llama2-7b",
                 workload="azure-conv", load=1.0, feasible=score[(h.dram_gb, h.d2d_tbps)] > 0, slo_attainment=0.5,
                 goodput_rps=score[(h.dram_gb, h.d2d_tbps)], e2e_mean_s=1.0) for h in hw]
    sweep = ex.Sweep(("llama2-7b",), ("azure-conv",), (1.0,), tuple(hw))
    res = ex.ExploreResult(rows=rows, best=[], best_per_model=[], rates={("llama2-7b", "azure-conv"): [1.0]})
    label = {(h.dram_gb, h.d2d_tbps): h.label for h in hw}
    got = lambda k: bursts.contenders(res, sweep, k)[("azure-conv", "llama2-7b")]
    # the runner-up is the best's D2D twin; other DRAMs enter by their best point, best first; 32 GB at
    # 2.5 TB/s cannot serve the model
    assert got(3) == [label[(96, 1.5)], label[(96, 2.5)], label[(64, 2.5)], label[(32, 1.5)]]
    assert got(1) == [label[(96, 1.5)], label[(96, 2.5)], label[(64, 2.5)]]
    assert got(0) == [label[(96, 1.5)], label[(96, 2.5)]]
    sc = rk.scores(rows)
    verdict = lambda best, rival: bursts._verdict(sc, ("azure-conv", "llama2-7b"), label[best], label[rival])
    assert verdict((96, 1.5), (64, 2.5)) == "holds" and verdict((64, 2.5), (96, 1.5)) == "flips"
    assert verdict((96, 1.5), (96, 2.5)) == "holds" and bursts._verdict(sc, ("azure-conv", "llama2-7b"),
                                                                        label[(96, 1.5)], None) == "no rival"
    (twin,) = [r for r in rows if (r["dram_gb"], r["d2d_tbps"]) == (96, 2.5)]
    twin["goodput_rps"] = 30.0 * (1 - bursts.TIE_RTOL / 2)       # within the tie tolerance
    assert bursts._verdict(rk.scores(rows), ("azure-conv", "llama2-7b"), label[(96, 1.5)], label[(96, 2.5)]) == "tied"


def test_robustness_ranks_each_perturbation_as_its_own_run():
    """The nominal run is the exploration's answer; an identity perturbation ranks exactly as the nominal
    model; a strong one changes the margins (tight SLOs, so the designs' goodput differs); how the
    perturbations are grouped into batched runs changes nothing; progress counts every design point of
    every run."""
    hw = ex.template_points(((2, 4), (3, 4), (4, 4)), dram_gb=(32,), d2d_tbps=(2.0,))
    sweep = ex.Sweep(("llama2-7b",), ("azure-code", "azure-conv"), (1.0, 2.0), tuple(hw), requests=40, seed=1)
    tight = dataclasses.replace(CONFIG, ttft_slo_s=0.3, tpot_slo_s=0.03)
    perts = [rb.Perturbation(eff_dram=0.6, eff_link=0.5, hop_latency=3.0, alpha=3.0, contention="proportional"),
             rb.Perturbation(),                                  # the nominal model: alpha 1.5, max-min
             rb.Perturbation(eff_gemm=0.9, eff_attention=1.1, hop_latency=0.5, alpha=1.0)]
    reports = []
    res = rb.run_robustness(sweep, perts, tight, {}, group=2, progress=lambda done, total: reports.append((done, total)))
    assert reports[-1] == (4 * 12, 4 * 12) and [d for d, _ in reports] == sorted(d for d, _ in reports)
    # the nominal best per workload is the exploration's best (geometric mean over models, every point)
    explored = ex.explore(sweep, tight, {})
    nominal = {r["workload"]: r["best"] for r in res.nominal_best if r["model"] == "all"}
    assert nominal == {b["workload"]: b["hardware"] for b in explored.best if b["subset"] == "all"}
    by_scope = {(r["workload"], r["model"]): r for r in res.nominal_best}
    rows = {(r["perturbation"], r["workload"], r["model"]): r for r in res.per_perturbation}
    assert len(by_scope) == 4 and len(rows) == 3 * 4
    for (w, m), n in by_scope.items():
        same = rows[(1, w, m)]
        assert (same["best"], same["runner_up"], same["margin"]) == (n["best"], n["runner_up"], n["margin"])
        assert same["nominal_best_relative"] == 1.0
    assert any(rows[(0, w, m)]["margin"] != n["margin"] for (w, m), n in by_scope.items())
    alone = rb.run_robustness(sweep, perts, tight, {}, group=4)
    assert alone.per_perturbation == res.per_perturbation and alone.summary == res.summary


def test_sweep_bad_input():
    hw = tuple(ex.template_points(((4, 4),), (32,), (2.0,)))
    with pytest.raises(SpecError, match="loads must be positive"):
        ex.Sweep(("llama2-7b",), ("code",), (-1.0,), hw, requests=10)
    with pytest.raises(SpecError, match="unknown workload"):
        ex.Sweep(("llama2-7b",), ("chat",), (1.0,), hw, requests=10)
    with pytest.raises(ValueError, match="unknown model"):
        ex.Sweep(("gpt-5",), ("code",), (1.0,), hw, requests=10)
    with pytest.raises(SpecError, match="requests must be an integer >= 2"):
        ex.Sweep(("llama2-7b",), ("code",), (1.0,), hw, requests=1)


@pytest.fixture(scope="module")
def baselines():
    return bl.run_baselines("llama2-7b", "azure-conv", loads=(1.0, 2.0), requests=40, wafer="wsc-4x4",
                            cluster="a100-cluster-2x8", config=CONFIG, seed=2)


@pytest.mark.slow
def test_baselines_table_gains_and_figures(baselines, tmp_path):
    res = baselines
    assert len(res.rows) == (4 + 4) * 2
    systems = {r["system"] for r in res.rows if r["kind"] == "system"}
    assert systems == {s[0] for s in bl.SYSTEMS}
    row = {(r["kind"], r["system"], r["load"]): r for r in res.rows}
    assert row[("system", "A100 + Splitwise", 1.0)]["prefill"] == "1x8/megatron"      # TP 8 = one node
    assert row[("system", "wafer + Splitwise sched.", 1.0)]["decode"] == "2x4/megatron"  # TP 8 = 2x4 dies
    assert row[("system", "wafer + WSC-LLM", 1.0)]["memory"] == "greedy"
    assert row[("ablation", "no memory scheduler", 1.0)]["memory"] == "local"
    assert row[("ablation", "no central scheduler", 1.0)]["scheduler"] == "naive"
    # the full system and its ablation row are the same simulation
    assert row[("ablation", "WSC-LLM (full)", 2.0)]["e2e_mean_s"] == row[("system", "wafer + WSC-LLM", 2.0)]["e2e_mean_s"]
    g = res.gains[0]
    a, b = row[("system", "wafer + WSC-LLM", 1.0)]["goodput_rps"], row[("system", "A100 + WSC-LLM sched.", 1.0)]["goodput_rps"]
    assert g["hardware_gain_wsc"] == pytest.approx(a / b)
    assert g["total_gain"] == pytest.approx(g["scheduler_gain_a100"] * g["hardware_gain_wsc"])
    cdf = fg.run_latency_cdf(res, load=2.0)
    assert len(cdf["e2e"]) == 4 and all(np.all(np.diff(x) >= 0) for x in cdf["e2e"])
    assert fg.plot_latency_cdf(cdf, tmp_path / "cdf.png").exists()
    abl = fg.run_ablation(res)
    assert abl["goodput"].shape == (4, 2) and np.all(abl["goodput"] >= 0)
    assert fg.plot_ablation(abl, tmp_path / "abl.png").exists()
    with pytest.raises(ValueError, match="was not simulated"):
        fg.run_latency_cdf(res, load=3.0)


def test_explore_cli(tmp_path, capsys):
    out, fig = tmp_path / "res", tmp_path / "ds.png"
    code = main(["wsc-llm", "explore", "--models", "llama2-7b", "--workloads", "code,conv", "--grids", "4x4",
                 "--dram-gb", "32,64", "--d2d-tbps", "1.5,2.5", "--loads", "1,2", "--requests", "40", "--seed", "1",
                 "--out", str(out), "--figure", str(fig), "--json", "--burst-factor", "3", *TINY])
    d = json.loads(capsys.readouterr().out)
    assert code == 0 and fig.exists() and (out / "wsc_explore.csv").exists() and (out / "wsc_explore_best.csv").exists()
    assert len(d["best"]) == 4 and d["timing"]["points"] == 16
    # the burst check: per workload, the exploration's best and its contenders at the highest rate (2x), with
    # bursts 3x as long at the same rate, ranked again by the exploration's score with that rate's row replaced
    b = d["bursts"]
    assert b["factor"] == 3 and (out / "wsc_explore_bursts.csv").exists()
    assert [v["workload"] for v in b["verdicts"]] == ["azure-code", "azure-conv"]
    best = {p["workload"]: p["hardware"] for p in d["best_per_model"] if p["subset"] == "all"}
    rows = {(r["workload"], rk.hardware_key(r), r["load"]): r for r in d["rows"]}
    longer = {(r["workload"], rk.hardware_key(r)): r for r in b["rows"]}
    assert len(longer) == len(b["rows"]) == sum(v["contenders"] for v in b["verdicts"])
    for v in b["verdicts"]:
        w = v["workload"]
        assert v["best"] == best[w] and (v["requests"], v["requests_longer"]) == (40, 120)
        assert all(r["requests"] == 120 and r["load"] == 2.0 for (ww, _), r in longer.items() if ww == w)
        assert v["rival"] is not None and v["rival"][:10] != v["best"][:10]   # another DRAM (one grid here)
        after = {h: rows[(w, h, 1.0)]["goodput_rps"] + r["goodput_rps"] for (ww, h), r in longer.items() if ww == w}
        mine, theirs = after[v["best"]], after[v["rival"]]
        assert v["best_goodput_longer_rps"] == longer[(w, v["best"])]["goodput_rps"]
        assert v["best_goodput_rps"] == rows[(w, v["best"], 2.0)]["goodput_rps"]
        expected = ("tied" if abs(mine - theirs) <= bursts.TIE_RTOL * max(mine, theirs) else
                    "holds" if mine > theirs else "flips")
        assert v["verdict"] == expected


@pytest.mark.slow
def test_baselines_cli(tmp_path, capsys):
    out = tmp_path / "res"
    code = main(["wsc-llm", "baselines", "--model", "llama2-7b", "--wafer", "wsc-4x4", "--cluster",
                 "a100-cluster-2x8", "--loads", "1,2", "--requests", "40", "--seed", "2", "--out", str(out),
                 "--figures-dir", str(tmp_path), *TINY])
    text = capsys.readouterr().out
    assert code == 0 and text.startswith("WSC-LLM baselines: llama2-7b, azure-conv")
    assert "gains (goodput ratios" in text and "A100 + Splitwise" in text
    assert (tmp_path / "wsc_latency_cdf.png").exists() and (tmp_path / "wsc_ablation.png").exists()
    assert (out / "wsc_baselines.csv").exists() and (out / "wsc_baselines_gains.csv").exists()


@pytest.mark.parametrize("args,fragment", [
    (["explore", "--loads", "1,-2"], "--loads values must be positive"),
    (["explore", "--grids", "4by4"], "die grids are given as RxC"),
    (["explore", "--workloads", "chat"], "unknown workload"),
    (["explore", "--workloads", "azure_conv_trace.csv"], "runs the synthetic presets, not trace files"),
    (["baselines", "--workload", "azure_conv_trace.csv"], "runs the synthetic presets, not trace files"),
    (["explore", "--dram-gb", "abc"], "--dram-gb expects comma-separated numbers"),
    (["explore", "--window-s", "0"], "--window-s must be > 0"),
    (["explore", "--burst-factor", "1"], "--burst-factor"),
    (["explore", "--grids", "0x9"], "rows and cols must be positive"),
    (["explore", "--grids", "6xa"], "die grids are given as RxC"),
    (["explore", "--dram-gb", "0,64"], "--dram-gb values must be positive"),
    (["explore", "--d2d-tbps", "-1"], "--d2d-tbps values must be positive"),
    (["explore", "--contention", "fair"], "unknown contention rule 'fair'"),
    (["explore", "--dram-gb", "64,64"], "dram_gb lists 64 twice"),
    (["explore", "--grids", "6x9,6X9"], "grids lists 6x9 twice"),
    (["explore", "--models", "llama2-7b,llama2-7b"], "models lists llama2-7b twice"),
    (["explore", "--workloads", "azure-conv,azure-conv"], "workloads lists azure-conv twice"),
    (["explore", "--loads", "1,1.0"], "loads lists 1 twice"),
    (["robustness", "--d2d-tbps", "2,2"], "d2d_tbps lists 2 twice"),
    (["baselines", "--cluster", "wsc-4x4"], "must be a GPU cluster"),
    (["baselines", "--loads", "0"], "--loads values must be positive"),
    (["baselines", "--model", "nope"], "unknown model"),
])
def test_cli_bad_input_exit_2(args, fragment, capsys):
    code = main(["wsc-llm", *args])
    err = capsys.readouterr().err
    assert code == 2 and fragment in err and "Traceback" not in err and err.count("\n") == 1


@pytest.mark.parametrize("value", ["0", "-66", "nan", "inf"])
def test_bench_explore_refuses_a_baseline_that_is_no_wall_time(value, capsys, monkeypatch):
    monkeypatch.setattr(ex, "explore", lambda *a, **k: pytest.fail("ran the exploration"))
    code = main(["bench", "wsc-explore", "--baseline-s", value, "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "--baseline-s" in err and "Traceback" not in err and err.count("\n") == 1


@pytest.mark.slow
def test_bench_wsc_serving_json(capsys):
    code = main(["bench", "wsc-serving", "--model", "llama2-7b", "--hardware", "wsc-4x4", "--points", "2",
                 "--requests", "40", "--json", *TINY])
    d = json.loads(capsys.readouterr().out)
    assert code == 0 and d["points"] == 2 and d["same_finished_all"]
    assert d["e2e_max_rel_err_max"] < 1e-4
    assert main(["bench", "wsc-serving", "--points", "0"]) == 2
