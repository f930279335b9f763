"""The host description every benchmark reports (`mocap_jax.bench.machine`)."""

import jax

from mocap_jax.bench.machine import cpu_name, describe, describe_devices, host, local_devices

TWO_PROCESSORS = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC
flags\t\t: fpu vme

processor\t: 1
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel Xeon
"""


def test_cpu_name_is_the_first_processors_model_with_its_family_and_model(tmp_path):
    f = tmp_path / "cpuinfo"
    f.write_text(TWO_PROCESSORS)
    assert cpu_name(str(f)) == "AMD EPYC (family 25, model 1)"


def test_cpu_name_without_family_numbers_is_the_model_name(tmp_path):
    f = tmp_path / "cpuinfo"
    f.write_text("\nprocessor : 0\nmodel name : Apple M2\n")       # a leading blank line is not the block's end
    assert cpu_name(str(f)) == "Apple M2"


def test_cpu_name_without_cpuinfo_falls_back_to_the_platform(tmp_path):
    name = cpu_name(str(tmp_path / "missing"))
    assert isinstance(name, str) and name and "family" not in name


def test_host_names_the_cpu_its_cores_and_load():
    h = host()
    assert set(h) == {"cpu", "cpus", "load_average"}
    assert h["cpus"] >= 1 and (h["load_average"] is None or h["load_average"] >= 0)
    assert describe({**h, "load_average": 1.234}) == f"{h['cpu']}, {h['cpus']} cores, load 1.2"
    assert describe({**h, "load_average": None}).endswith("load -")


def test_local_devices_count_the_fake_devices():
    assert local_devices() == {"devices": len(jax.local_devices()), "device_kind": jax.local_devices()[0].device_kind}
    assert local_devices()["devices"] == 8                       # conftest: eight fake CPU devices
    h = {**host(), "load_average": 0.5, **local_devices()}
    assert describe_devices(h) == f"8 x {h['device_kind']} ({h['cpu']}, {h['cpus']} cores, load 0.5)"
