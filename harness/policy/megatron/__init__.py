"""megatron-core policy backend (`policy.backend: megatron`); see docs/megatron.md.

Importing this package does not import megatron-core; `MegatronPolicyEngine`
does, when constructed."""
