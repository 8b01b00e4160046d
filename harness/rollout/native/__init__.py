"""``rollout.backend: native``: the harness's own generation engine (docs/rollout.md).

``engine.Engine`` composes ``weights`` (packed shards, refit), ``forward`` (one
step's math and the TP sum), ``probe`` (may batched decode run here),
``projections`` (the row-item bmm kernels batched decode uses) and ``scheduler``
(continuous batching and sampling).
"""
