"""The real SGLang engine (``sglang==0.5.17``, cuda only) behind the harness's interfaces.

* :mod:`harness.rollout.sglang.translate` -- harness requests <-> SGLang's
  ``input_ids`` / ``sampling_params`` and its ``meta_info`` results (pure, no engine);
* :mod:`harness.rollout.sglang.engine` -- :class:`SGLangEngine`: one
  ``sglang.Engine`` over a Hugging Face directory (``harness.rollout.vllm.hf_dir``),
  speaking :class:`harness.rollout.sglang_api.SGLangWeightAPI` through SGLang's own
  weight-update entry points, plus ``generate`` and a weight checksum read back from
  the engine's scheduler.

Nothing here is imported by the CPU gate: ``sglang`` is imported inside
:class:`SGLangEngine` only (docs/sglang.md).
"""
