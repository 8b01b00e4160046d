""":class:`SGLangEngine`: one real ``sglang.Engine`` speaking the harness's SGLang weight API.

Contract (cuda only; ``sglang==0.5.17`` with ``torch==2.11.0``, docs/sglang.md):

* the engine loads a Hugging Face directory written by
  :func:`harness.rollout.vllm.hf_dir.write_hf_dir` (the project's Qwen3-MoE config and
  weights under HF names), no tokenizer (``skip_tokenizer_init=True``), token-id prompts;
* :meth:`update_weights_from_tensor` is SGLang's colocated entry point. ``load_format=
  None``: ``[(name, tensor), ...]`` go through ``Engine.update_weights_from_tensor``
  (SGLang pickles them with its ``MultiprocessingSerializer``: a cuda tensor travels as
  a CUDA IPC handle, no copy through the host). ``load_format="flattened_bucket"``: each
  payload is the harness's :class:`harness.refit.flat_bucket.FlattenedBucket` payload (one
  per TP rank), turned into SGLang's own ``FlattenedTensorBucket`` and serialized by SGLang
  (one IPC handle per bucket);
* :meth:`init_weights_update_group` / :meth:`update_weights_from_distributed` /
  :meth:`destroy_weights_update_group` forward to SGLang's weight-update group (the
  trainer is rank 0 and broadcasts each tensor; the engine's TP rank ``i`` is
  ``rank_offset + i``);
* every call returns ``(success, message)``; ``weight_version`` is kept here (SGLang
  0.5.17's ``Engine`` calls take none) and reported by :meth:`get_weight_version`;
* :meth:`weights_checksum` reads the weights back from the engine's scheduler process
  (SGLang's ``check_weights`` action ``checksum``: one hash per parameter, in SGLang's
  fused layout), so two engines' weights, or one engine's before and after a refit,
  compare bit for bit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from harness.refit.flat_bucket import LOAD_FORMAT, reconstruct
from harness.rollout.sglang import translate
from harness.rollout.sglang_api import DEFAULT_GROUP, Result, _version

# deterministic, portable choices: the Triton attention kernels (no FA3 library is
# carried, docs/sglang.md), torch sampling, no radix cache across generate calls.
# Deterministic inference (batch-invariant kernels) is also what makes fp32 run at all:
# sgl_kernel's fused RMSNorm refuses float32 ("failed to dispatch data type Float", measured
# 2026-12-07 on an H100); in that mode SGLang takes its torch RMSNorm. CUDA graphs are off:
# their prefill capture ran the same kernel, and graphs were not measured in that mode.
ENGINE_DEFAULTS: dict[str, Any] = {
    "skip_tokenizer_init": True,
    "enable_deterministic_inference": True,
    "disable_cuda_graph": True,
    "attention_backend": "triton",
    "sampling_backend": "pytorch",
    "grammar_backend": "none",
    "disable_radix_cache": True,
    "log_level": "warning",
    "mem_fraction_static": 0.3,
}


def _result(out: Any) -> Result:
    """SGLang's results come as ``(success, message)`` tuples, or objects/dicts with those fields."""
    if isinstance(out, (tuple, list)) and len(out) >= 2:
        return bool(out[0]), str(out[1])
    if isinstance(out, Mapping):
        return bool(out.get("success")), str(out.get("message", ""))
    return bool(getattr(out, "success", False)), str(getattr(out, "message", out))


