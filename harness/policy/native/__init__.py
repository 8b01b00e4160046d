"""The native policy backend (``policy.backend: native``): the harness's own tensor,
pipeline, context and expert parallel Qwen3-MoE over torch.distributed (docs/policy.md).
A peer of ``harness.policy.megatron`` and ``harness.policy.dtensor``; the policy
registry (``harness.registry.policy``) selects it."""
