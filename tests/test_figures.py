"""Every figure's run and plot functions at tiny sizes: arrays come back, a PNG is written."""

import numpy as np

from mocap_jax.figures import chunks, gantt, latency, max_seq, occupancy


def test_occupancy_figure(tmp_path):
    d = occupancy.run_occupancy("llama3.1-8b", "mocap-2x2", 16384, chunks=4, batch=2, num_batches=1)
    assert d["terapipe_kv"].shape[1] == 4 and d["mbkr_kv"].shape[1] == 4
    assert (tmp_path / "o.png").name in occupancy.plot_occupancy(d, tmp_path / "o.png")
    assert (tmp_path / "o.png").stat().st_size > 10_000


def test_gantt_figure(tmp_path):
    d = gantt.run_gantt("llama3.1-8b", "mocap-2x2", 16384, chunks=4, batch=2, num_batches=1)
    assert d["start"].shape == (4, 4) and np.all(d["finish"] >= d["start"])
    gantt.plot_gantt(d, tmp_path / "g.png")
    assert (tmp_path / "g.png").stat().st_size > 10_000


def test_chunks_figure(tmp_path):
    d = chunks.run_chunks("llama3.1-8b", "mocap-2x2", 16384, chunks=4, granularity=512, chains=8, steps=10,
                         scheme="lbcp")
    assert d["annealed_partition"].sum() == 16384 and len(d["uniform_chunk_time_s"]) == 4
    chunks.plot_chunks(d, tmp_path / "c.png")
    assert (tmp_path / "c.png").stat().st_size > 10_000


def test_max_seq_figure(tmp_path):
    d = max_seq.run_max_seq("llama3.1-8b", "mocap-2x2", chunk_counts=(4, 8), granularity=65536,
                            workspaces=(("tile", None),))
    assert np.all(d[("tile", "terapipe")] > 0) and np.all(d[("tile", "mbkr")] % 65536 == 0)
    assert np.all(d[("tile", "mbkr")] >= d[("tile", "terapipe")])    # MBKR under overflow never shortens it
    max_seq.plot_max_seq(d, tmp_path / "m.png")
    assert (tmp_path / "m.png").stat().st_size > 10_000


def test_latency_figure(tmp_path):
    rows = [{"model": m, "scheme": s, "seq_len": S, "e2e_latency_mean_s": v, "throughput_rps": 1.0}
            for m in ("a", "b") for s in ("terapipe", "mocap") for S, v in ((16384, 1.0), (65536, None))]
    latency.plot_latency(rows, tmp_path / "l.png")
    assert (tmp_path / "l.png").stat().st_size > 10_000
