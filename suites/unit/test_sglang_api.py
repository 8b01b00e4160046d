"""SGLang's weight-update API over the native engine, flattened one-dtype buckets, result checks.

Real native engines (tiny Qwen3-MoE) and real tensors; the refit paths over
real gloo groups are in suites/integration/test_sglang_refit.py.
"""

from __future__ import annotations

import pytest
import torch

from harness.model.config import ModelConfig
from harness.model.qwen3_moe import build_reference_model
from harness.refit.flat_bucket import LOAD_FORMAT, FlattenedBucket, dtype_from_str, group_by_dtype, reconstruct
from harness.refit.sglang_refit import check_weight_sync_results
from harness.rollout.native.engine import Engine
from harness.rollout.sglang_api import NativeSGLangEngine
from harness.rollout.sharding import ShardPlan
from harness.spec.backends import BackendMissing, require_backends

CFG = ModelConfig(layers=1, hidden=16, heads=2, kv_heads=1, head_dim=8, experts=2, top_k=1,
                  moe_intermediate=8, vocab=32, max_position=32)
UNUSED_TP_GROUP = object()  # the TP shards here only load weights; a TP group is used by generation alone


def _weights(seed: int) -> dict[str, torch.Tensor]:
    return {n: t.detach().clone() for n, t in build_reference_model(CFG, seed=seed).state_dict().items()}


def _requests():
    return [dict(request_id=f"r{i}", prompt_ids=[1 + i, 2, 3], max_new_tokens=4, seed=i, temperature=1.0,
                 top_p=1.0) for i in range(3)]


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def test_flattened_buckets_round_trip_bit_exact_one_dtype_each():
    g = torch.Generator().manual_seed(3)
    bucket = [
        ("a", torch.randn(3, 4, generator=g)),
        ("b", torch.randn(5, generator=g).to(torch.bfloat16)),
        ("c", torch.randint(-9, 9, (2, 2, 2), generator=g)),
        ("d", torch.tensor(float("nan"))),  # 0-d, and NaN bits survive
        ("e", torch.randn(7, generator=g).to(torch.bfloat16)),
    ]
    groups = group_by_dtype(bucket)
    assert [(d, [n for n, _ in ts]) for d, ts in groups] == [
        (torch.float32, ["a", "d"]), (torch.bfloat16, ["b", "e"]), (torch.int64, ["c"])]
    out = {}
    for dtype, named in groups:
        flat = FlattenedBucket(named)
        assert flat.flattened_tensor.dim() == 1 and flat.dtype == dtype
        out.update(reconstruct(flat.payload()))
    assert sorted(out) == ["a", "b", "c", "d", "e"]
    assert all(_bits_equal(out[n], t) for n, t in bucket)
    with pytest.raises(ValueError, match="one dtype"):
        FlattenedBucket(bucket[:2])
    bad = FlattenedBucket(bucket[:1]).payload()
    bad["metadata"][0] = type(bad["metadata"][0])("a", (3, 5), "torch.float32", 0, 12)
    with pytest.raises(ValueError, match="a: elements"):
        reconstruct(bad)
    assert dtype_from_str("bfloat16") is torch.bfloat16 and dtype_from_str("torch.int64") is torch.int64
    with pytest.raises(ValueError, match="not a torch dtype"):
        dtype_from_str("Tensor")


def test_update_weights_from_tensor_loads_bit_exact_and_sets_the_version():
    engine = NativeSGLangEngine([Engine(CFG, _weights(1), batched_decode=False)])
    new = _weights(2)
    items = list(new.items())
    half = len(items) // 2
    assert engine.update_weights_from_tensor(items[:half], weight_version="3")[0]
    payload = FlattenedBucket(items[half:]).payload()
    ok, msg = engine.update_weights_from_tensor([payload], load_format=LOAD_FORMAT, weight_version=4)
    assert ok, msg
    assert engine.get_weight_version() == "4"
    state = engine.state_dicts()[0]
    assert all(_bits_equal(state[n], t) for n, t in new.items())
    # and the refitted engine generates what an engine built with those weights generates
    fresh = Engine(CFG, new, batched_decode=False)
    got = [{k: v for k, v in r.items() if k != "weight_version"} for r in engine.shards[0].generate(_requests())]
    want = [{k: v for k, v in r.items() if k != "weight_version"} for r in fresh.generate(_requests())]
    assert got == want


