"""The warm runtime's pooled data-plane process (``WarmRuntime.acquire_dataplane``).

A real ``DataPlaneActor`` in the runtime's Ray: it serves one run's staging file
after another, each opened new; while none is open every call is refused (naming
the method), a second ``open`` while one is open is refused, and a row staged in
one run's file is not in the next one's. A released actor is handed out again
(same actor, same name: the capture sinks find it by that name).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def test_a_pooled_data_plane_serves_each_run_a_new_file(tmp_path):
    ray = pytest.importorskip("ray")
    from harness.dataplane.actor import DataPlaneClient
    from harness.runner.warm import WarmRuntime

    runtime = WarmRuntime()
    try:
        runtime.ensure_ray()
        handle, name = runtime.acquire_dataplane()
        first = str(tmp_path / "a" / "dataplane.sqlite")
        (tmp_path / "a").mkdir()
        assert ray.get(handle.open.remote(first)) == first
        client = DataPlaneClient(name)  # found by its name, as a capture sink finds it
        client.stage("step1/row0", {"tokens": [1, 2, 3]})
        assert client.has("step1/row0")
        client.close()
        with pytest.raises(Exception, match="still serves"):
            ray.get(handle.open.remote(str(tmp_path / "other.sqlite")))
        ray.get(handle.close.remote())
        with pytest.raises(Exception, match="fetch while no staging file is open"):
            ray.get(handle.fetch.remote("step1/row0"))
        runtime.release_dataplane(handle, name)

        again, again_name = runtime.acquire_dataplane()
        assert again_name == name and again._ray_actor_id == handle._ray_actor_id
        assert runtime.stats()["dataplanes_started"] == 1 and runtime.stats()["dataplanes_reused"] == 1
        second = str(tmp_path / "b" / "dataplane.sqlite")
        (tmp_path / "b").mkdir()
        assert ray.get(again.open.remote(second)) == second
        assert not ray.get(again.has.remote("step1/row0"))  # the previous run's rows stayed in its file
        assert ray.get(again.keys.remote()) == []
        ray.get(again.close.remote())
        runtime.release_dataplane(again, again_name)
    finally:
        runtime.close()
