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
"""

from __future__ import annotations


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

    tensor.row_parallel_sp = row_parallel_sp


def extra_operator() -> None:
    """operators: an extra ``tanh`` (of zeros, added to nothing) before every sequence gather."""
    import torch

    import harness.parallel.tensor as tensor

    original = tensor.sp_gather

    def sp_gather(x, tp_group):
        return original(x + torch.zeros_like(x).tanh(), tp_group)

    tensor.sp_gather = sp_gather


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
