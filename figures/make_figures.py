"""Regenerate any of the study's figures: ``python figures/make_figures.py [NAME ...] [--quick]``.

Each figure module in ``mocap_jax.figures`` has a ``run_*`` function that returns arrays and a
``plot_*`` function that draws them; this script only wires the two together.
``mocap-jax reproduce`` makes all of them (and the latency figure, which needs the study's rows).
"""

import argparse
from pathlib import Path

from mocap_jax.figures import chunks, gantt, max_seq, occupancy

HERE = Path(__file__).resolve().parent


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("names", nargs="*", default=["occupancy", "gantt", "chunks", "max_seq"])
    p.add_argument("--quick", action="store_true", help="small sizes (seconds)")
    args = p.parse_args(argv)
    q = args.quick
    for name in args.names:
        if name == "occupancy":
            d = occupancy.run_occupancy(seq_len=65536 if q else 5_600_000, chunks=8 if q else 16, num_batches=1)
            print(occupancy.plot_occupancy(d, HERE / "kv_occupancy_heatmap.png"))
        elif name == "gantt":
            d = gantt.run_gantt(seq_len=65536 if q else 5_600_000, chunks=8 if q else 16, num_batches=1)
            print(gantt.plot_gantt(d, HERE / "gantt_mbkr.png"))
        elif name == "chunks":
            d = chunks.run_chunks(chains=16 if q else 128, steps=20 if q else 300)
            print(chunks.plot_chunks(d, HERE / "chunk_sizes.png"))
        elif name == "max_seq":
            d = max_seq.run_max_seq(chunk_counts=(8, 16) if q else (4, 8, 16, 32, 64))
            print(max_seq.plot_max_seq(d, HERE / "max_seq_vs_chunks.png"))
        else:
            raise SystemExit(f"unknown figure {name!r}; choose occupancy, gantt, chunks, max_seq")


if __name__ == "__main__":
    main()
