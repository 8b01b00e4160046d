"""One real worker environment, built and used: ``golden env build`` + a policy worker started in it.

The environment is an overlay (``build(..., overlay=True)``: ``python -m venv
--without-pip`` plus a ``.pth`` onto this interpreter's site-packages), so it
installs nothing and builds in seconds, yet it is a separate interpreter: its
own ``sys.executable`` and ``sys.prefix``. A policy rank (a real Ray actor,
``runtime_env={"py_executable": ...}``) is started in it through
``GOLDEN_WORKER_ENV`` and must report that interpreter and train one step;
``golden doctor --envs`` passes it (smoke step included), then fails it once broken.
The full venv builds (pip; megatron, dtensor, vllm) take minutes and are
measured by hand, not here (docs/worker-envs.md).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from harness.workerenv import build, select, stamp

pytestmark = pytest.mark.slow


def test_overlay_env_builds_reuses_runs_a_policy_worker_and_passes_doctor(tmp_path, monkeypatch, capsys):
    cache = tmp_path / "cache"
    first = build.build("native", cache, overlay=True)
    assert first.action == "built" and first.reason == "not built"
    again = build.build("native", cache, overlay=True)
    assert again.action == "reused", again  # a no-op that verified the stamp and the package list
    python = stamp.python_of(cache / "native")
    code = "import sys, json, harness, torch; print(json.dumps([sys.executable, sys.prefix]))"
    out = subprocess.run([str(python), "-c", code],
                         capture_output=True, text=True, check=True, timeout=120)
    exe, prefix = json.loads(out.stdout)
    assert exe == str(python) and prefix == str(cache / "native") != sys.prefix

    from harness.policy.group import PolicyGroup
    from harness.policy.synthetic import synthetic_batch
    from harness.spec import load_spec

    spec = load_spec("qwen3_moe_tiny_smoke", ["model.layers=2", "policy.seq_len=32", "plugins.policy_profiler=null"])
    monkeypatch.setenv(select.SELECT_ENV, str(cache))
    from harness.spec.topology import plan

    group = PolicyGroup(spec, plan(spec), str(tmp_path / "run"))  # a group gets the run's plan
    try:
        assert [r["python"] for r in group.ready_info] == [str(python)]  # the worker ran the env's Python
        metrics = group.train(synthetic_batch(spec, 4, seed=0))
        assert math.isfinite(metrics["loss"]) and math.isfinite(metrics["grad_norm"])
    finally:
        group.shutdown()

    # golden doctor in the built environment: imports, both built-in plugins, the smoke step
    from harness.cli import main

    capsys.readouterr()
    assert main(["doctor", "--envs", "--cache-dir", str(cache)]) == 0
    out = capsys.readouterr().out
    for line in ("[native]", "backend imports harness, torch, ray, zmq: ok",
                 "policy plugin harness.profiler.trace.TracePolicyProfiler: imports: ok",
                 "rollout plugin harness.profiler.trace.TraceRolloutProfiler: imports: ok",
                 "smoke: one train step on 1 rank ok", "not built (golden env build megatron)"):
        assert line in out, out
    (cache / "native" / "lib").rename(cache / "native" / "lib.moved")  # the overlay's .pth is gone
    assert main(["doctor", "--envs", "--cache-dir", str(cache), "--no-smoke"]) == 1
    out = capsys.readouterr().out
    assert "worker environment 'native'" in out and "is broken" in out and "golden env build native" in out
