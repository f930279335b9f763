"""The scheme comparison: what each scheme chose runs as the plain simulator says, with tensor parallelism too."""

from __future__ import annotations

import math

import pytest

import mocap_jax as mj
from mocap_jax.partition.plan import PlanSettings
from mocap_jax.specs import SpecError
from mocap_jax.study.compare import CompareSettings, compare, plan_scheme
from mocap_jax.study.reproduce import StudyConfig


def _settings(tp: int, steps: int = 2) -> CompareSettings:
    plan = PlanSettings(chunks=4, granularity=256, chains=2, steps=steps, max_batch=8)
    return CompareSettings(chunks=4, plan=plan, max_batch=8, requests=8, tp=tp, with_max_seq=False)


@pytest.mark.parametrize("tp", [2])
def test_every_scheme_runs_its_choice_with_stage_groups(tp):
    """PP x TP for every scheme: each reported prefill equals ``simulate`` of the scheme's choice."""
    model, hw, S = "llama3.1-8b", "h100-x8", 4096
    lines = []
    out = compare(model, hw, S, schemes=("gpipe", "terapipe", "terapipe-dp", "mocap"), settings=_settings(tp, 24),
                  log=lines.append)
    by = {r["scheme"]: r for r in out["schemes"]}
    # progress: every scheme planned (with the batch it chose), then every scheme evaluated, in order;
    # the annealer reports every 8 steps, of which the log keeps the start and each quarter's first
    assert [line.split("] ", 1)[1] for line in lines] == (
        [f"{s}: planned, B' = {by[s]['batch']}" for s in ("gpipe", "terapipe", "terapipe-dp")]
        + [f"mocap: annealing, {k} of 24 steps" for k in (0, 8, 16)] + [f"mocap: planned, B' = {by['mocap']['batch']}"]
        + [f"{s}: evaluated at {out['load_rps']:.4g} requests/s" for s in by])
    assert out["tp"] == tp and all(r["feasible"] and r["tensor_parallel"] == tp for r in by.values())
    g = by["gpipe"]
    ref = mj.simulate(model, hw, S, "gpipe", batch=g["batch"], microbatch=g["chose"]["microbatch"], tp=tp,
                      timeline=False)
    assert math.isclose(g["prefill_latency_s"], ref.prefill_latency_s, rel_tol=1e-6)
    for scheme, sim in (("terapipe", "terapipe"), ("mocap", "mbkr")):
        r = by[scheme]
        ref = mj.simulate(model, hw, S, sim, batch=r["batch"], partition=r["partition"], tp=tp, timeline=False)
        assert math.isclose(r["prefill_latency_s"], ref.prefill_latency_s, rel_tol=1e-6), scheme
    # a stage of two GPUs runs each item faster than one GPU's share of the layers would on its own
    single = mj.simulate(model, hw, S, "terapipe", batch=by["terapipe"]["batch"], chunks=4, stages=4, timeline=False)
    assert by["terapipe"]["prefill_latency_s"] < single.prefill_latency_s
    # the longest sequence was not searched: the table has no max S columns (not a column of zeros)
    from mocap_jax.cli.partition import format_compare

    text = format_compare(out)
    assert not out["with_max_seq"] and "max S" not in text.splitlines()[2] and "not searched" in text
    # a B' at the search's upper end is a lower bound of the true one, and the table says so
    rows = {line.split()[0]: line for line in text.splitlines()[4:] if line.split() and line.split()[0] in by}
    assert rows.keys() == by.keys() and any(r["batch"] == out["max_batch"] == 8 for r in by.values())
    for scheme, line in rows.items():
        assert (f"{by[scheme]['batch']} (cap)" in line) == (by[scheme]["batch"] == 8), line
    # whether MBKR's passes settled is reported for the spilling scheme, and a row they left moving is named
    assert isinstance(by["mocap"]["mbkr_converged"], bool) and "mbkr_converged" not in by["terapipe"]
    assert ("still moved" in text) == (not by["mocap"]["mbkr_converged"])
    moving = {**out, "schemes": [{**r, "mbkr_converged": False} if r["scheme"] == "mocap" else r
                                 for r in out["schemes"]]}
    assert "mocap: MBKR's last pass still moved the timeline" in format_compare(moving)


@pytest.mark.parametrize("kw, fragment", [({"seed": -1}, "seed must be an integer >= 0"),
                                          ({"seed": 2 ** 40}, "seed = 1099511627776 exceeds"),
                                          ({"with_max_seq": "no"}, "with_max_seq must be true or false")])
def test_compare_settings_bad_input(kw, fragment):
    """Refused on construction, not after minutes of planning (a negative seed failed in NumPy's generator)."""
    with pytest.raises(ValueError, match=fragment):
        CompareSettings(**kw)


