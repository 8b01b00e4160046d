"""The real SGLang engine (``sglang==0.5.17``, cuda only) behind the harness's interfaces.

* :mod:`harness.rollout.sglang.translate` -- harness requests <-> SGLang's
  ``input_ids`` / ``sampling_params`` and its ``meta_info`` results (pure, no engine);
* :mod:`harness.rollout.sglang.worker` / ``start`` -- ``rollout.backend: sglang``: the
  engine in the rollout actor (sync, TP 1) with the ``EngineWorker`` surface, refit
  through ``update_weights_from_tensor``;
* :mod:`harness.rollout.sglang.engine` -- :class:`SGLangEngine`: one
  ``sglang.Engine`` over a Hugging Face directory (``harness.rollout.vllm.hf_dir``),
  speaking :class:`harness.rollout.sglang_api.SGLangWeightAPI` through SGLang's own
  weight-update entry points, plus ``generate`` and a weight checksum read back from
  the engine's scheduler.

Nothing here imports ``sglang`` at module level: it is imported inside
:class:`SGLangEngine` only (docs/sglang.md).
"""

from __future__ import annotations

import importlib.util


def sglang_available() -> bool:
    """True when the ``sglang`` package can be imported (without importing it)."""
    spec = importlib.util.find_spec("sglang")
    return spec is not None and spec.origin is not None


def require_sglang() -> None:
    """Raise ``RuntimeError`` naming ``rollout.backend`` and the install route when sglang is missing."""
    if not sglang_available():
        raise RuntimeError("rollout.backend: sglang needs the sglang package (sglang==0.5.17 with torch 2.11 on a "
                           "CUDA machine) in the rollout worker environment, and it is not installed; "
                           "ci/gpu/sglang_wheels.sh builds its wheels (docs/sglang.md)")
