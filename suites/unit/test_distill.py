"""On-policy distillation: the KL math, the student's loss over real IPC buffers, the spec and the layout.

The loss tests build the teacher's buffers with ``harness.distill.teacher_ipc`` (real
shared memory, opened through ``/proc/<pid>/fd`` as a student rank opens them; here the
same process plays both sides: the cross-process path runs in the distillation golden).
"""

from __future__ import annotations

import math

import pytest
import torch

from harness.algos.distill import distill_kl_term, token_logprobs_from_logits
from harness.algos.kl import calculate_kl
from harness.algos.loss import ClippedPGLoss
from harness.distill.student import DistillLoss, TeacherReader
from harness.distill.teacher_ipc import ensure_teacher_ipc_buffer, per_sample_handles, teacher_view
from harness.spec import load_spec, plan
from harness.spec.errors import SpecError
from harness.spec.schema import section_defaults

LOSS_CFG = {**section_defaults("grpo.loss")}
DISTILL_CFG = {"kl_coef": 0.25, "kl_type": "k3", "kl_direction": "reverse", "temperature": 1.0}
WORKLOAD = "qwen3_moe_tiny_distill"
B, S, V = 4, 6, 16


def _batch(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (B, S), generator=gen)
    token_mask = torch.zeros(B, S)
    token_mask[:, 2:] = 1.0
    token_mask[1, -1] = 0.0
    data = {
        "input_ids": ids,
        "advantages": torch.randn(B, S, generator=gen),
        "prev_logprobs": -torch.rand(B, S, generator=gen) * 3,
        "generation_logprobs": -torch.rand(B, S, generator=gen) * 3,
        "reference_policy_logprobs": -torch.rand(B, S, generator=gen) * 3,
        "token_mask": token_mask,
        "sample_mask": torch.tensor([1.0, 1.0, 0.0, 1.0]),
    }
    logits = torch.randn(B, S, V, generator=gen)
    return data, logits


def _teacher_refs(logits: torch.Tensor, tp: int, mbs: int = 2):
    """Write ``logits [B, S, V]`` as ``tp`` vocab shards into IPC buffers, as teacher ranks do."""
    n_mb, vt = logits.shape[0] // mbs, logits.shape[-1] // tp
    buffers, shards = [], []
    for r in range(tp):
        buf, handle = ensure_teacher_ipc_buffer(None, None, n_mb, mbs, logits.shape[1], vt, torch.float32, "cpu")
        teacher_view(buf, n_mb, mbs, logits.shape[1], vt).copy_(
            logits[..., r * vt:(r + 1) * vt].reshape(n_mb, mbs, logits.shape[1], vt))
        buffers.append(buf)
        shards.append(per_sample_handles(handle, n_mb, mbs, logits.shape[1], vt))
    refs = [{"teacher_shards": [shards[r][i] for r in range(tp)]} for i in range(logits.shape[0])]
    return buffers, refs


def _global_toks(data) -> float:
    return float((data["token_mask"][:, 1:] * data["sample_mask"][:, None]).sum())


# -- math ---------------------------------------------------------------------------------

def test_token_logprobs_from_logits_follow_the_alignment():
    data, logits = _batch()
    lp = token_logprobs_from_logits(logits, data["input_ids"], temperature=2.0)
    assert lp.shape == (B, S) and torch.all(lp[:, 0] == 0)
    b, t = 2, 3
    want = torch.log_softmax(logits[b, t - 1] / 2.0, dim=-1)[data["input_ids"][b, t]]
    assert torch.equal(lp[b, t], want)


@pytest.mark.parametrize("kl_type", ["k1", "k2", "k3"])
def test_teacher_equal_to_student_gives_zero_kl_and_zero_gradient(kl_type):
    data, logits = _batch()
    student = token_logprobs_from_logits(logits, data["input_ids"]).requires_grad_(True)
    term = distill_kl_term(student, student.detach().clone(), data["token_mask"], data["sample_mask"],
                           _global_toks(data), kl_type=kl_type)
    assert float(term.detach()) == 0.0
    term.backward()
    if kl_type != "k1":  # k2 and k3 are flat at s == t; k1's per-sample gradient is not (only its mean is 0)
        assert torch.all(student.grad == 0)


