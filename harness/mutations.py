"""Planted regressions: prove that a gate catches what it claims to catch.

Each function here is a *worker setup hook*: run a workload with
``GOLDEN_WORKER_SETUP_HOOK=harness.mutations.<name>`` and every Ray worker
process applies the mutation at start-up (the runner passes the variable to
Ray as ``worker_process_setup_hook``). ``golden check`` must then fail on the
surface named in the docstring. The gate's own self-test
(``suites/golden/test_mutations.py``) runs them; users can run them against a
new platform's goldens the same way.

Mutations are numerically neutral where possible (they add work whose result
is discarded) so the finding lands on the intended surface and not only on
``training``.

``WARM_SAFE`` names the mutations that may also run in a warm process
(``harness.runner.warm``: the hook runs in a process whose actor already
exists). They patch only module functions and plain classes the workload
looks up at call time, each through ``_patch``, which records the attribute it
replaces, so :func:`undo` puts every one back (the warm pool calls it after
the run, then reuses the process). A patch of an actor class's method
(``PolicyWorkerImpl``, ``RolloutWorker``) would not take there: Ray wraps every
method of an actor class when it loads it, so the actor keeps the methods it
had then; such a mutation runs in a private, cold Ray instance, where the hook
runs first.
"""

from __future__ import annotations

WARM_SAFE = frozenset({"extra_tp_collective", "extra_operator", "dp_debug_barrier",
                       "extra_all_gather_on_tp_rank1", "rollout_token_changed_in_step2",
                       "teacher_logits_planted_wrong"})

_MISSING = object()
_applied: list[tuple[object, str, object]] = []  # (owner, name, the raw attribute replaced), oldest first


def _patch(owner: object, name: str, value: object) -> None:
    """Set ``owner.name`` (a module or a class) and record what was there, for :func:`undo`."""
    _applied.append((owner, name, vars(owner).get(name, _MISSING)))
    setattr(owner, name, value)


def undo() -> int:
    """Put back every attribute the mutations replaced in this process, newest first, and check
    each is the original object again; returns how many. Raises RuntimeError when one is not
    (the caller must then discard the process)."""
    undone = 0
    while _applied:
        owner, name, old = _applied.pop()
        if old is _MISSING:
            delattr(owner, name)
        else:
            setattr(owner, name, old)
        if vars(owner).get(name, _MISSING) is not old:
            raise RuntimeError(f"mutation undo: {getattr(owner, '__name__', owner)}.{name} is not the original")
        undone += 1
    return undone


def extra_tp_collective() -> None:
    """collectives: one extra all-reduce over the TP group after every row-parallel block."""
    import torch
    import torch.distributed as dist

    import harness.parallel.tensor as tensor

    original = tensor.row_parallel_sp

    def row_parallel_sp(x, weight_shard, tp_group):
        out = original(x, weight_shard, tp_group)
        probe = torch.zeros(1, dtype=out.dtype)
        dist.all_reduce(probe, group=tp_group)
        return out

    _patch(tensor, "row_parallel_sp", row_parallel_sp)


def extra_operator() -> None:
    """operators: an extra ``tanh`` (of zeros, added to nothing) before every sequence gather."""
    import torch

    import harness.parallel.tensor as tensor

    original = tensor.sp_gather

    def sp_gather(x, tp_group):
        return original(x + torch.zeros_like(x).tanh(), tp_group)

    _patch(tensor, "sp_gather", sp_gather)


def policy_rank1_dies_in_step2() -> None:
    """fault: policy rank 1 exits abruptly inside its second ``train`` call."""
    import os
    import time

    from harness.policy.worker import PolicyWorkerImpl

    original = PolicyWorkerImpl.train
    calls = {"n": 0}

    def train(self, batch, eval_mode=False):
        calls["n"] += 1
        if self.rank == 1 and calls["n"] == 2:
            stamp = os.environ.get("GOLDEN_FAULT_STAMP")
            if stamp:  # lets a test measure how fast the run notices
                with open(stamp, "w") as fh:
                    fh.write(repr(time.time()))
            os._exit(17)
        return original(self, batch, eval_mode=eval_mode)

    PolicyWorkerImpl.train = train


def dp_debug_barrier() -> None:
    """collectives: one ``dist.barrier()`` on the world group before every data-parallel gradient
    reduction (a forgotten debug barrier): one inserted collective per rank and step."""
    import torch.distributed as dist

    import harness.parallel.data as data

    original = data.reduce_gradients

    def reduce_gradients(params, kinds, groups):
        dist.barrier()
        return original(params, kinds, groups)

    _patch(data, "reduce_gradients", reduce_gradients)


