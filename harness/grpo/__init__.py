"""GRPO trainers (sync, dataplane, streaming, distill) over the policy and rollout workers;
``harness.registry.trainer`` maps ``grpo.trainer`` to their classes."""
