"""The teacher policy group of a distillation workload: logits of the student's batches into IPC buffers.

Its ranks are placed from the plan like the student's (``placement``: the bundles of
the teacher's planned slots; ``placement.json`` lists them as role ``teacher``).

The teacher is a second Qwen3-MoE (``harness.spec.distill.teacher_spec``: its
own seed, model fields and layout, native backend, ``pp = cp = 1``) in a gloo
world of its own: :class:`TeacherGroup` is a ``PolicyGroup`` whose actors are
:class:`TeacherWorkerImpl` ranks, built from the teacher's spec and its
``teacher`` role layout, with ``HARNESS_TRACE_ROLE=teacher`` in their
environment (the policy profiler plugin is loaded in every teacher rank too;
the built-in trace profiler then writes ``artifacts/teacher/rank*.trace.jsonl``).

Per step, :meth:`TeacherGroup.logits_refs` hands every teacher rank its
contiguous DP shard of the batch. A rank runs the forward in microbatches of
``distill.teacher.micro_batch_size`` inside one profiler step (phase
``teacher/step{N}``), writes its vocab shard ``[N_mb, B_mb, T, V/tp]`` of the
logits into its buffer (``teacher_ipc.ensure_teacher_ipc_buffer``: allocated
once, grown only when a dimension, dtype or device changes) and returns its
per-sample handles. The driver aggregates them in sorted dp-rank order
(``teacher_ipc.aggregate_teacher_handles``): one ``{"teacher_shards": [ref of
tp rank 0, ref of tp rank 1, ...]}`` per global sample, whatever the teacher's
DP degree. The student's ranks open those buffers themselves
(``harness.distill.student``). A buffer is overwritten by the next step, so
the refs of a step are valid until the next ``logits_refs`` call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import ray
import torch
import torch.nn.functional as F

from harness import ops
from harness.distill.teacher_ipc import (
    aggregate_teacher_handles,
    ensure_teacher_ipc_buffer,
    per_sample_handles,
    teacher_view,
)
from harness.parallel import tensor
from harness.policy.group import PolicyGroup
from harness.policy.worker import PolicyWorkerImpl
from harness.spec.distill import TEACHER_ROLE
from harness.spec.typed import Workload

ROLE_ENV = "HARNESS_TRACE_ROLE"


@torch.no_grad()
def local_vocab_logits(model: Any, input_ids: torch.Tensor) -> torch.Tensor:
    """``[b, S, V/tp]``: this TP rank's vocab shard of the logits of ``input_ids [b, S]``.

    The forward of ``ParallelQwen3Moe`` up to the LM head (one stage, ``cp == 1``, so the
    positions are ``0 .. S-1`` in order); entry ``t`` scores the token at ``t + 1``.
    """
    if not (model.is_first and model.is_last and model.cp == 1):
        raise ValueError("teacher logits need a single-stage model without context parallelism (pp = cp = 1)")
    cfg, g, pos = model.cfg, model.groups, model.positions
    hidden = tensor.vocab_parallel_embedding(input_ids[:, pos], model.p("model.embed_tokens.weight"),
                                             model.vocab_start, g["tp"])
    cos, sin = ops.rope_cos_sin(pos, cfg.head_dim, cfg.rope_theta, hidden.dtype)
    for i in model.layer_ids:
        hidden = model._layer(i, hidden, cos, sin)
    h = tensor.sp_gather(ops.rms_norm(hidden, model.p("model.norm.weight"), cfg.rms_eps), g["tp"])
    return F.linear(h, model.p("lm_head.weight"))


def logits_job(engine: Any, input_ids: torch.Tensor) -> torch.Tensor:
    """This rank's :func:`local_vocab_logits` for ``input_ids``, on the CPU (tests run it in each rank)."""
    engine.model.eval()
    return local_vocab_logits(engine.model, input_ids.to(engine.device)).cpu()


