"""harness.portable.pins and the numerics key under the pins: one key for every pinned x86-64
machine, the machine's own key otherwise."""

from __future__ import annotations

import os

import pytest

from harness.numerics import cpu_numerics
from harness.portable import enter_process, pins

AMD = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC 7763\n"
INTEL = "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 207\nmodel name\t: Intel Xeon\n"
ARM = "processor\t: 0\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU part\t: 0xd0c\n"


def _numerics(tmp_path, text: str, environ: dict[str, str]) -> dict:
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    return cpu_numerics(str(path), environ=environ)


def test_pinned_machines_of_two_vendors_share_one_key(tmp_path):
    environ = {**pins.PINS, pins.MARK_VAR: "1"}  # as apply_to_environ leaves it on an x86-64 machine
    amd, intel = _numerics(tmp_path, AMD, environ), _numerics(tmp_path, INTEL, environ)
    assert amd["key"] == intel["key"] == pins.pin_set_id() and amd["pinned"] and intel["pinned"]
    assert (amd["vendor"], intel["vendor"]) == ("AuthenticAMD", "GenuineIntel")  # still recorded
    # unpinned, each keeps its machine's key, which never equals the pinned one
    assert _numerics(tmp_path, AMD, {})["key"] == "amd-f25m1"
    assert _numerics(tmp_path, INTEL, {})["key"] == "intel-f6m207"


def test_a_lost_pin_or_the_off_switch_gives_the_machine_key(tmp_path):
    environ = {**pins.PINS, pins.MARK_VAR: "1"}
    one_lost = {**environ, "MKL_CBWR": "AUTO"}
    assert _numerics(tmp_path, AMD, one_lost)["key"].startswith("amd-f25m1-env")
    assert not _numerics(tmp_path, AMD, {**environ, pins.OFF_VAR: "0"})["pinned"]
    # an extra code-path variable beyond the pins splits the pinned key
    extra = _numerics(tmp_path, AMD, {**environ, "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"})["key"]
    assert extra.startswith(pins.pin_set_id() + "-env") and extra != pins.pin_set_id()


def test_arm_machines_keep_their_own_key_under_the_variables(tmp_path):
    got = _numerics(tmp_path, ARM, {**pins.PINS})
    assert got["key"].startswith("arm-i41pd0c") and not got["pinned"]
    assert not pins.applies({}, machine="aarch64") and pins.applies({}, machine="x86_64")


def test_apply_sets_every_pin_and_the_mark_and_replaces_other_values():
    environ = {"MKL_CBWR": "AVX512", "ATEN_CPU_CAPABILITY": "avx512"}
    if not pins.applies(environ):
        pytest.skip("pins apply to x86-64 only")  # the aarch64 case is the test above
    pins.apply_to_environ(environ)
    assert pins.in_force(environ) and pins.pinned_by_harness(environ) and not pins.missing(environ)
    assert pins.apply_to_environ({pins.OFF_VAR: "0"}) == {}


def test_vllm_and_cuda_runs_are_not_pinned():
    assert not pins.wanted_for("cuda") and not pins.wanted_for("cpu", "vllm")
    assert pins.wanted_for("cpu", "native") == pins.applies()


def test_a_process_that_lost_a_pin_on_the_way_is_refused(monkeypatch):
    for name, value in pins.PINS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(pins.MARK_VAR, "1")
    monkeypatch.setenv("MKL_CBWR", "AUTO")
    with pytest.raises(RuntimeError, match="MKL_CBWR='AUTO'"):
        enter_process("cpu")
    assert enter_process("cuda") is False  # other devices are left alone
    monkeypatch.delenv(pins.MARK_VAR)
    assert enter_process("cpu") is False  # an unpinned run's process is left alone


def test_the_environment_of_this_session_is_pinned():
    """The pytest plugin pins a CPU session (this one) before any test runs."""
    if not pins.applies() or os.environ.get("GOLDEN_PLATFORM", "cpu").split("@")[0] not in ("cpu", "cpu-cluster"):
        pytest.skip("not a pinned CPU session")
    assert pins.in_force() and pins.pinned_by_harness()
