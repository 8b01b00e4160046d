"""Both SGLang refit paths into native engines over real gloo groups, bit-exact.

* Colocated: a world of 4 spawned trainer ranks with the real colocate
  topology (``dist.new_group`` subgroups, ``gather_object``). The engines are
  :class:`NativeSGLangEngine` objects living in their gather-source rank's
  process (with SGLang they are Ray actors on the same GPUs; the call is the
  same). Layout ``[1, 2]`` (rank 3 a placeholder), then a recovered engine
  resizes it to ``[2, 2]`` (every subgroup destroyed and rebuilt), a no-op
  reconnect, a refused bucket, and a mixed-dtype bucket (one engine call per
  dtype).
* Separate: trainer rank 0 and three engine TP ranks (engines of TP 1 and 2)
  in a weight-update side group; the members are threads of this process,
  each with its own ``ProcessGroupGloo``.
"""

from __future__ import annotations

import datetime
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from harness.model.config import ModelConfig
from harness.model.qwen3_moe import build_reference_model
from harness.parallel.rendezvous import RendezvousServer, join_rendezvous
from harness.refit.buckets import iter_named_tensor_buckets
from harness.refit.colocate import ColocateTopology, connect_colocate_topology, disconnect_colocate_topology
from harness.refit.sglang_refit import (
    broadcast_hf_buckets_via_distributed,
    connect_rollout_engines_from_distributed,
    disconnect_rollout_engines_from_distributed,
    send_hf_buckets_colocated,
)
from harness.rollout.native.engine import Engine
from harness.rollout.sglang_api import NativeSGLangEngine
from harness.rollout.sharding import ShardPlan

pytestmark = pytest.mark.slow

CFG = ModelConfig(layers=1, hidden=16, heads=2, kv_heads=2, head_dim=8, experts=2, top_k=1,
                  moe_intermediate=8, vocab=32, max_position=32)
WORLD = 4
BUFFER = 2048  # bytes: several buckets per refit
UNUSED_TP_GROUP = object()  # these TP shards only load weights; a TP group is used by generation alone


def _weights(seed: int) -> dict[str, torch.Tensor]:
    return {n: t.detach().clone() for n, t in build_reference_model(CFG, seed=seed).state_dict().items()}


def _native(tp: int) -> NativeSGLangEngine:
    if tp == 1:
        return NativeSGLangEngine([Engine(CFG, None, batched_decode=False)])
    return NativeSGLangEngine([Engine(CFG, None, tp_rank=r, tp_size=tp, tp_group=UNUSED_TP_GROUP,
                                      batched_decode=False) for r in range(tp)])


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def _mismatches(engine: NativeSGLangEngine, weights: dict[str, torch.Tensor]) -> list[str]:
    """Names whose engine value (unsharded over the TP ranks) differs in any bit from ``weights``."""
    states = engine.state_dicts()
    plan = ShardPlan(CFG, 0, engine.tp_size)
    bad = []
    for name, want in weights.items():
        got = states[0][name] if engine.tp_size == 1 else plan.unshard(name, [s[name] for s in states])
        if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(_bits(got), _bits(want)):
            bad.append(name)
    return bad


class _MixedShard:
    """A weight holder of several dtypes (the native engine has one dtype per model)."""

    def __init__(self, infos: dict[str, tuple[tuple[int, ...], torch.dtype]]) -> None:
        self.tensors = {n: torch.zeros(s, dtype=d) for n, (s, d) in infos.items()}
        self.weight_version = 0

    def state_dict_info(self):
        return {n: (tuple(t.shape), t.dtype) for n, t in self.tensors.items()}

    def load_weights(self, named):
        for n, t in named:
            self.tensors[n].copy_(t)
        return [n for n, _ in named]

    def state_dict(self):
        return {n: t.clone() for n, t in self.tensors.items()}


def _mixed_weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(9)
    return {"f": torch.randn(4, 3, generator=g), "h": torch.randn(6, generator=g).to(torch.bfloat16),
            "i": torch.randint(0, 99, (5,), generator=g), "f2": torch.randn(2, generator=g)}


