"""A local Ray instance the harness starts leaves out the head processes it never uses (harness.runner.ray_start).

Real ``ray.init`` of a one-node instance, three times: lean (no autoscaler monitor, no log
monitor when worker output does not go to the driver), lean with ``log_to_driver`` (the log
monitor stays: it is what carries worker output to the driver), and with
``GOLDEN_LEAN_HEAD=0`` (Ray's own set of processes). An actor still runs on the lean one,
and Ray's ``Node.__init__`` is its own again after each start.
"""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")

from ray._private import node, ray_constants  # noqa: E402

from harness.runner.ray_start import LEAN_HEAD_ENV, lean_head_installed  # noqa: E402

pytestmark = pytest.mark.slow


@ray.remote(num_cpus=0)
class Echo:
    def ping(self, value: int) -> int:
        return value


def _head_processes(log_to_driver: bool) -> tuple[set[str], bool, int]:
    """The head node's process types, whether the lean start was applied, and an actor's answer."""
    original = node.Node.__init__
    with lean_head_installed(log_to_driver) as lean:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=log_to_driver,
                 runtime_env={"env_vars": {"RAY_AUTH_MODE": "disabled"}})
    try:
        assert node.Node.__init__ is original, "Ray's Node.__init__ was not put back"
        kinds = set(ray._private.worker._global_node.all_processes)
        answer = ray.get(Echo.remote().ping.remote(7))
    finally:
        ray.shutdown()
    return kinds, lean, answer


def test_the_lean_head_has_no_monitor_and_no_log_monitor(monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.delenv(LEAN_HEAD_ENV, raising=False)
    kinds, lean, answer = _head_processes(log_to_driver=False)
    assert lean and answer == 7
    assert ray_constants.PROCESS_TYPE_RAYLET in kinds and ray_constants.PROCESS_TYPE_GCS_SERVER in kinds
    assert ray_constants.PROCESS_TYPE_MONITOR not in kinds, kinds
    assert ray_constants.PROCESS_TYPE_LOG_MONITOR not in kinds, kinds


def test_worker_output_to_the_driver_keeps_the_log_monitor(monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.delenv(LEAN_HEAD_ENV, raising=False)
    kinds, lean, _ = _head_processes(log_to_driver=True)
    assert lean
    assert ray_constants.PROCESS_TYPE_MONITOR not in kinds, kinds
    assert ray_constants.PROCESS_TYPE_LOG_MONITOR in kinds, kinds


def test_the_switch_off_starts_rays_own_set(monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setenv(LEAN_HEAD_ENV, "0")
    kinds, lean, _ = _head_processes(log_to_driver=False)
    assert not lean
    assert ray_constants.PROCESS_TYPE_MONITOR in kinds and ray_constants.PROCESS_TYPE_LOG_MONITOR in kinds, kinds
