"""``rollout.backend: native``: the harness's own generation engine (docs/rollout.md).

``engine.Engine`` composes ``weights`` (packed shards, refit), ``forward`` (one
step's math and the TP sum), ``probe`` (may batched decode run here),
``projections`` (the row-item bmm kernels batched decode uses), ``scheduler``
(continuous batching), ``sampling`` (seeded per-request sampling) and
``kv_cache`` (the slot pool).
"""
