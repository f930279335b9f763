"""Memory a sweep block may use (checked before a block program runs)."""

from __future__ import annotations

import os


def available_memory_bytes(device) -> int:
    """Memory a block may use: the host's available memory for CPU devices, else the device's free memory."""
    if device.platform != "cpu":
        stats = device.memory_stats() or {}
        if "bytes_limit" in stats:
            return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def gib(n: float) -> str:
    """Bytes as GiB with two decimals, for messages."""
    return f"{n / 2 ** 30:.2f} GiB"
