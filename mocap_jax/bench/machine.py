"""The host a benchmark ran on, reported beside its figures.

A speed target is judged on one CPU: the same code ran 2-3.5x apart on the 2-core machines the
project's figures come from (docs/performance.md, "The machines"), and a ratio against another
program (``bench wsc-explore --baseline-s``) holds only for the CPU both ran on.  Every benchmark's
result therefore names its devices and the host's CPU, cores and load average.
"""

from __future__ import annotations

import os
import platform


def cpu_name(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The host CPU's model name, with its family and model numbers where the OS lists them
    (``"AMD EPYC (family 25, model 1)"``: machines sold under one name differ by generation), else
    the platform's processor string."""
    fields: dict[str, str] = {}
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if not sep:
                    if fields:              # the first processor's block has ended
                        break
                    continue
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or platform.machine() or "unknown CPU"
    if fields.get("cpu family") and fields.get("model"):
        return f"{name} (family {fields['cpu family']}, model {fields['model']})"
    return name


def host() -> dict:
    """``cpu`` (:func:`cpu_name`), ``cpus`` (the cores this process may run on) and
    ``load_average`` (over the last minute; None where the OS keeps none), read when called: a
    benchmark calls it before it starts, so the load is the machine's, not its own."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"cpu": cpu_name(), "cpus": cpus, "load_average": load}


def local_devices() -> dict:
    """``devices`` (how many local JAX devices) and ``device_kind`` (the first one's)."""
    import jax

    devices = jax.local_devices()
    return {"devices": len(devices), "device_kind": devices[0].device_kind}


def describe(result: dict) -> str:
    """``"<cpu>, <n> cores, load <x>"`` from a result holding :func:`host`'s fields."""
    load = result.get("load_average")
    return f"{result['cpu']}, {result['cpus']} cores, load {'-' if load is None else f'{load:.1f}'}"


def describe_devices(result: dict) -> str:
    """``"<n> x <kind> (<cpu>, <n> cores, load <x>)"`` from a result holding :func:`local_devices`'s
    and :func:`host`'s fields."""
    return f"{result['devices']} x {result['device_kind']} ({describe(result)})"


__all__ = ["cpu_name", "describe", "describe_devices", "host", "local_devices"]