def test_the_term_is_the_masked_token_mean_of_the_estimator():
    data, logits = _batch()
    student = token_logprobs_from_logits(logits, data["input_ids"])
    teacher = student - 0.3 * torch.rand(B, S, generator=torch.Generator().manual_seed(5))
    toks = _global_toks(data)
    mask = data["token_mask"][:, 1:] * data["sample_mask"][:, None]
    for kl_type in ("k1", "k3"):
        got = distill_kl_term(student, teacher, data["token_mask"], data["sample_mask"], toks, kl_type=kl_type)
        per_token = calculate_kl(student[:, 1:], teacher[:, 1:], kl_type=kl_type)
        assert math.isclose(float(got), float((per_token * mask).sum() / toks), rel_tol=1e-6)
    # k1 by hand: log pi_s - log pi_t on the generated tokens of unmasked samples
    k1 = distill_kl_term(student, teacher, data["token_mask"], data["sample_mask"], toks, kl_type="k1")
    assert math.isclose(float(k1), float(((student - teacher)[:, 1:] * mask).sum() / toks), rel_tol=1e-6)
    assert float(k1) > 0


def test_the_term_refuses_bad_inputs():
    data, logits = _batch()
    student = token_logprobs_from_logits(logits, data["input_ids"])
    with pytest.raises(ValueError, match="distill.kl_type"):
        distill_kl_term(student, student, data["token_mask"], data["sample_mask"], 1.0, kl_type="k9")
    with pytest.raises(ValueError, match="teacher_logprobs has shape"):
        distill_kl_term(student, student[:, :-1], data["token_mask"], data["sample_mask"], 1.0)


# -- the student's loss over IPC buffers --------------------------------------------------

@pytest.mark.parametrize("tp", [1, 2])
def test_teacher_equal_to_student_leaves_the_grpo_loss_unchanged(tp):
    data, logits = _batch()
    _buffers, refs = _teacher_refs(logits, tp)
    assert TeacherReader().logits(refs).equal(logits)  # vocab shards concatenated in TP order
    curr = token_logprobs_from_logits(logits, data["input_ids"])
    toks = _global_toks(data)
    seqs = float(data["sample_mask"].sum())
    loss_fn = DistillLoss(LOSS_CFG, DISTILL_CFG)
    loss, metrics = loss_fn(curr, {**data, "teacher_refs": refs}, seqs, toks)
    pg_loss, _ = ClippedPGLoss(LOSS_CFG)(curr, data, seqs, toks)
    assert metrics["distill_kl"] == 0.0
    assert float(loss) == float(pg_loss)


