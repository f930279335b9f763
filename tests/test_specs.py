"""Model and hardware specs: parameter counts, KV bytes, presets, spec files, mesh routing."""

import json

import numpy as np
import pytest

from mocap_jax.specs import mesh
from mocap_jax.specs import (HARDWARE_PRESETS, MODEL_PRESETS, ModelSpec, SpecError, get_hardware, get_model,
                             mocap_wafer)

# published parameter totals of the model cards (and active parameters for MoE models)
PUBLISHED = {
    "llama3-70b": (70.6e9, None),
    "mistral-large-123b": (122.6e9, None),
    "qwen3-235b-a22b": (235.1e9, 22.2e9),
    "llama3.1-405b": (405.9e9, None),
    "llama3.1-8b": (8.03e9, None),
    "qwen3-30b-a3b": (30.5e9, 3.3e9),
    "mixtral-8x22b": (140.6e9, 39.1e9),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_within_one_percent(name):
    total, active = PUBLISHED[name]
    m = get_model(name)
    assert abs(m.total_params / total - 1) < 0.01
    if active:
        assert abs(m.active_params / active - 1) < 0.02


@pytest.mark.parametrize("name,kv", [("llama3-70b", 4096), ("mistral-large-123b", 4096), ("llama3.1-405b", 4096),
                                     ("qwen3-235b-a22b", 2048)])
def test_kv_bytes_per_token_layer(name, kv):
    assert get_model(name).kv_bytes_per_token_layer(2) == kv


def test_mla_spec_caches_576_elements():
    m = get_model("deepseek-v3")
    assert m.attention == "mla"
    assert m.kv_elements_per_token_layer == 576
    assert abs(m.total_params / 671e9 - 1) < 0.01
    # attention FLOPs per (query, key) pair use the q.k width (192) and v width (128)
    assert m.attention_flops_per_pair == 2 * 128 * (192 + 128)


def test_derived_per_layer_quantities_of_llama70b():
    m = get_model("llama3-70b")
    attn = 2 * 8192 * 8192 + 2 * 8192 * 1024
    mlp = 3 * 8192 * 28672
    assert m.attention_params == attn
    assert m.dense_layer_params == attn + mlp + 2 * 8192
    assert m.layer_gemm_flops_per_token(moe=False) == 2 * m.dense_layer_params
    assert m.attention_flops_per_pair == 4 * 64 * 128


def test_qwen_moe_active_layer():
    m = get_model("qwen3-235b-a22b")
    assert m.q_heads * m.head_dim == 8192  # q projection wider than hidden
    assert m.moe_layer_active_params - m.attention_params - m.norm_params - m.router_params == 8 * 3 * 4096 * 1536


def test_hardware_presets_and_meshes():
    h = get_hardware("mocap-4x4")
    assert h.num_dies == 16 and h.total_flops == pytest.approx(72e15) and h.total_hbm == pytest.approx(2.88e12)
    assert get_hardware("mocap-3x5").num_dies == 15
    two = get_hardware("mocap-4x4x2w")
    assert two.num_dies == 32 and two.grid_cols == 8
    for g in ("b200-x8", "h100-x8", "a100-x8"):
        assert HARDWARE_PRESETS[g].topology == "switch"


def test_xy_routing_and_cross_wafer_links():
    hw = mocap_wafer(2, 2, wafers=2, cross_wafer_bandwidth=1e12)
    # die 1 (row 0, col 1) -> die 6 (row 1, col 2): X first across the wafer edge, then Y
    route = mesh.xy_route(hw, 1, 6)
    assert route == [(1, 2), (2, 6)]
    assert mesh.route_bandwidth(hw, 1, 6) == 1e12
    assert mesh.route_bandwidth(hw, 0, 1) == hw.link_bandwidth
    assert mesh.hop_matrix(hw)[0, 7] == 4


def test_snake_placement_keeps_neighbours():
    hw = get_hardware("mocap-4x4")
    pl = mesh.snake_placement(hw)
    hops, _ = mesh.handoff_routes(hw, pl)
    assert sorted(pl.tolist()) == list(range(16))
    assert np.all(hops[:-1] == 1)


def test_spec_files_json_and_toml(tmp_path):
    m = get_model("llama3-70b").to_dict()
    m["name"] = "my-model"
    (tmp_path / "m.json").write_text(json.dumps(m))
    assert get_model(str(tmp_path / "m.json")).total_params == get_model("llama3-70b").total_params
    (tmp_path / "h.toml").write_text('name = "w"\nrows = 3\ncols = 5\nhbm_capacity = 96e9\n')
    h = get_hardware(str(tmp_path / "h.toml"))
    assert h.num_dies == 15 and h.hbm_capacity == 96e9


@pytest.mark.parametrize("text,fragment", [
    ("{not json", "not valid JSON"),
    ('{"layers": 2}', "missing required field"),
    ('{"layers": 2, "hidden": 8, "ffn": 8, "q_heads": 2, "kv_heads": 2, "head_dim": 4, "vocab": 9, "colour": 1}',
     "unknown field"),
    ('{"layers": -2, "hidden": 8, "ffn": 8, "q_heads": 2, "kv_heads": 2, "head_dim": 4, "vocab": 9}', "positive"),
])
def test_malformed_model_files(tmp_path, text, fragment):
    p = tmp_path / "bad.json"
    p.write_text(text)
    with pytest.raises(SpecError, match=fragment):
        get_model(str(p))


def test_unknown_names_suggest_closest():
    with pytest.raises(ValueError, match="llama3-70b"):
        get_model("llama3-7b")
    with pytest.raises(ValueError, match="mocap-4x4"):
        get_hardware("mocap-4x")


def test_bad_hardware_values():
    with pytest.raises(SpecError, match="eff_gemm"):
        mocap_wafer(2, 2, eff_gemm=1.5)
    with pytest.raises(SpecError, match="rows"):
        mocap_wafer(0, 2)
    with pytest.raises(SpecError, match="peak_flops = 1e-20 is below the smallest accepted value, 1"):
        mocap_wafer(2, 2, peak_flops=1e-20)
    with pytest.raises(SpecError, match="eff_attention must be >= 0.0001"):
        mocap_wafer(2, 2, eff_attention=1e-30)


def test_the_slowest_accepted_hardware_keeps_float32_times_finite():
    """At the smallest magnitudes and efficiencies a spec may hold, ordinary work stays representable:
    a feasible point reports a finite latency instead of overflowing (which the honesty guard refuses)."""
    from mocap_jax import api

    slow = {f: 1.0 for f in ("peak_flops", "hbm_bandwidth", "link_bandwidth", "cross_wafer_bandwidth")}
    slow.update({f: 1e-4 for f in ("eff_gemm", "eff_attention", "eff_hbm", "eff_link")})
    r = api.simulate("llama3-70b", mocap_wafer(4, 4, **slow), 1 << 20, "terapipe", batch=4, timeline=False)
    assert r.feasible and 1e20 < r.prefill_latency_s < 1e30


def test_model_preset_names_cover_study():
    for n in ("llama3-70b", "mistral-large-123b", "qwen3-235b-a22b", "llama3.1-405b"):
        assert n in MODEL_PRESETS
    with pytest.raises(SpecError):
        ModelSpec("x", 2, 8, 8, 3, 2, 4, 9)  # q_heads not a multiple of kv_heads
