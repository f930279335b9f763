"""The shipped table of published prefill measurements, its loader's checks, and SGLang-style
dynamic chunking."""

import numpy as np
import pytest

from mocap_jax.cli import main
from mocap_jax.costs import HardwareParams, ModelParams, dense_layer_time
from mocap_jax.specs import SpecError, get_model, gpu_node
from mocap_jax.validation import published as pub


def test_shipped_table_covers_sources_and_pp_tp_chunked_rows():
    rows = pub.load_published()
    assert len(rows) >= 8
    assert len({r["source"] for r in rows}) >= 3
    chunked_pp_tp = [r for r in rows if r["pp"] > 1 and r["tp"] > 1 and r["chunking"] != "none"]
    assert len(chunked_pp_tp) >= 2
    for r in rows:
        assert r["source"].startswith("https://") and r["where"]
        assert r["gpus"] == r["tp"] * r["pp"]


HEADER = "model,gpu,gpus,tp,pp,precision,chunking,chunk_tokens,seq_len,batch,metric,measured,software,source\n"


@pytest.mark.parametrize("line, match", [
    ("llama2-7b,a100,2,1,1,bf16,none,,2048,1,ttft_s,0.1,x,y", "must equal tp x pp"),
    ("llama2-7b,a100,1,1,1,int4,none,,2048,1,ttft_s,0.1,x,y", "unknown .*precision"),
    ("llama2-7b,a100,1,1,1,bf16,none,,2048,1,latency,0.1,x,y", "unknown .*metric"),
    ("llama2-7b,a100,1,1,1,bf16,none,,2048,1,ttft_s,fast,x,y", "measured must be a number"),
    ("llama2-7b,a100,1,1,1,bf16,fixed,,2048,1,ttft_s,0.1,x,y", "chunk_tokens must be an integer"),
    ("llama2-7b,a100,1.5,1,1,bf16,none,,2048,1,ttft_s,0.1,x,y", "gpus must be an integer"),
])
def test_loader_rejects_bad_rows(tmp_path, line, match):
    f = tmp_path / "t.csv"
    f.write_text(HEADER + line + "\n")
    with pytest.raises(SpecError, match=match):
        pub.load_published(f)


def test_loader_rejects_bad_files(tmp_path, capsys):
    with pytest.raises(SpecError, match="cannot read"):
        pub.load_published(tmp_path / "missing.csv")
    f = tmp_path / "t.csv"
    f.write_text("model,gpu\nllama2-7b,a100\n")
    with pytest.raises(SpecError, match="lacks column"):
        pub.load_published(f)
    f.write_text(HEADER + "llama2-7b,z100,1,1,1,bf16,none,,2048,1,ttft_s,0.1,x,y\n")
    with pytest.raises(SpecError, match="unknown GPU 'z100'"):
        pub.row_hardware(pub.load_published(f)[0])
    assert main(["validate", "--published", str(tmp_path / "missing.csv")]) == 2
    err = capsys.readouterr().err
    assert "cannot read" in err and len(err.strip().splitlines()) == 1


def test_dynamic_chunks_keep_equal_cost_and_the_rules():
    hw = gpu_node("h20", 4, precision="fp8")
    chunks = pub.dynamic_partition("llama3.1-8b", hw, 200_000, 16384, 1.0, tp=4)
    assert sum(chunks) == 200_000
    assert all(a >= b for a, b in zip(chunks[:-2], chunks[1:-1]))          # shrinking as the prefix grows
    assert all(c % 64 == 0 and c >= 16384 // 4 for c in chunks[:-1])
    mp = ModelParams.from_spec(get_model("llama3.1-8b"), np.float64)
    hp = HardwareParams.from_spec(hw, np.float64)
    cost = lambda c, p: float(dense_layer_time(mp, hp, float(c), float(p), 1.0, np, 4.0))
    target, done = cost(16384, 0), 0
    for c in chunks[:-1]:
        if c > 16384 // 4:
            assert cost(c, done) <= target < cost(c + 64, done)               # the largest equal-time chunk
        done += c
    assert pub.dynamic_partition("llama3.1-8b", hw, 100_000, 16384, 0.0, tp=4)[:6] == [16384] * 6