def test_a_planted_teacher_logit_moves_the_loss_by_exactly_the_kl_term():
    data, logits = _batch()
    buffers, refs = _teacher_refs(logits, tp=2)
    curr = token_logprobs_from_logits(logits, data["input_ids"])
    toks, seqs = _global_toks(data), float(data["sample_mask"].sum())
    loss_fn = DistillLoss(LOSS_CFG, DISTILL_CFG)
    before, _ = loss_fn(curr, {**data, "teacher_refs": refs}, seqs, toks)
    buffers[1][..., 0] += 0.5  # TP rank 1's shard, in place: the same handles, new values
    after, metrics = loss_fn(curr, {**data, "teacher_refs": refs}, seqs, toks)
    planted = logits.clone()
    planted[..., V // 2] += 0.5
    teacher = token_logprobs_from_logits(planted, data["input_ids"])
    term = distill_kl_term(curr, teacher, data["token_mask"], data["sample_mask"], toks, kl_type="k3")
    pg_loss, _ = ClippedPGLoss(LOSS_CFG)(curr, data, seqs, toks)
    assert metrics["distill_kl"] == float(term) and float(term) > 0
    assert torch.equal(before, pg_loss)  # the teacher was the student: KL 0
    assert torch.equal(after, pg_loss + DISTILL_CFG["kl_coef"] * term)  # exactly GRPO + coef * KL


def test_the_kl_term_pulls_the_student_towards_the_teacher():
    data, logits = _batch()
    teacher_logits = logits + torch.randn(B, S, V, generator=torch.Generator().manual_seed(9))
    _buffers, refs = _teacher_refs(teacher_logits, tp=1)  # the owner keeps its buffers (and their fds)
    student_logits = logits.clone().requires_grad_(True)
    cfg = dict(DISTILL_CFG, kl_coef=1.0)
    loss_fn = DistillLoss(dict(LOSS_CFG, kl_beta=0.0), cfg)
    zero_adv = {**data, "advantages": torch.zeros(B, S), "teacher_refs": refs}
    toks, seqs = _global_toks(data), float(data["sample_mask"].sum())
    kls = []
    for _ in range(20):
        curr = token_logprobs_from_logits(student_logits, data["input_ids"])
        loss, metrics = loss_fn(curr, {**zero_adv, "prev_logprobs": curr.detach()}, seqs, toks)
        kls.append(metrics["distill_kl"])
        student_logits.grad = None
        loss.backward()
        with torch.no_grad():
            student_logits -= 2.0 * student_logits.grad
    assert kls[-1] < 0.5 * kls[0]


def test_the_loss_names_missing_teacher_refs_and_needs_token_level_loss():
    data, logits = _batch()
    curr = token_logprobs_from_logits(logits, data["input_ids"])
    with pytest.raises(ValueError, match="teacher_refs"):
        DistillLoss(LOSS_CFG, DISTILL_CFG)(curr, data, 3.0, 10.0)
    with pytest.raises(ValueError, match="token_level_loss"):
        DistillLoss(dict(LOSS_CFG, token_level_loss=False), DISTILL_CFG)


def test_the_reader_drops_buffers_a_grown_buffer_replaced():
    _data, logits = _batch()
    _old, refs = _teacher_refs(logits, tp=1)
    reader = TeacherReader()
    reader.logits(refs)
    _new, refs2 = _teacher_refs(logits * 2, tp=1)
    assert reader.logits(refs2).equal(logits * 2)
    assert set(reader._opened) == {s.handle for r in refs2 for s in r["teacher_shards"]}


# -- spec and layout ----------------------------------------------------------------------

@pytest.mark.parametrize(("override", "field"), [
    ("distill.teacher.tp=3", "distill.teacher.tp"),
    ("distill.teacher.ep=3", "distill.teacher.ep"),
    ("distill.teacher.micro_batch_size=3", "distill.teacher.micro_batch_size"),
    ("distill.teacher.model.vocab=128", "distill.teacher.model.vocab"),
    ("distill.teacher.model.heads=5", "distill.teacher.model.kv_heads"),
    ("distill.teacher.seed=-1", "distill.teacher.seed"),
    ("distill.teacher.dpp=2", "distill.teacher.dpp"),
    ("distill.kl_coef=-0.1", "distill.kl_coef"),
    ("distill.kl_type=k4", "distill.kl_type"),
    ("distill.kl_direction=forward", "distill.kl_direction"),
    ("distill.temperature=0", "distill.temperature"),
    ("grpo.trainer=sync", "grpo.trainer"),
    ("distill=null", "distill"),
    ("grpo.loss.token_level_loss=false", "grpo.loss.token_level_loss"),
    ("policy.backend=dtensor", "policy.backend"),
    ("platform.gpus_per_node=3", "platform.nodes"),
    ("plugins.env.HARNESS_TRACE_ROLE=teacher", "plugins.env"),  # reserved: the runner sets it for teacher ranks
])
def test_a_bad_distill_block_is_refused_naming_the_field(override, field):
    with pytest.raises(SpecError) as info:
        load_spec(WORKLOAD, [override])
    assert info.value.field == field, str(info.value)
    assert "workload.yaml" in str(info.value)


def test_the_teacher_has_ranks_of_its_own_after_the_students():
    spec = load_spec(WORKLOAD)
    topo = plan(spec).to_dict()
    teacher, policy = topo["teacher"], topo["policy"]
    assert teacher["role"] == "teacher" and teacher["world"] == 2 and teacher["sizes"]["tp"] == 2
    assert policy["sizes"]["dp"] == 2 and policy["sizes"]["tp"] == 1
    assert [r["device"] for r in teacher["ranks"]] == [2, 3]  # the slots after the student's
    assert teacher["groups"]["tp"] == [[0, 1]]
    assert topo["devices_used"] == 4
    assert "teacher" not in plan(load_spec("qwen3_moe_tiny_smoke")).to_dict()  # other workloads unchanged


def test_the_trace_profiler_writes_teacher_ranks_under_their_own_role(tmp_path, monkeypatch):
    from harness.artifacts.trace import read_trace
    from harness.profiler.trace import TracePolicyProfiler

    monkeypatch.setenv("HARNESS_TRACE_DIR", str(tmp_path))
    monkeypatch.setenv("HARNESS_TRACE_OPERATORS", "off")
    monkeypatch.setenv("HARNESS_TRACE_ROLE", "teacher")
    prof = TracePolicyProfiler(rank=1)
    prof.begin_train_step()
    prof.finish_train_step()
    prof.close()
    trace = read_trace(tmp_path / "artifacts" / "teacher" / "rank00001.trace.jsonl")
    assert [r["phase"] for r in trace.of_type("phase")] == ["teacher/step1"]
    monkeypatch.setenv("HARNESS_TRACE_ROLE", "critic")
    with pytest.raises(RuntimeError, match="HARNESS_TRACE_ROLE"):
        TracePolicyProfiler(rank=0)


def test_golden_plan_shows_the_teacher_and_refuses_a_bad_block_with_exit_2():
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]

    def golden(*args):
        return subprocess.run([sys.executable, "-m", "harness", *args], cwd=repo, capture_output=True, text=True,
                              timeout=60)

    ok = golden("plan", WORKLOAD)
    assert ok.returncode == 0, ok.stderr
    assert "teacher   world 2 = tp2 x dp1" in ok.stdout and "teacher ranks" in ok.stdout
    bad = golden("plan", WORKLOAD, "distill.teacher.tp=3")
    assert bad.returncode == 2 and "distill.teacher.tp" in bad.stderr and "Traceback" not in bad.stderr