@pytest.mark.parametrize("kw, fragment", [({"chunks": 300}, "chunks"), ({"min_seq_len": 1000}, "multiple of 256"),
                                          ({"min_seq_len": 100}, "min_seq_len")])
def test_study_settings_bad_input(kw, fragment):
    with pytest.raises(ValueError, match=fragment):
        StudyConfig(**kw)


def test_the_chunk_count_assumption_sets_every_chunked_scheme():
    """The claims' chunk-count variant reaches the uniform schemes and MOCAP's LBCP search alike."""
    from mocap_jax.study import claims

    variant = next(v for v in claims.variants() if v.name == "chunk count" and v.value == "M = 64")
    st = claims._compare_settings(claims.reduced_setting(), variant, 65536)
    assert st.chunks == 64 and st.plan.chunks == 64 and st.plan.granularity == 256
    default = claims._compare_settings(claims.reduced_setting(), claims.Variant(), 65536)
    assert default.chunks == default.plan.chunks == claims.ClaimSetting.chunks


def test_a_default_load_too_small_for_arrivals_is_refused_by_name():
    """On the slowest hardware a spec may hold, half the saturation throughput is below the smallest
    representable rate: the comparison says so (and how to proceed), rather than blaming a load never given."""
    from mocap_jax.specs import SpecError, mocap_wafer

    slow = {f: 1.0 for f in ("peak_flops", "hbm_bandwidth", "link_bandwidth", "cross_wafer_bandwidth")}
    hw = mocap_wafer(2, 2, **slow)
    with pytest.raises(SpecError, match="the slowest scheme saturates at .* pass a load"):
        compare("llama3.1-8b", hw, 4096, schemes=("gpipe", "terapipe"), settings=_settings(1))


def test_a_load_whose_clock_cannot_resolve_the_latencies_is_refused():
    """At 1e-9 requests/s the last of 8 arrivals lies near 5e9 s, where float32 resolves 512 s: every
    end-to-end latency came out as 0.  The comparison refuses it and says what to change."""
    from mocap_jax.specs import SpecError

    with pytest.raises(SpecError, match=r"gpipe: load = 1e-09 .* float32 resolves time only to 512 s.*\(--dtype float64\)"):
        compare("llama3.1-8b", "mocap-2x2", 4096, load=1e-9, schemes=("gpipe",), settings=_settings(1))


def test_float32_end_to_end_latency_agrees_with_float64_wherever_the_clock_check_admits_it():
    """From half the saturation throughput down to loads the clock check refuses (256 Poisson
    arrivals): every latency float32 is allowed to report is within 5e-4 of float64 (mean, median
    and p99 end-to-end latency), and the lowest loads are refused."""
    from mocap_jax.specs import SpecError

    def settings(dtype):
        plan = PlanSettings(chunks=4, granularity=256, chains=2, steps=2, max_batch=8)
        return CompareSettings(chunks=4, plan=plan, max_batch=8, requests=256, with_max_seq=False, dtype=dtype)

    args = ("llama3.1-8b", "mocap-2x2", 4096)
    for scheme in ("gpipe", "terapipe"):
        saturation = compare(*args, schemes=(scheme,), settings=settings("float64"))["schemes"][0]["throughput_rps"]
        admitted, refused = 0, 0
        for fraction in (0.5, 0.1, 0.03, 0.01):
            exact = compare(*args, load=fraction * saturation, schemes=(scheme,), settings=settings("float64"))
            try:
                single = compare(*args, load=fraction * saturation, schemes=(scheme,), settings=settings("float32"))
            except SpecError as e:
                assert "too coarse for its end-to-end latencies" in str(e)
                refused += 1
                continue
            admitted += 1
            for key in ("e2e_latency_mean_s", "e2e_latency_p50_s", "e2e_latency_p99_s"):
                assert single["schemes"][0][key] == pytest.approx(exact["schemes"][0][key], rel=5e-4), (fraction, key)
        assert admitted >= 2 and refused >= 1, scheme


def test_the_e2e_objective_plans_at_the_load_it_is_given():
    """Compare and sweeps plan an ``e2e``-objective partition at their load and request count; without a
    load the objective has nothing to score, and says so."""
    st = CompareSettings(chunks=4, requests=8, dtype="float64", with_max_seq=False,
                         plan=PlanSettings(chunks=4, granularity=256, chains=2, steps=2, objective="e2e"))
    plan = plan_scheme("llama3.1-8b", "mocap-2x2", 4096, "lbcp", st, load=2.0).chose["plan"]
    assert plan["objective"] == "e2e" and plan["load_rps"] == 2.0
    with pytest.raises(SpecError, match="the e2e objective .* give a load"):
        plan_scheme("llama3.1-8b", "mocap-2x2", 4096, "lbcp", st)
