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


def test_a_figure_is_written_whole_or_not_at_all(tmp_path):
    """The one save path: the format follows the extension, an unknown one is refused before anything is
    written, a failed write keeps the previous figure, and no temporary file is left behind."""
    import pytest

    from mocap_jax.figures.style import plt, save
    from mocap_jax.specs import SpecError

    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    path = tmp_path / "line.pdf"
    assert save(fig, path) == str(path) and path.read_bytes().startswith(b"%PDF")
    before = path.read_bytes()
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    with pytest.raises(SpecError, match="extension"):
        save(fig, tmp_path / "line.xyz")
    fig.savefig = lambda *a, **k: (_ for _ in ()).throw(OSError("disk full"))
    with pytest.raises(OSError, match="disk full"):
        save(fig, path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["line.pdf"]
