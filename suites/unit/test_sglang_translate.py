"""Harness requests <-> SGLang's generate inputs/outputs, and the SGLangEngine adapter's
argument handling. The real SGLang engine runs only on the GPU machine
(benches/sglang_gpu_bench.py, docs/sglang.md); here ``sglang.Engine`` is replaced by a
recording test double, because no SGLang build runs on CPU: the tests check what the
adapter hands SGLang and how it treats SGLang's results, not SGLang."""

from __future__ import annotations

import pytest
import torch

from harness.refit.flat_bucket import LOAD_FORMAT, FlattenedBucket
from harness.rollout.sglang import translate
from harness.rollout.sglang.engine import SGLangEngine

REQ = {"request_id": "r0", "prompt_ids": [1, 2, 3], "max_new_tokens": 10, "seed": 7, "temperature": 0.5,
       "top_p": 0.9}


def test_sampling_params_clip_to_max_position_and_stop_on_eos_only():
    sp = translate.sampling_params(REQ, eos_token_id=5, max_position=8)
    assert sp["max_new_tokens"] == 5  # 8 - 3 prompt tokens < 10
    assert sp["sampling_seed"] == 7 and sp["temperature"] == 0.5 and sp["top_p"] == 0.9
    assert sp["stop_token_ids"] == [5] and sp["no_stop_trim"]
    assert sp["ignore_eos"] is False  # SGLang skips every stop check, stop ids included, when it is set
    assert translate.sampling_params(REQ, eos_token_id=None, max_position=64)["stop_token_ids"] == []
    kw = translate.generate_kwargs([REQ, dict(REQ, prompt_ids=[4])], eos_token_id=5, max_position=64)
    assert kw["input_ids"] == [[1, 2, 3], [4]] and kw["return_logprob"] is True
    assert [p["max_new_tokens"] for p in kw["sampling_params"]] == [10, 10]


def _out(ids, reason, lps=None):
    lps = [(-0.5 - i, t, None) for i, t in enumerate(ids)] if lps is None else lps
    return {"output_ids": ids, "meta_info": {"output_token_logprobs": lps, "finish_reason": {"type": reason}}}


def test_result_of_maps_stop_on_eos_and_length():
    r = translate.result_of(REQ, _out([9, 5], "stop"), eos_token_id=5, weight_version=3)
    assert r["output_ids"] == [9, 5] and r["logprobs"] == [-0.5, -1.5]
    assert r["finish_reason"] == "eos" and r["weight_version"] == 3 and r["prompt_ids"] == [1, 2, 3]
    assert translate.result_of(REQ, _out([9, 8], "length"), eos_token_id=5, weight_version=0)["finish_reason"] \
        == "length"


@pytest.mark.parametrize("out, match", [
    (_out([9, 8], "stop"), "not on EOS"),                      # a stop that is not the EOS token
    (_out([9, 5], "abort"), "'abort'"),                        # neither stop nor length
    (_out([9, 5], "stop", lps=[(-1.0, 9, None)]), "no per-token logprobs"),
    (_out([9, 5], "stop", lps=[(-1.0, 9, None), (-1.0, 6, None)]), "differ from its output ids"),
])
def test_result_of_refuses_what_the_harness_cannot_trust(out, match):
    with pytest.raises(RuntimeError, match=match):
        translate.result_of(REQ, out, eos_token_id=5, weight_version=0)


class RecordingEngine:
    """Test double of ``sglang.Engine`` (no SGLang on CPU): records calls, answers ``result``."""

    def __init__(self, result=(True, "ok")):
        self.calls: list[tuple] = []
        self.result = result

    def update_weights_from_tensor(self, named, load_format=None, flush_cache=True):
        self.calls.append(("tensor", named, load_format))
        return self.result

    def update_weights_from_distributed(self, names, dtypes, shapes, group_name, flush_cache=True):
        self.calls.append(("distributed", names, dtypes, shapes, group_name))
        return self.result


def _adapter(double, tp=1):
    eng = object.__new__(SGLangEngine)  # __init__ would start a real sglang.Engine
    eng.engine, eng.tp_size, eng.eos_token_id, eng.max_position, eng.weight_version = double, tp, 5, 64, 0
    return eng


def test_update_from_tensor_versions_and_refusals(monkeypatch):
    double = RecordingEngine()
    eng = _adapter(double)
    named = [("a", torch.ones(2)), ("b", torch.zeros(3))]
    assert eng.update_weights_from_tensor(named, weight_version="4") == (True, "ok")
    assert eng.get_weight_version() == "4" and double.calls[-1][0] == "tensor"
    # one flattened bucket per TP rank, else refused before SGLang is called
    payload = FlattenedBucket(named).payload()
    ok, msg = eng.update_weights_from_tensor([payload, payload], load_format=LOAD_FORMAT)
    assert not ok and "one per TP rank" in msg and len(double.calls) == 1
    # the harness payload is rebuilt into named tensors for SGLang's own bucket (stubbed: no sglang here)
    monkeypatch.setattr(SGLangEngine, "_sglang_bucket", staticmethod(lambda n: [(k, v.clone()) for k, v in n]))
    assert eng.update_weights_from_tensor([payload], load_format=LOAD_FORMAT)[0]
    sent = double.calls[-1][1][0]
    assert double.calls[-1][2] == "flattened_bucket" and [k for k, _ in sent] == ["a", "b"]
    assert all(torch.equal(v, dict(named)[k]) for k, v in sent) and eng.get_weight_version() == "5"
    ok, msg = eng.update_weights_from_tensor(named, load_format="direct")
    assert not ok and "not supported" in msg
    double.result = (False, "shape mismatch")  # SGLang's own refusal: passed on, version unchanged
    assert eng.update_weights_from_tensor(named) == (False, "shape mismatch") and eng.get_weight_version() == "5"


def test_update_from_distributed_sends_sglang_dtype_names():
    double = RecordingEngine()
    eng = _adapter(double)
    assert eng.update_weights_from_distributed(["a"], [torch.float32], [(2, 3)], group_name="g", weight_version=2)[0]
    assert double.calls[-1] == ("distributed", ["a"], ["float32"], [[2, 3]], "g")
    assert eng.get_weight_version() == "2"
    ok, msg = eng.update_weights_from_distributed(["a"], ["float32"], [(2,)], weight_version="x")
    assert not ok and "weight_version" in msg and len(double.calls) == 1