def test_tp_shards_each_load_their_own_bucket_and_unshard_to_the_sent_weights():
    shards = [Engine(CFG, None, tp_rank=r, tp_size=2, tp_group=UNUSED_TP_GROUP, batched_decode=False)
              for r in range(2)]
    engine = NativeSGLangEngine(shards)
    new = _weights(5)
    payload = FlattenedBucket(list(new.items())).payload()
    assert engine.update_weights_from_tensor([payload, payload], load_format=LOAD_FORMAT)[0]
    states = engine.state_dicts()
    plan = ShardPlan(engine.shards[0].cfg, 0, 2)
    assert all(_bits_equal(plan.unshard(n, [s[n] for s in states]), t) for n, t in new.items())
    assert engine.get_weight_version() == "1"  # no version given: counts up


@pytest.mark.parametrize("case,match", [
    ("unknown", "no parameter named 'nope'"),
    ("shape", "engine expects"),
    ("count", "2 flattened bucket"),
    ("format", "load_format 'direct'"),
    ("version", "weight_version must be an integer"),
])
def test_a_refused_update_reports_false_and_leaves_the_weights_untouched(case, match):
    before = _weights(1)
    engine = NativeSGLangEngine([Engine(CFG, before, batched_decode=False)])
    new = list(_weights(2).items())
    kw: dict = {"load_format": LOAD_FORMAT}
    if case == "unknown":
        named = [FlattenedBucket([*new[:3], ("nope", torch.zeros(2))]).payload()]
    elif case == "shape":
        named = [FlattenedBucket([*new[:3], (new[3][0], torch.zeros(1))]).payload()]
    elif case == "count":
        named = [FlattenedBucket(new).payload()] * 2
    elif case == "format":
        named, kw = new, {"load_format": "direct"}
    else:
        named, kw = new, {"weight_version": "v2"}
    ok, msg = engine.update_weights_from_tensor(named, **kw)
    assert ok is False and match in msg
    state = engine.state_dicts()[0]
    assert all(_bits_equal(state[n], t) for n, t in before.items())
    assert engine.get_weight_version() == "0"


def test_weight_update_group_calls_refuse_unknown_groups():
    engine = NativeSGLangEngine([Engine(CFG, _weights(1), batched_decode=False)])
    assert engine.update_weights_from_distributed(["x"], ["float32"], [[1]], group_name="g") == (
        False, "no weight update group named 'g'")
    assert engine.destroy_weights_update_group("g")[0] is False
    assert engine.init_weights_update_group("127.0.0.1", 1, 1, 1, group_name="g")[0] is False  # world_size 1
    assert engine.weight_update_groups() == []


def test_check_weight_sync_results_names_every_failing_engine():
    check_weight_sync_results([(True, "ok"), {"success": True, "message": "ok"}])
    with pytest.raises(RuntimeError, match=r"engine 1: disk on fire; engine 2: malformed result None"):
        check_weight_sync_results([(True, "ok"), (False, "disk on fire"), None], what="refit")
    with pytest.raises(RuntimeError, match="malformed"):
        check_weight_sync_results([("yes", "ok")])


def test_rollout_backend_sglang_is_refused_up_front_naming_the_versions_that_would_run():
    spec = {"name": "w", "rollout": {"backend": "sglang"}, "platform": {"device": "cpu"}}
    with pytest.raises(BackendMissing, match=r"sglang==0\.5\.17") as info:
        require_backends(spec)
    assert "rollout.backend" in str(info.value)
