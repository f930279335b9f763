"""A long study's finished steps on disk: a resumed run takes exactly what the interrupted one computed."""

from __future__ import annotations

import json
import math

import pytest

from mocap_jax.partition.plan import PlanSettings
from mocap_jax.study.compare import CompareSettings
from mocap_jax.study.reproduce import study_comparison
from mocap_jax.study.steps import StepStore


def _must_not_run():
    raise AssertionError("a stored step ran again")


def _settings(chunks: int = 4) -> CompareSettings:
    plan = PlanSettings(chunks=chunks, granularity=256, chains=2, steps=2, max_batch=8)
    return CompareSettings(chunks=chunks, plan=plan, max_batch=8, requests=8, with_max_seq=False)


def test_a_resumed_comparison_is_the_one_the_interrupted_run_computed(tmp_path):
    args = ("llama3.1-8b", "mocap-2x2", 4096, ("terapipe", "lbcp"))
    first = study_comparison(StepStore(tmp_path), *args, _settings())
    again = StepStore(tmp_path, resume=True)
    assert study_comparison(again, *args, _settings()) == first and again.reused == 1 and again.last_reused
    # any input that differs runs the step: here the chunk count (its file is a different one)
    with pytest.raises(AssertionError, match="ran again"):
        StepStore(tmp_path, resume=True).run("compare", {"model": args[0], "hardware": args[1], "seq_len": args[2],
                                                         "schemes": args[3], "settings": _settings(8)}, _must_not_run)


def test_steps_are_reused_only_when_asked_and_only_whole(tmp_path):
    inputs = {"model": "m", "variant": PlanSettings(chunks=4)}
    value = {"latency_s": math.inf, "rows": [1, 2.5, None, "x"], "ok": True}
    assert StepStore(tmp_path).run("sensitivity", inputs, lambda: value) == value
    assert StepStore(tmp_path, resume=True).run("sensitivity", inputs, _must_not_run) == value
    # without resume every step runs again
    assert StepStore(tmp_path).run("sensitivity", inputs, lambda: {"new": 1}) == {"new": 1}
    # a nested input that differs is another step
    other = {"model": "m", "variant": PlanSettings(chunks=8)}
    assert StepStore(tmp_path, resume=True).run("sensitivity", other, lambda: 7) == 7
    # a file cut short (or not written by the store) is computed again, not trusted
    for path in tmp_path.glob("sensitivity-*.json"):
        path.write_text(path.read_text()[:10])
    assert StepStore(tmp_path, resume=True).run("sensitivity", inputs, lambda: 3) == 3
    assert json.loads(next(p for p in tmp_path.glob("*.json") if '"value": 3' in p.read_text()).read_text())["value"] == 3
    store = StepStore(tmp_path / "steps")
    store.run("x", {}, lambda: 1)
    store.finish()
    assert not (tmp_path / "steps").exists()


def test_a_table_that_fails_half_way_leaves_the_earlier_file_whole(tmp_path):
    from mocap_jax.specs.files import write_rows

    path = write_rows(tmp_path / "t" / "rows.csv", [{"a": 1, "b": [2, 3]}, {"c": "x"}])
    before = path.read_text()
    assert before.splitlines() == ["a,b,c", '1,"[2, 3]",', ",,x"]

    def cell(key, value):
        if key == "c":
            raise RuntimeError("interrupted")
        return value

    with pytest.raises(RuntimeError):
        write_rows(path, [{"a": 9}, {"c": "y"}], cell)
    assert path.read_text() == before and [p.name for p in path.parent.iterdir()] == ["rows.csv"]