class SGLangEngine:
    """A real SGLang engine (TP ``tp``) over ``model_dir``; implements ``SGLangWeightAPI``."""

    def __init__(self, model_dir: str, *, eos_token_id: int | None, max_position: int, dtype: str = "float32",
                 tp: int = 1, seed: int = 0, **engine_kwargs: Any) -> None:
        import sglang

        kwargs = dict(ENGINE_DEFAULTS, model_path=model_dir, dtype=dtype, tp_size=tp, random_seed=seed,
                      context_length=max_position)
        kwargs.update(engine_kwargs)
        self.engine = sglang.Engine(**kwargs)
        self.tp_size = tp
        self.eos_token_id = eos_token_id
        self.max_position = max_position
        self.weight_version = 0

    # -- generation ----------------------------------------------------------------------
    def generate(self, requests: Sequence[Mapping[str, Any]]) -> list[dict]:
        """Harness requests in, harness results out (one engine call for the whole batch)."""
        if not requests:
            return []
        outs = self.engine.generate(**translate.generate_kwargs(requests, eos_token_id=self.eos_token_id,
                                                               max_position=self.max_position))
        return [translate.result_of(r, o, eos_token_id=self.eos_token_id, weight_version=self.weight_version)
                for r, o in zip(requests, outs)]

    # -- colocated -------------------------------------------------------------------------
    def update_weights_from_tensor(self, named_tensors: Sequence[Any], load_format: str | None = None,
                                   flush_cache: bool = True, weight_version: str | int | None = None) -> Result:
        try:
            version = _version(weight_version)
            if load_format == LOAD_FORMAT:
                if len(named_tensors) != self.tp_size:
                    raise ValueError(f"{len(named_tensors)} flattened bucket(s) for an engine of "
                                     f"{self.tp_size} TP rank(s): one per TP rank")
                payloads = [self._sglang_bucket(reconstruct(p)) for p in named_tensors]
                out = self.engine.update_weights_from_tensor(payloads, load_format="flattened_bucket",
                                                             flush_cache=flush_cache)
            elif load_format is None:
                out = self.engine.update_weights_from_tensor(list(named_tensors), flush_cache=flush_cache)
            else:
                raise ValueError(f"load_format {load_format!r} is not supported (None or {LOAD_FORMAT!r})")
        except (ValueError, TypeError, RuntimeError) as exc:
            return False, f"update_weights_from_tensor failed: {exc}"
        ok, msg = _result(out)
        if ok:
            self._set_version(version)
        return ok, msg

    @staticmethod
    def _sglang_bucket(named: Sequence[tuple[str, Any]]) -> str:
        """SGLang's own flattened bucket of ``named`` (one dtype), serialized by SGLang: the
        flattened tensor travels as one CUDA IPC handle when it lives on a GPU."""
        from sglang.srt.utils import MultiprocessingSerializer
        from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket

        bucket = FlattenedTensorBucket(named_tensors=list(named))
        return MultiprocessingSerializer.serialize(
            {"flattened_tensor": bucket.get_flattened_tensor(), "metadata": bucket.get_metadata()},
            output_str=True)

    # -- separate (weight-update group) ------------------------------------------------------
    def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                                  group_name: str = DEFAULT_GROUP, backend: str = "nccl") -> Result:
        return _result(self.engine.init_weights_update_group(master_address, master_port, rank_offset, world_size,
                                                             group_name, backend=backend))

    def update_weights_from_distributed(self, names: Sequence[str], dtypes: Sequence[str],
                                        shapes: Sequence[Sequence[int]], group_name: str = DEFAULT_GROUP,
                                        flush_cache: bool = True,
                                        weight_version: str | int | None = None) -> Result:
        try:
            version = _version(weight_version)
        except ValueError as exc:
            return False, f"update_weights_from_distributed failed: {exc}"
        ok, msg = _result(self.engine.update_weights_from_distributed(
            list(names), [str(d).replace("torch.", "") for d in dtypes], [list(s) for s in shapes],
            group_name=group_name, flush_cache=flush_cache))
        if ok:
            self._set_version(version)
        return ok, msg

    def destroy_weights_update_group(self, group_name: str = DEFAULT_GROUP) -> Result:
        return _result(self.engine.destroy_weights_update_group(group_name))

    # -- versions and read-back ----------------------------------------------------------------
    def get_weight_version(self) -> str:
        return str(self.weight_version)

    def _set_version(self, version: int | None) -> None:
        self.weight_version = self.weight_version + 1 if version is None else version

    def weights_checksum(self) -> dict[str, Any]:
        """The weights as the engine holds them: ``{"engine": sha, "tensors": {name: hash}}``
        (SGLang's ``check_weights`` ``checksum``, computed in its scheduler process)."""
        from sglang.srt.managers.io_struct import CheckWeightsReqInput

        tm = self.engine.tokenizer_manager
        ok, msg, ranks, engine_sha = self.engine.loop.run_until_complete(
            tm.check_weights(CheckWeightsReqInput(action="checksum"), None))
        if not ok:
            raise RuntimeError(f"SGLang check_weights failed: {msg}")
        tensors: dict[str, str] = {}
        for rank in ranks or []:
            for name, h in rank["checksums"].items():
                tensors[f"tp{rank['parallelism_info']['tp_rank']}:{name}"] = h
        return {"engine": engine_sha, "tensors": tensors}

    def shutdown(self) -> None:
        self.engine.shutdown()