class TeacherWorkerImpl(PolicyWorkerImpl):
    """One teacher rank: a policy rank of the teacher's spec that serves logits by IPC."""

    records_numerics = False  # the numerics surface is the student's (docs/locator.md)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._buffer: torch.Tensor | None = None
        self._handle = None
        self.reallocations = 0

    def teacher_logits(self, shard: Mapping[str, torch.Tensor]) -> dict[str, Any]:
        """Logits of this rank's DP shard into the IPC buffer: ``{"dp_rank", "per_sample_handles"}``.

        One profiler step (``begin_train_step`` / ``finish_train_step``, abort reason
        ``policy_train_error`` on failure) around the whole pass.
        """
        engine = self.engine
        ids = shard["input_ids"]
        b, seq = int(ids.shape[0]), int(ids.shape[1])
        mbs = engine.mbs
        if b == 0 or b % mbs:
            raise ValueError(f"teacher rank {self.rank}: {b} samples are not a positive multiple of "
                             f"distill.teacher.micro_batch_size={mbs}")
        n_mb = b // mbs
        vocab_local = engine.cfg.vocab // engine.model.tp
        with self.hooks.train_step():
            engine.model.eval()
            before = self._handle
            self._buffer, self._handle = ensure_teacher_ipc_buffer(
                self._buffer, self._handle, n_mb, mbs, seq, vocab_local, torch.float32, engine.device)
            self.reallocations += self._handle is not before
            view = teacher_view(self._buffer, n_mb, mbs, seq, vocab_local)
            for m in range(n_mb):
                mb = ids[m * mbs:(m + 1) * mbs].to(engine.device)
                view[m].copy_(local_vocab_logits(engine.model, mb).to(torch.float32))
            if self._buffer.is_cuda:  # another process reads the buffer next: the writes must be done
                torch.cuda.synchronize(self._buffer.device)
        return {"dp_rank": int(engine.coords["dp"]),
                "per_sample_handles": per_sample_handles(self._handle, n_mb, mbs, seq, vocab_local)}

    def buffer_reallocations(self) -> int:
        """How many times this rank allocated (and exported) a new IPC buffer."""
        return int(self.reallocations)


TeacherWorker = ray.remote(num_cpus=0)(TeacherWorkerImpl)


class TeacherTopology:
    """What a policy rank reads of a topology (``.policy``, ``.groups``), for the teacher's layout."""

    def __init__(self, layout: Any) -> None:
        self.policy = layout
        self.groups = {"policy": layout.groups}


class TeacherGroup(PolicyGroup):
    """The teacher's ranks (fresh actors, never a warm pool), fanned out like a policy group."""

    worker_actor = TeacherWorker
    role = TEACHER_ROLE

    def __init__(self, spec: Workload, topology: Any, run_dir: str, *,
                 env_vars: Mapping[str, str] | None = None, placement: Any = None) -> None:
        """``spec``: the teacher's typed workload (``RunPlan.teacher``: derived once, in the plan);
        ``topology``: the run's (``topology.teacher`` lays its ranks out). ``placement``: the
        run's ``harness.runner.placement.Placement``; each teacher rank is pinned to the bundle
        of its planned slot (``topology.teacher``), like a policy rank."""
        if getattr(topology, "teacher", None) is None:
            raise ValueError("topology has no teacher layout (is the distill: block missing?)")
        env = {**(env_vars or {}), ROLE_ENV: TEACHER_ROLE}
        super().__init__(spec, TeacherTopology(topology.teacher), run_dir, env_vars=env,
                         placement=placement)

    def logits_refs(self, batch: Mapping[str, torch.Tensor]) -> list[dict[str, list]]:
        """Per global sample, the refs of its logits on every TP rank of its teacher DP rank."""
        results = self._sharded("teacher_logits", {"input_ids": batch["input_ids"]})
        return aggregate_teacher_handles(results)

    def buffer_reallocations(self) -> list[int]:
        return self._all("buffer_reallocations")