def extra_all_gather_on_tp_rank1() -> None:
    """collectives: TP rank 1 alone issues one extra all-gather per train step, before its gradient
    reduction, over a group of its own (a group of one cannot hang its peers). Every rank
    creates the one-rank groups in the same order right after the parallel groups."""
    import torch
    import torch.distributed as dist

    import harness.parallel.data as data
    import harness.parallel.groups as groups_mod

    own: dict[str, object] = {}
    create = groups_mod.ProcessGroups.create.__func__

    def create_with_own_groups(cls, layout, rank):
        made = create(cls, layout, rank)
        for r in range(layout.world):
            g = dist.new_group([r], group_desc="debug")
            if r == rank:
                own["group"], own["tp_rank"] = g, layout.coords[rank]["tp"]
        return made

    _patch(groups_mod.ProcessGroups, "create", classmethod(create_with_own_groups))
    original = data.reduce_gradients

    def reduce_gradients(params, kinds, groups):
        if own.get("tp_rank") == 1:
            probe = torch.zeros(4, dtype=torch.float32)
            dist.all_gather_into_tensor(torch.zeros(4, dtype=torch.float32), probe, group=own["group"])
        return original(params, kinds, groups)

    _patch(data, "reduce_gradients", reduce_gradients)


def rollout_token_changed_in_step2() -> None:
    """rollouts: one sampled token of the first generation batch of step 2 is changed (token id
    + 1) after the engine returns it and before capture stages it, as a sampler bug would. It
    patches the plain classes the rollout actor calls (``EngineProcesses`` for internal engine
    processes, ``EngineWorker`` in the actor), not the actor class (see ``WARM_SAFE``)."""
    import re

    from harness.rollout.engine_procs import EngineProcesses
    from harness.rollout.engine_worker import EngineWorker

    state: dict = {"step": None, "done": False, "vocab": None}

    def observe(method: str, args: tuple, result):
        if method == "begin_rollout":
            m = re.search(r"step(\d+)", str(args[0]) if args else "")
            state["step"] = int(m.group(1)) if m else None
        elif method == "generate" and state["step"] == 2 and not state["done"] and result:
            ids = result[0]["output_ids"]
            if ids:
                at = min(1, len(ids) - 1)
                ids[at] = (ids[at] + 1) % int(state["vocab"])
                state["done"] = True
        return result

    start = EngineProcesses.start.__func__

    def start_recording(cls, spec, **kwargs):
        state["vocab"] = spec.model.vocab  # the plan's typed workload
        return start(cls, spec, **kwargs)

    _patch(EngineProcesses, "start", classmethod(start_recording))
    call = EngineProcesses.call

    def call_observed(self, method, *args, **kwargs):
        results = call(self, method, *args, **kwargs)
        if results:
            observe(method, args, results[0])
        return results

    _patch(EngineProcesses, "call", call_observed)
    init = EngineWorker.__init__

    def init_recording(self, spec, *args, **kwargs):
        state["vocab"] = spec.model.vocab
        init(self, spec, *args, **kwargs)

    _patch(EngineWorker, "__init__", init_recording)
    for name in ("begin_rollout", "generate"):  # the in-actor engine (TP 1, sync)
        original = getattr(EngineWorker, name)

        def observed(self, *args, _original=original, _name=name, **kwargs):
            return observe(_name, args, _original(self, *args, **kwargs))

        _patch(EngineWorker, name, observed)


def teacher_logits_planted_wrong() -> None:
    """training: a distillation teacher's TP rank 1 writes its vocab shard of the logits 0.5 too high
    at one vocab entry of every sample (after its profiler step closed, so operators and
    collectives are unchanged); the student's ``distill_kl`` and ``loss`` move from step 1.

    It patches the module functions ``TeacherWorkerImpl.teacher_logits`` calls (looked up at call
    time, so it takes in a process whose actor exists): ``local_vocab_logits`` notes the rank's
    vocab shard, ``ensure_teacher_ipc_buffer`` the buffer, and ``per_sample_handles`` (called
    once the step closed) shifts the entry."""
    import harness.distill.teacher as teacher

    state: dict = {"tp_rank1": False, "buffer": None}
    logits = teacher.local_vocab_logits

    def local_vocab_logits(model, input_ids):
        state["tp_rank1"] = model.tp_rank == 1
        return logits(model, input_ids)

    ensure = teacher.ensure_teacher_ipc_buffer

    def ensure_teacher_ipc_buffer(*args, **kwargs):
        state["buffer"], handle = ensure(*args, **kwargs)
        return state["buffer"], handle

    handles = teacher.per_sample_handles

    def per_sample_handles(*args, **kwargs):
        if state["tp_rank1"] and state["buffer"] is not None:
            state["buffer"][..., 0] += 0.5
        return handles(*args, **kwargs)

    _patch(teacher, "local_vocab_logits", local_vocab_logits)
    _patch(teacher, "ensure_teacher_ipc_buffer", ensure_teacher_ipc_buffer)
    _patch(teacher, "per_sample_handles", per_sample_handles)