def test_the_reader_keeps_one_mapping_per_teacher_process():
    import dataclasses

    _data, logits = _batch()
    _bufs, refs = _teacher_refs(logits, tp=2)

    def as_owner(rs, owner):
        return [{"teacher_shards": [dataclasses.replace(s, handle=dataclasses.replace(s.handle, owner=owner))
                                    for s in r["teacher_shards"]]} for r in rs]

    reader = TeacherReader()
    reader.logits(as_owner(refs[:2], 101))  # microbatch 1: teacher dp rank 0's process
    reader.logits(as_owner(refs[2:], 202))  # microbatch 2: another teacher process
    assert sorted(h.owner for h in reader._opened) == [101, 101, 202, 202]  # both kept: no remapping per microbatch
    _new, grown = _teacher_refs(logits * 3, tp=1)
    assert reader.logits(as_owner(grown, 101)).equal(logits * 3)
    assert sorted(h.owner for h in reader._opened) == [101, 202, 202]  # 101's old buffers dropped


def test_the_loaded_spec_has_a_typed_distill_block():
    spec = load_spec(WORKLOAD)
    assert spec.distill.teacher.tp == 2 and spec.distill.teacher.seed == 4321 and spec.distill.kl_coef == 0.1
    assert dict(spec.distill.teacher.model) == {"layers": 2, "moe_intermediate": 64}
    assert load_spec("qwen3_moe_tiny_smoke").distill is None
    loss = DistillLoss(spec.grpo.loss, spec.distill)  # typed blocks, as the policy ranks pass them
    assert (loss.kl_coef, loss.kl_type, loss.temperature) == (0.1, "k3", 1.0)
