"""``--ray-address`` / ``--golden-ray-address`` reach the run, and an address nothing listens
on is refused in seconds (exit 2 for the command, a failing test naming it for the plugin),
not after Ray's minutes-long wait for a GCS. No cluster needed: the address is a closed port."""

from __future__ import annotations

import shutil
import socket

import pytest

from harness.runner.capacity import ClusterRefused
from harness.runner.cluster import probe
from suites.inner_golden import INNER_GOLDEN_TEST, REPO, SMOKE

pytest_plugins = ["pytester"]
TEST_FILE = INNER_GOLDEN_TEST


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"127.0.0.1:{port}"


def test_probe_refuses_an_address_nothing_listens_on() -> None:
    address = _closed_port()
    with pytest.raises(ClusterRefused, match=rf"platform.ray_address: cannot join the Ray cluster at {address}: "
                                             r"nothing accepts connections there \(ConnectionRefusedError"):
        probe(address)
    with socket.socket() as s:  # a listening port passes
        s.bind(("127.0.0.1", 0))
        s.listen()
        probe(f"127.0.0.1:{s.getsockname()[1]}")
    probe("auto")  # not HOST:PORT: left to Ray


def test_cli_ray_address_is_refused_before_the_run(tmp_path, capsys) -> None:
    from harness.cli import main

    address = _closed_port()
    assert main(["run", SMOKE, "--ray-address", address, "--run-dir", str(tmp_path / "run"), "-q"]) == 2
    assert f"golden run: platform.ray_address: cannot join the Ray cluster at {address}" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_pytest_option_reaches_the_run(pytester: pytest.Pytester, monkeypatch) -> None:
    monkeypatch.delenv("GOLDEN_PLATFORM", raising=False)
    monkeypatch.delenv("GOLDEN_ROOT", raising=False)
    root = pytester.path / "goldens"
    (root / SMOKE).mkdir(parents=True)
    shutil.copy(REPO / "goldens" / SMOKE / "workload.yaml", root / SMOKE / "workload.yaml")
    shutil.copytree(REPO / "goldens" / SMOKE / "cpu", root / SMOKE / "cpu")
    pytester.makepyfile(test_inner=TEST_FILE.format(root=str(root)))
    address = _closed_port()
    result = pytester.runpytest_subprocess("-m", "golden", "-p", "no:cacheprovider", "-p", "no:benchmark",
                                           "--goldens-root", str(root), "--golden-ray-address", address, "-k",
                                           "topology")
    result.assert_outcomes(failed=1)
    expected = f"*could not run: ClusterRefused: platform.ray_address: cannot join the Ray cluster at {address}*"
    result.stdout.fnmatch_lines([expected])
