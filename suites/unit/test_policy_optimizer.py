"""Which AdamW kernels a policy engine steps with (``EngineCommon._init_training_state``).

Tensor by tensor (``foreach=False``) everywhere, which is what every CPU golden was stored
with, except for a backend that sets ``FOREACH_ADAMW_ON_CUDA`` (megatron, issue 20) with
its parameters on cuda: then torch's multi-tensor kernels.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.policy.common import EngineCommon
from harness.spec import load_spec

REPO = Path(__file__).resolve().parents[2]
SPEC = load_spec(str(REPO / "goldens/qwen3_moe_tiny_smoke/workload.yaml"))
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA device (L2: ci/l2.sh on a GPU machine)")


class _Engine(EngineCommon):
    def __init__(self, device: str, foreach_on_cuda: bool) -> None:
        self.FOREACH_ADAMW_ON_CUDA = foreach_on_cuda
        self.named = [("w", torch.nn.Parameter(torch.ones(3, device=device)))]
        self._init_training_state(SPEC)


def test_on_the_cpu_adamw_steps_tensor_by_tensor_whatever_the_backend_says():
    assert _Engine("cpu", foreach_on_cuda=False).optimizer.defaults["foreach"] is False
    assert _Engine("cpu", foreach_on_cuda=True).optimizer.defaults["foreach"] is False


def test_only_the_megatron_backend_asks_for_multi_tensor_kernels_on_cuda():
    pytest.importorskip("megatron.core", reason="megatron-core not installed")
    from harness.policy.dtensor.engine import DTensorPolicyEngine
    from harness.policy.megatron.engine import MegatronPolicyEngine
    from harness.policy.native.engine import NativePolicyEngine

    assert MegatronPolicyEngine.FOREACH_ADAMW_ON_CUDA is True
    assert not getattr(NativePolicyEngine, "FOREACH_ADAMW_ON_CUDA", False)  # the native cuda goldens did not move
    assert not getattr(DTensorPolicyEngine, "FOREACH_ADAMW_ON_CUDA", False)


@pytest.mark.gpu
@needs_cuda
def test_on_cuda_a_backend_that_asks_gets_the_multi_tensor_kernels():
    assert _Engine("cuda", foreach_on_cuda=True).optimizer.defaults["foreach"] is True
    assert _Engine("cuda", foreach_on_cuda=False).optimizer.defaults["foreach"] is False
