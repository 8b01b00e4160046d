"""harness.numerics: the CPU numerics key read from a cpuinfo file and the environment."""

from __future__ import annotations

import re

import pytest

from harness.numerics import MAX_CPUINFO_BYTES, cpu_numerics

AMD = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC 9R14 96-Core Processor
flags\t\t: fpu avx2 avx512f

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
"""
INTEL = AMD.replace("AuthenticAMD", "GenuineIntel").replace(": 25", ": 6").replace(": 17", ": 167")
ARM = "processor\t: 0\nBogoMIPS\t: 243.75\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU part\t: 0xd0c\n"


def _numerics(tmp_path, text: str, **environ: str):
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    return cpu_numerics(str(path), environ=environ)


def test_vendor_family_and_model_make_the_key(tmp_path):
    amd, intel = _numerics(tmp_path, AMD), _numerics(tmp_path, INTEL)
    assert amd["key"] == "amd-f25m17" and amd["model_name"] == "AMD EPYC 9R14 96-Core Processor"
    assert intel["key"] == "intel-f6m167" and (intel["family"], intel["model"]) == (6, 167)
    assert _numerics(tmp_path, ARM)["key"] == "arm-i41pd0c"


def test_a_code_path_override_gets_its_own_key(tmp_path):
    plain = _numerics(tmp_path, INTEL)["key"]
    avx2 = _numerics(tmp_path, INTEL, ATEN_CPU_CAPABILITY="avx2")
    cbwr = _numerics(tmp_path, INTEL, MKL_CBWR="AVX2")
    assert re.fullmatch(r"intel-f6m167-env[0-9a-f]{8}", avx2["key"]) and avx2["overrides"] == {
        "ATEN_CPU_CAPABILITY": "avx2"}
    assert len({plain, avx2["key"], cbwr["key"]}) == 3
    assert _numerics(tmp_path, INTEL, UNRELATED="1")["key"] == plain  # only the listed variables count


@pytest.mark.parametrize("text", ["", "processor\t: 0\nflags\t: fpu\n", "vendor_id\t: GenuineIntel\nmodel\t: x\n"])
def test_no_key_when_the_cpu_cannot_be_named(tmp_path, text):
    assert _numerics(tmp_path, text) is None


def test_an_unreadable_or_huge_cpuinfo_is_read_bounded(tmp_path):
    assert cpu_numerics(str(tmp_path / "absent")) is None
    big = tmp_path / "big"
    big.write_text(INTEL + "x" * (2 * MAX_CPUINFO_BYTES))  # first block intact, the rest never read
    assert cpu_numerics(str(big), environ={})["key"] == "intel-f6m167"


def test_this_machine_has_a_key_that_a_platform_name_can_carry():
    from harness.store.layout import check_name

    numerics = cpu_numerics()
    if numerics is not None:  # the CI box is x86-64 Linux: always keyed
        assert check_name("platform", f"cpu@{numerics['key']}")


def test_cuda_numerics_key_the_architecture_and_libraries_not_the_card():
    """An H100 and an H200 (both sm_90) on one torch build share a key, so one cuda golden;
    another architecture gets another key."""
    from harness.numerics import cuda_numerics

    h100 = cuda_numerics(lambda: "NVIDIA H100 80GB HBM3, 9.0, 580.159.04")
    h200 = cuda_numerics(lambda: "NVIDIA H200, 9.0, 580.159.03")
    b200 = cuda_numerics(lambda: "NVIDIA B200, 10.0, 580.159.04")
    assert h100["key"] == h200["key"] and h100["key"].startswith("sm90-torch")
    assert (h100["device_name"], h200["device_name"]) == ("NVIDIA H100 80GB HBM3", "NVIDIA H200")
    assert b200["key"].startswith("sm100-") and b200["key"] != h100["key"]
    assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", h100["key"])
    assert cuda_numerics(lambda: None) is None and cuda_numerics(lambda: "garbage") is None
