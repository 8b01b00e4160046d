"""CUDA-graph decode (``harness.rollout.native.decode_graphs``) and the GPU start-up helpers.

On the CPU: the padded step a graph records (padding rows on a scratch slot, a longer
masked length) gives every real row the bits of the unpadded invariant step; the
engine refuses graphs where they cannot run, naming why; the KV pool's reserved slot is
never handed out; the background draw of the initial weights equals ``initial_weights``;
host-page registration reports a missing cuda instead of registering. On cuda (L2): an
engine replaying its decode steps gives every request the bits of its eager run alone,
in fp32 and bf16, and registered host pages copy the same bits.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest
import torch

from harness.rollout.engine_worker import draw_initial_weights, initial_weights
from harness.rollout.native.decode_batch import DecodeBatch
from harness.rollout.native.decode_graphs import GRAPHS_ENV, padded_inputs, padded_step
from harness.rollout.native.engine import Engine, default_cuda_graphs
from harness.rollout.native.kv_cache import KVCachePool
from suites.tiny_engine import DECODE_CFG, reference_weights
from suites.torch_state import one_deterministic_thread  # noqa: F401 (a module-scoped autouse fixture)

CFG = DECODE_CFG
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA device (L2: ci/l2.sh on a GPU machine)")


@pytest.fixture(scope="module")
def weights():
    return reference_weights(CFG, 5)


@dataclass
class Row:
    slot: int
    cached: int
    tokens: list[int] = field(default_factory=list)


def _prefilled(engine: Engine, prompts: list[list[int]]) -> list[Row]:
    rows = []
    for slot, prompt in enumerate(prompts):
        engine.forward.step([(slot, 0, prompt)])
        rows.append(Row(slot=slot, cached=len(prompt), tokens=[*prompt, (7 * slot + 3) % CFG.vocab]))
    return rows


def test_the_padded_step_gives_every_row_the_unpadded_bits(weights):
    engine = Engine(CFG, weights, max_batch_size=8, decode_kernels="invariant")
    rows = _prefilled(engine, [[(5 * i + j) % CFG.vocab for j in range(4 + 3 * i)] for i in range(3)])
    plain = engine.forward.step([], DecodeBatch.build(engine.forward, rows))[0]
    ordered = sorted(rows, key=lambda r: r.cached)
    # 3 rows padded to 8 on the free slot 7, over 64 masked positions (the longest row has 11)
    padded = padded_step(engine.forward, padded_inputs(ordered, 8, scratch_slot=7), length=64)
    assert padded.shape[0] == 8
    assert torch.equal(padded[:3], plain)


def test_padding_rows_sit_on_the_scratch_slot_at_their_own_positions():
    rows = [Row(slot=2, cached=5, tokens=[1, 2, 3, 4, 5, 9]), Row(slot=0, cached=7, tokens=[8] * 8)]
    host = padded_inputs(rows, 4, scratch_slot=6)
    assert host.tolist() == [[5, 7, 0, 1], [2, 0, 6, 6], [9, 8, 0, 0]]


def test_graphs_are_refused_where_they_cannot_run(weights, monkeypatch):
    with pytest.raises(ValueError, match="cuda_graphs: device cpu is not cuda"):
        Engine(CFG, weights, max_batch_size=2, decode_kernels="invariant", cuda_graphs=True)
    monkeypatch.setenv(GRAPHS_ENV, "yes")
    with pytest.raises(ValueError, match=f"\\${GRAPHS_ENV} must be 0 or 1, got 'yes'"):
        Engine(CFG, weights, max_batch_size=2)
    monkeypatch.setenv(GRAPHS_ENV, "0")
    engine = Engine(CFG, weights, max_batch_size=2)
    assert engine.scheduler.graphs is None and engine.kv.free_slots == 2  # off: no scratch slot


def test_a_reserved_kv_slot_is_never_allocated():
    pool = KVCachePool(layers=1, slots=3, max_position=4, kv_heads=1, head_dim=2, dtype=torch.float32,
                       device=torch.device("cpu"))
    assert pool.reserve(2) == 2
    assert [pool.allocate(), pool.allocate()] == [0, 1]
    with pytest.raises(RuntimeError, match="pool exhausted"):
        pool.allocate()
    pool.release(0)
    with pytest.raises(RuntimeError, match="slot 1 is not free"):
        pool.reserve(1)


def test_the_background_draw_is_initial_weights():
    spec = {"seed": 11, "model": dataclasses.asdict(CFG)}
    drawn = draw_initial_weights(spec).result()
    expected = initial_weights(spec)
    assert list(drawn) == list(expected)
    assert all(torch.equal(drawn[n], expected[n]) and drawn[n].dtype == expected[n].dtype for n in expected)


def test_graphs_are_the_default_on_cuda_at_tp1_only(weights, monkeypatch):
    assert default_cuda_graphs(torch.device("cuda"), 1)
    assert not default_cuda_graphs(torch.device("cuda"), 2)  # a TP step's collectives cannot be captured
    assert not default_cuda_graphs(torch.device("cpu"), 1)
    monkeypatch.delenv(GRAPHS_ENV, raising=False)
    engine = Engine(CFG, weights, max_batch_size=2)  # the CPU default: no graphs, no scratch slot, no error
    assert engine.scheduler.graphs is None and engine.kv.free_slots == 2


def test_host_page_registration_without_cuda_registers_nothing(monkeypatch):
    from harness.policy.megatron import host_pages

    monkeypatch.setattr(host_pages.torch.cuda, "is_available", lambda: False)
    pages = host_pages.register_host_pages([torch.ones(4)])
    assert (pages.pointers, pages.bytes, pages.error) == ([], 0, "cuda is not available")
    pages.release()


def _reqs(n=9, max_new=12):
    return [dict(request_id=i, prompt_ids=[(13 * i + 7 * j) % 256 for j in range(3 + i % 6)],
                 max_new_tokens=max_new - i % 4, seed=i, temperature=(1.0, 0.0, 0.7)[i % 3],
                 top_p=(1.0, 1.0, 0.9, 1.0)[i % 4]) for i in range(n)]


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_on_cuda_replayed_decode_gives_each_request_its_eager_bits_alone(weights, dtype):
    cfg = dataclasses.replace(CFG, dtype=dtype)
    w = {n: t.to(cfg.torch_dtype()) for n, t in weights.items()}
    engine = Engine(cfg, w, max_batch_size=9, device="cuda", cuda_graphs=True)
    reqs = _reqs()
    out = engine.generate(reqs)
    graphs = engine.scheduler.graphs
    assert graphs is not None and graphs.buckets and graphs.replays > 0
    alone = Engine(cfg, w, max_batch_size=1, device="cuda", cuda_graphs=False)
    assert out == [alone.generate([r])[0] for r in reqs]
    assert engine.generate(reqs) == out  # the second run replays the captured buckets


@pytest.mark.gpu
@needs_cuda
def test_on_cuda_registered_host_pages_copy_the_same_bits():
    from harness.policy.megatron.host_pages import register_host_pages

    host = [torch.randn(1000), torch.randn(3, 7)]
    pages = register_host_pages(host)
    assert pages.error is None and pages.bytes == 4 * (1000 + 21) and all(t.is_pinned() for t in host)
    assert all(torch.equal(t.cuda().cpu(), t) for t in host)
    pages.release()
    assert not any(t.is_pinned() for t in host)


@pytest.mark.gpu
@needs_cuda
def test_on_cuda_an_engine_replays_its_decode_by_default_and_yields_to_standard_kernels(weights, monkeypatch):
    import warnings

    monkeypatch.delenv(GRAPHS_ENV, raising=False)
    engine = Engine(CFG, weights, max_batch_size=4, device="cuda")
    engine.generate(_reqs(4))
    assert engine.scheduler.graphs is not None and engine.scheduler.graphs.replays > 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # asked-for standard kernels: eager decode without a warning
        standard = Engine(CFG, weights, max_batch_size=4, device="cuda", decode_kernels="standard")
        per_request = Engine(CFG, weights, max_batch_size=4, device="cuda", batched_decode=False)
    assert standard.scheduler.graphs is None and per_request.scheduler.graphs is None
    monkeypatch.setenv(GRAPHS_ENV, "0")
    assert Engine(CFG, weights, max_batch_size=4, device="cuda").scheduler.graphs is None