def _colocated_rank(rank: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = join_rendezvous("127.0.0.1", port, 120.0)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=120))
    facts: dict = {"rank": rank}
    try:
        topo = ColocateTopology()

        def refit(engines, weights, version):
            calls = send_hf_buckets_colocated(
                bucket_iterator=iter_named_tensor_buckets(weights.items(), BUFFER), rollout_engines=engines,
                topology=topo, weight_version=version)
            out = {"calls": calls, "src": topo.src, "engine": topo.engine_index,
                   "group_size": None if topo.group is None else dist.get_world_size(topo.group)}
            if topo.is_source:
                engine = engines[topo.engine_index]
                out["mismatches"] = _mismatches(engine, weights)
                out["version"] = engine.get_weight_version()
            return out

        # phase 1: engines of 1 and 2 GPUs; rank 3 is covered by none
        facts["built1"] = connect_colocate_topology(topo, [1, 2])
        engines: list = [_native(1) if rank == 0 else None, _native(2) if rank == 1 else None]
        facts["p1"] = refit(engines, _weights(21), 7)
        first = topo.group
        facts["noop"] = connect_colocate_topology(topo, [1, 2], [0, 1]) is False and topo.group is first

        # phase 2: a recovered engine resized the topology to [2, 2]
        facts["built2"] = connect_colocate_topology(topo, [2, 2])
        try:
            if first is not None:
                dist.get_rank(first)  # a destroyed group is no longer registered: ValueError
            facts["old_group_alive"] = first is not None
        except (ValueError, RuntimeError):
            facts["old_group_alive"] = False
        engines = [_native(2) if rank == 0 else None, _native(2) if rank == 2 else None]
        facts["p2"] = refit(engines, _weights(22), 8)
        facts["builds"] = topo.builds

        # a bucket the engine refuses: every rank of its group raises, the weights stay
        try:
            send_hf_buckets_colocated(bucket_iterator=[[("nope", torch.zeros(3))]], rollout_engines=engines,
                                      topology=topo, weight_version=9)
            facts["refused"] = None
        except RuntimeError as exc:
            facts["refused"] = str(exc)
        if topo.is_source:
            facts["after_refusal"] = _mismatches(engines[topo.engine_index], _weights(22))

        # phase 3: same layout (no rebuild); one bucket of three dtypes: one engine call per dtype
        facts["built3"] = connect_colocate_topology(topo, [2, 2])
        mixed = _mixed_weights()
        infos = {n: (tuple(t.shape), t.dtype) for n, t in mixed.items()}
        engines = [NativeSGLangEngine([_MixedShard(infos), _MixedShard(infos)]) if topo.is_source else None] * 2
        calls = send_hf_buckets_colocated(bucket_iterator=[list(mixed.items())], rollout_engines=engines,
                                          topology=topo, weight_version=10)
        facts["p3"] = {"calls": calls}
        if topo.is_source:
            states = engines[0].state_dicts()
            facts["p3"]["exact"] = all(torch.equal(_bits(s[n]), _bits(t)) and s[n].dtype == t.dtype
                                       for s in states for n, t in mixed.items())
        disconnect_colocate_topology(topo)
        facts["disconnected"] = topo.group is None and topo.groups == [] and topo.layout_key is None
    except BaseException as exc:  # reported to the parent, then re-raised
        facts["error"] = repr(exc)
        raise
    finally:
        with open(f"{out_dir}/rank{rank}.json", "w") as f:
            json.dump(facts, f)
        dist.destroy_process_group()


