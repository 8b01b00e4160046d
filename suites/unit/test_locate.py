"""``golden locate``: the op-stream comparison, the op-level hashing hook in-process, and the
refusals of the command (exit 2 naming the input) before anything is replayed.

The replays themselves (two ``golden run`` s of a planted change) are in
``suites/integration/test_locate_e2e.py`` (slow) and benches/locator_plants.py --locate."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from harness.cli import main
from harness.locate.ops import first_op, where
from harness.parity.synthetic import synthetic_surfaces
from harness.store import new_provenance, write_golden
from suites.run_dirs import make_run


def _op(op, ins, outs, line, **kw):
    return {"kind": "op", "phase": kw.pop("phase", "forward"), "target": "m#0", "i": 0, "op": op, "in": ins,
            "out": outs, "args": kw.pop("args", []), "stack": [f"harness/x.py:{line} in f: y"], **kw}


def _v(name: str, dtype: str = "float32", shape: str = "[2]") -> str:
    return f"{dtype}{shape}:{name}"


GOLDEN_STREAM = [
    _op("aten::mm", [_v("x"), _v("w")], [_v("logits")], 10),
    _op("aten::_softmax", [_v("logits")], [_v("probs")], 11),
    _op("aten::topk", [_v("probs")], [_v("wk"), _v("ik", "int64")], 12),
    _op("aten::div.Tensor", [_v("wk"), _v("s")], [_v("wn")], 13),
]


def test_identical_streams_name_no_op():
    assert first_op(GOLDEN_STREAM, list(GOLDEN_STREAM)) is None


def test_the_first_op_with_matching_inputs_and_a_new_output_is_named_and_later_ones_follow():
    run = [GOLDEN_STREAM[0], GOLDEN_STREAM[1],
           _op("aten::topk", [_v("probs")], [_v("wk2"), _v("ik2", "int64")], 12),
           _op("aten::div.Tensor", [_v("wk2"), _v("s")], [_v("wn2")], 13)]
    found = first_op(GOLDEN_STREAM, run)
    assert found is not None and found.op["op"] == "aten::topk"
    assert found.counterpart is GOLDEN_STREAM[2], "the golden's topk on the same inputs"
    assert [t["op"] for t in found.then] == ["aten::div.Tensor"], "downstream of it, not a cause"
    assert where(found.op) == "harness/x.py:12 in f: y"


def test_an_op_on_a_cast_of_matching_values_is_named_not_the_cast():
    run = [GOLDEN_STREAM[0], GOLDEN_STREAM[1],
           _op("aten::_to_copy", [_v("probs")], [_v("probs16", "bfloat16")], 20),
           _op("aten::topk", [_v("probs16", "bfloat16")], [_v("v16", "bfloat16"), _v("ik2", "int64")], 20)]
    found = first_op(GOLDEN_STREAM, run)
    assert found is not None and found.op["op"] == "aten::topk"
    assert [d["op"] for d in found.derived] == ["aten::_to_copy"]


def test_a_new_constant_is_not_the_divergence_the_op_using_it_is():
    run = [GOLDEN_STREAM[0],
           _op("aten::lift_fresh", [_v("inf", shape="[]")], [_v("inf", shape="[]")], 30),
           _op("aten::nextafter", [_v("logits"), _v("inf", shape="[]")], [_v("up")], 31)]
    found = first_op(GOLDEN_STREAM, run)
    assert found is not None and found.op["op"] == "aten::nextafter"


def test_an_op_on_an_already_different_value_is_never_the_cause():
    run = [_op("aten::mm", [_v("x2"), _v("w")], [_v("l2")], 10), _op("aten::_softmax", [_v("l2")], [_v("p2")], 11)]
    found = first_op(GOLDEN_STREAM, run)
    assert found is not None and found.op["op"] == "aten::mm", "x2 comes from outside: mm computes on it"
    assert [t["op"] for t in found.then] == ["aten::_softmax"]


def test_a_backward_op_of_a_builtin_node_is_placed_at_its_forward_op():
    r = _op("aten::mul.Tensor", [_v("g")], [_v("g2")], 5, phase="backward", node="MulBackward0",
            forward_stack=["harness/m.py:7 in fwd: a * b"])
    r["stack"] = ["harness/parallel/pipeline.py:90 in run_pipeline: torch.autograd.backward(outs, grads)"]
    assert where(r).startswith("harness/m.py:7 in fwd: a * b (backward of this forward op")
    r["stack"] = ["harness/m.py:20 in backward: return g * 2"]     # a custom Function's backward
    assert where(r) == "harness/m.py:20 in backward: return g * 2"


# -- the hook, in this process -----------------------------------------------------------------


class _Probe:
    """What the hook reads of the numerics probe: its step, microbatch, call counts, coords."""

    def __init__(self):
        self.level, self.recording, self.step, self._mb, self._calls = 2, True, 1, 0, {}
        self.coords = {"tp": 0, "pp": 0}
        self.entries = {}

    def call(self, name, fn, args):
        n = self._calls.get(name, 0)
        self._calls[name] = n + 1
        return fn(*args)


def _hooked(tmp_path, monkeypatch, phase, targets):
    from harness import taps
    from harness.locate import hook

    plan = {"step": 1, "microbatch": 0, "phase": phase, "coords": {"tp": 0, "pp": 0}, "targets": targets,
            "out": str(tmp_path / "ops.jsonl"), "root": str(Path(__file__).resolve().parents[2])}
    monkeypatch.setenv(hook.PLAN_VAR, json.dumps(plan))
    monkeypatch.setattr(taps, "_probe", _Probe())
    hook.activate()
    return hook, tmp_path / "ops.jsonl"


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_hook_records_the_ops_of_the_target_call_only_with_this_files_lines(tmp_path, monkeypatch):
    import torch

    from harness import taps

    hook, out = _hooked(tmp_path, monkeypatch, "forward", [{"module": "m", "call": 1}])
    try:
        x = torch.arange(4.0)
        taps.call("m", lambda t: t * 2.0, x)            # call 0: not the target
        taps.call("other", lambda t: t - 1.0, x)
        taps.call("m", lambda t: (t + 1.0).exp(), x)     # call 1: the target
    finally:
        hook.deactivate()
    recs = _records(out)
    ops = [r for r in recs if r["kind"] == "op"]
    assert [r["op"] for r in ops] == ["aten::add.Tensor", "aten::exp"]
    assert all(r["stack"][-1].startswith("suites/unit/test_locate.py:") and "exp()" in r["stack"][-1] for r in ops)
    assert not any(s.startswith("<") for r in ops for s in r["stack"]), "frozen modules are not files of the tree"
    assert [r["target"] for r in recs if r["kind"] == "target"] == ["m#1"]
    assert ops[0]["in"][0].startswith("float32[4]:") and ops[0]["args"] == ["1.0"]


def test_the_hook_records_the_backward_of_the_target_call(tmp_path, monkeypatch):
    import torch

    from harness import taps

    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t.view_as(t)

        @staticmethod
        def backward(ctx, g):
            return g * 3.0

    hook, out = _hooked(tmp_path, monkeypatch, "backward", [{"module": "m", "call": 0}])
    try:
        w = torch.ones(3, requires_grad=True)
        y = taps.call("m", lambda t: Scale.apply(t).sin(), w * 2.0)
        (y.sum() * 5.0).backward()
    finally:
        hook.deactivate()
    ops = [r for r in _records(out) if r["kind"] == "op"]
    assert ops and all(r["phase"] == "backward" for r in ops)
    names = [r["op"] for r in ops]
    assert "aten::mul.Tensor" in names and "aten::cos" in names, names
    nodes = {r["node"] for r in ops}
    assert not nodes & {"SumBackward0", "MulBackward0"}, f"the loss's and the input's backward are outside: {nodes}"
    scale = next(r for r in ops if r["stack"] and "return g * 3.0" in r["stack"][-1])
    assert scale["op"] == "aten::mul.Tensor"
    cos = next(r for r in ops if r["op"] == "aten::cos")
    assert any(".sin()" in s for s in cos["forward_stack"]), "a builtin node keeps the stack of its forward op"


# -- the command's refusals ------------------------------------------------------------------------


def _numerics(sha: str = "a" * 64, key: str = "step0001/forward/mb000/model.layers.0.mlp.gate#0") -> dict:
    rank = {"coords": {"tp": 0, "pp": 0, "cp": 0, "ep": 0, "dp": 0}, "backend": "native", "depth": "modules",
            "recorded": True,
            "entries": {key: {"seq": 0, "sha256": sha, "shape": [2, 4], "dtype": "float32", "inputs": []}}}
    return {"surface": "numerics", "version": 1, "workload": "w", "sections": {"policy/rank00000": rank}}


def _setup(tmp_path, *, run_numerics=True, golden_sha="b" * 64, key=None, commit="0" * 40, dirty=False,
           digest=None):
    from harness import code_identity

    docs = synthetic_surfaces("w", seed=5)
    gdocs = dict(docs, numerics=_numerics(golden_sha, **({"key": key} if key else {})))
    rdocs = dict(docs, numerics=_numerics(**({"key": key} if key else {}))) if run_numerics else docs
    run = make_run(tmp_path / "run", rdocs)
    meta = json.loads((run / "run.json").read_text())
    meta.update(code={"digest": digest or code_identity.digest(), "root": "x"}, spec={"name": "w"}, git_commit=None,
                plan_options={"platform": "cpu"})
    (run / "run.json").write_text(json.dumps(meta))
    manifest = json.loads((run / "manifest.json").read_text())
    golden = write_golden(tmp_path / "goldens", "w", "cpu", manifest, gdocs,
                          new_provenance(commit=commit, reason="test", command="pytest", environment={},
                                         repository={"commit": commit, "dirty": dirty, "goldens_root": "goldens"},
                                         spec={"name": "w"}))
    return run, golden


def _refused(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_not_a_run_is_refused_naming_it(tmp_path, capsys):
    err = _refused(capsys, ["locate", str(tmp_path), "w", "--goldens-root", str(tmp_path)])
    assert f"RUN {tmp_path}: not a run directory" in err


def test_a_run_without_a_numerics_surface_is_refused(tmp_path, capsys):
    run, golden = _setup(tmp_path, run_numerics=False)
    assert "the run has no numerics surface" in _refused(capsys, ["locate", str(run), str(golden)])


def test_no_divergence_is_refused(tmp_path, capsys):
    run, golden = _setup(tmp_path, golden_sha="a" * 64)
    assert "equals the golden's: no divergence to locate" in _refused(capsys, ["locate", str(run), str(golden)])


def test_a_run_of_another_harness_is_refused(tmp_path, capsys):
    run, golden = _setup(tmp_path, digest="f" * 64)
    assert "made by another harness than this tree's" in _refused(capsys, ["locate", str(run), str(golden)])


def test_a_golden_commit_the_repository_lacks_is_refused(tmp_path, capsys):
    run, golden = _setup(tmp_path, commit="0123456789" * 4)
    repo = Path(__file__).resolve().parents[2]
    err = _refused(capsys, ["locate", str(run), str(golden), "--repo", str(repo)])
    assert "the golden's commit 0123456789012345678901234567890123456789 is not in the repository" in err


def test_a_golden_from_a_dirty_tree_is_refused(tmp_path, capsys):
    run, golden = _setup(tmp_path, dirty=True)
    assert "captured from a dirty tree" in _refused(capsys, ["locate", str(run), str(golden)])


def test_a_parameter_after_a_step_is_refused_as_a_limit(tmp_path, capsys):
    key = "step0001/param/mb000/model.layers.0.mlp.gate.weight#0"
    run, golden = _setup(tmp_path, key=key)
    assert "the optimizer is not watched" in _refused(capsys, ["locate", str(run), str(golden)])


@pytest.mark.skipif(os.name != "posix", reason="git and a POSIX shell")
def test_locate_is_listed_and_imports_no_torch_for_help():
    import subprocess
    import sys

    code = ("import sys; from harness.cli import build_parser; build_parser(); "
            "print(sorted(m for m in ('torch', 'ray') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[2], env=dict(os.environ, PYTHONPATH=str(
                             Path(__file__).resolve().parents[2])))
    assert out.stdout.strip() == "[]", out.stderr


# -- the command past its checks, with the replays stood in for --------------------------------------


def _head() -> str:
    import subprocess

    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parents[2], check=True,
                          capture_output=True, text=True).stdout.strip()


def _fake_replays(monkeypatch, run_sha: str, golden_sha: str, run_ops: list, golden_ops: list):
    import contextlib

    from harness.locate import replay

    entry = "step0001/forward/mb000/model.layers.0.mlp.gate#0"
    seen = []

    def run_replay(label, tree, spec, platform, plan, base, *, timeout=900.0):
        seen.append((label, plan))
        sha, ops = (run_sha, run_ops) if label == "run" else (golden_sha, golden_ops)
        head = {"kind": "target", "phase": "forward", "target": "model.layers.0.mlp.gate#0", "entry": entry,
                "sha256": sha, "inputs": []}
        return replay.Replay(label, Path(tree), 0, [head, *ops], "")

    @contextlib.contextmanager
    def golden_tree(repo, commit, base):
        yield base

    monkeypatch.setattr(replay, "run_replay", run_replay)
    monkeypatch.setattr(replay, "golden_tree", golden_tree)
    return seen


def test_the_op_is_named_with_its_line_and_exit_1(tmp_path, monkeypatch, capsys):
    run, golden = _setup(tmp_path, commit=_head())
    topk2 = _op("aten::topk", [_v("probs")], [_v("wk2"), _v("ik2", "int64")], 12, args=["2", "-1"])
    seen = _fake_replays(monkeypatch, "a" * 64, "b" * 64, [*GOLDEN_STREAM[:2], topk2], GOLDEN_STREAM)
    assert main(["locate", str(run), str(golden)]) == 1
    out = capsys.readouterr().out
    assert "first diverging op: aten::topk (forward, in m#0, op #0)" in out
    assert "  at harness/x.py:12 in f: y" in out
    assert [label for label, _ in seen] == ["run", "golden"]
    plan = seen[0][1]
    assert plan["targets"] == [{"module": "model.layers.0.mlp.gate", "call": 0}] and plan["step"] == 1
    assert plan["coords"] == {"tp": 0, "pp": 0, "cp": 0, "ep": 0, "dp": 0}


def test_a_replay_that_does_not_reproduce_the_run_is_no_verdict(tmp_path, monkeypatch, capsys):
    run, golden = _setup(tmp_path, commit=_head())
    _fake_replays(monkeypatch, "c" * 64, "b" * 64, GOLDEN_STREAM, GOLDEN_STREAM)
    assert main(["locate", str(run), str(golden), "--format", "json"]) == 3
    doc = json.loads(capsys.readouterr().out)
    assert doc["op"] is None and "the run replay did not reproduce" in doc["reason"]
