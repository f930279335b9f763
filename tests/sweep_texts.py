"""Sweep files shared by the sweep tests (TOML text)."""

# the model, mesh and chunk count of the cheap test sweeps (one small compiled program per bucket)
TINY = """
[sweep]
name = "{name}"
block_size = 8
[fixed]
model = "llama3.1-8b"
hardware = "mocap-2x2"
chunks = 4
"""

# 10^9 x 16 x 5 x 2 = 1.6e11 points; only seq_len and scheme decide the bucket (10 representatives)
HUGE = TINY.format(name="huge") + """[grid]
peak_flops = [1e15, 2e15, 3e15, 4e15, 5e15, 6e15, 7e15, 8e15, 9e15, 10e15]
hbm_bandwidth = [1e12, 2e12, 3e12, 4e12, 5e12, 6e12, 7e12, 8e12, 9e12, 10e12]
link_bandwidth = [1e12, 2e12, 3e12, 4e12, 5e12, 6e12, 7e12, 8e12, 9e12, 10e12]
eff_gemm = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
eff_attention = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
eff_hbm = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
eff_link = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
kv_bytes = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
activation_bytes = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
read_overlap = [0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75]
seq_len = [4096, 8192, 16384, 32768, 65536]
scheme = ["terapipe", "mbkr"]
"""

# one bucket (TeraPipe, K4 N4), 200 points in 25 blocks
SMALL = TINY.format(name="small") + """[grid]
hbm_bandwidth = [2e12, 4e12, 6e12, 8e12]
batch = [1, 2, 4, 8, 16]
seq_len = [4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288, 1048576, 2097152]
"""

# end-to-end latency at the given loads (one serving bucket, four points)
SERVING = """
[fixed]
model = "llama3.1-8b"
hardware = "mocap-2x2"
seq_len = 8192
chunks = 4
requests = 16
[grid]
batch = [1, 4]
load = [{loads}]
"""
