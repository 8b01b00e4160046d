"""`policy.backend: dtensor`: the reference model on torch's DTensor APIs
(FSDP2 over dp, tensor-parallel plans over tp) and LoRA adapters (docs/dtensor.md).
Nothing here is imported unless a spec selects the backend."""