def test_colocated_refit_is_bit_exact_and_rebuilds_on_a_layout_change(tmp_path):
    import torch.multiprocessing as mp

    held = RendezvousServer()
    try:
        mp.spawn(_colocated_rank, args=(held.port, str(tmp_path)), nprocs=WORLD)
    finally:
        held.close()
    facts = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    assert not [f["error"] for f in facts if "error" in f]
    # phase 1: [1, 2]
    p1 = [f["p1"] for f in facts]
    assert [(p["src"], p["engine"], p["group_size"]) for p in p1] == [(0, 0, 1), (1, 1, 2), (1, 1, 2),
                                                                      (None, None, None)]
    assert [p["calls"] for p in p1] == [p1[0]["calls"], p1[1]["calls"], 0, 0] and p1[0]["calls"] >= 2
    assert p1[0]["mismatches"] == [] and p1[1]["mismatches"] == []
    assert p1[0]["version"] == p1[1]["version"] == "7"
    assert all(f["built1"] and f["noop"] for f in facts)
    # phase 2: rebuilt as [2, 2]; the old subgroups are gone
    assert all(f["built2"] and f["builds"] == 2 and not f["old_group_alive"] for f in facts)
    p2 = [f["p2"] for f in facts]
    assert [(p["src"], p["engine"], p["group_size"]) for p in p2] == [(0, 0, 2), (0, 0, 2), (2, 1, 2), (2, 1, 2)]
    assert p2[0]["mismatches"] == [] and p2[2]["mismatches"] == [] and p2[0]["version"] == p2[2]["version"] == "8"
    # the refused bucket raised on every rank and changed nothing
    assert all(f["refused"] and "no parameter named 'nope'" in f["refused"] for f in facts)
    assert facts[0]["after_refusal"] == [] and facts[2]["after_refusal"] == []
    # phase 3: no rebuild; three dtypes -> three calls on each source, bit-exact
    assert [f["built3"] for f in facts] == [False] * WORLD
    assert [f["p3"]["calls"] for f in facts] == [3, 0, 3, 0]
    assert facts[0]["p3"]["exact"] and facts[2]["p3"]["exact"]
    assert all(f["disconnected"] for f in facts)


def test_separate_refit_from_trainer_rank0_is_bit_exact_and_torn_down_on_both_sides():
    held = RendezvousServer()
    engines = [_native(1), _native(2)]
    lock = threading.Lock()
    try:
        with ThreadPoolExecutor(max_workers=4) as pool:
            group = connect_rollout_engines_from_distributed(
                group_name="wu-1", rollout_engines=engines, engine_gpu_counts=[1, 2],
                master_address=held.host, master_port=held.port, executor=pool, timeout_s=60.0)
            assert group.rank == 0 and group.world_size == 4
            assert [e.weight_update_groups() for e in engines] == [["wu-1"], ["wu-1"]]
            assert [[g.rank for g in e._groups["wu-1"]] for e in engines] == [[1], [2, 3]]
            new = _weights(31)
            sent = broadcast_hf_buckets_via_distributed(
                bucket_iterator=iter_named_tensor_buckets(new.items(), BUFFER), rollout_engines=engines,
                rollout_engine_lock=lock, group_name="wu-1", model_update_group=group, weight_version=5,
                executor=pool)
            assert sent >= 2
            assert [_mismatches(e, new) for e in engines] == [[], []]
            assert [e.get_weight_version() for e in engines] == ["5", "5"]
            # a bucket an engine refuses: received, refused, nothing loaded, the trainer raises naming them
            with pytest.raises(RuntimeError, match=r"engine 0: .*no parameter named 'nope'.*engine 1: "):
                broadcast_hf_buckets_via_distributed(
                    bucket_iterator=[[("nope", torch.ones(4))]], rollout_engines=engines,
                    rollout_engine_lock=lock, group_name="wu-1", model_update_group=group, weight_version=6,
                    executor=pool)
            assert [_mismatches(e, new) for e in engines] == [[], []]
            assert [e.get_weight_version() for e in engines] == ["5", "5"]
            disconnect_rollout_engines_from_distributed(group_name="wu-1", model_update_group=group,
                                                        rollout_engines=engines)
            assert group.closed and [e.weight_update_groups() for e in engines] == [[], []]
            with pytest.raises(RuntimeError, match="the side group is closed"):
                group.broadcast(torch.zeros(1), 0)
            # the same name can be set up again after the teardown (a new session: a new store)
            again = RendezvousServer()
            try:
                group = connect_rollout_engines_from_distributed(
                    group_name="wu-1", rollout_engines=engines, engine_gpu_counts=[1, 2],
                    master_address=again.host, master_port=again.port, executor=pool, timeout_s=60.0)
                assert [e.weight_update_groups() for e in engines] == [["wu-1"], ["wu-1"]]
                disconnect_rollout_engines_from_distributed(group_name="wu-1", model_update_group=group,
                                                            rollout_engines=engines)
            finally:
                again.close()
    finally:
        held.close()
