"""The two SGLang refit paths: colocated gather and a separate weight-update group.

Both send finalized HF-named tensor buckets (``iter_named_tensor_buckets``) to
engines speaking :class:`harness.rollout.sglang_api.SGLangWeightAPI`, pass a
``weight_version`` along, and validate every engine result with
:func:`check_weight_sync_results` (a refused update raises RuntimeError
naming the engine and its message).

**Colocated** (:func:`send_hf_buckets_colocated`, every trainer rank enters,
after :func:`harness.refit.colocate.connect_colocate_topology`). Per bucket:
split by dtype, one :class:`FlattenedBucket` per dtype, ``gather_object`` of
each rank's payload to the gather source over the engine's colocate subgroup,
one ``update_weights_from_tensor`` per dtype on the source (the payloads in
subgroup rank order are the engine's TP ranks' inputs), validation there, then
the source's verdict is broadcast over the subgroup, so every rank of the
engine's range leaves the bucket together and raises on a failure too; the
bucket's payload references are dropped before the next bucket. Placeholder
ranks return at once and never call a collective.

**Separate** (trainer rank 0 only). :func:`connect_rollout_engines_from_distributed`
builds a side group (not the default world: ``harness.refit.broadcast``) of
``1 + sum(engine_gpu_counts)`` members: the trainer is rank 0 and engine ``i``'s
TP rank ``j`` is ``1 + offsets[i] + j``. :func:`broadcast_hf_buckets_via_distributed`
sends, per bucket and under the engines' lock, the tensors' metadata to every
engine (``update_weights_from_distributed``, issued through ``executor`` so
the engines receive while rank 0 broadcasts; Ray's ``.remote`` plays this part
with actors), one broadcast per tensor, then waits for and validates the
engines' results. :func:`disconnect_rollout_engines_from_distributed` tears
the group down on the engines and on the trainer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor
from typing import Any

import torch

from harness.refit.colocate import ColocateTopology
from harness.refit.engine_offsets import derive_engine_gpu_offsets
from harness.refit.flat_bucket import LOAD_FORMAT, FlattenedBucket, group_by_dtype

Bucket = list[tuple[str, torch.Tensor]]


def check_weight_sync_results(results: Sequence[Any], *, what: str = "weight update") -> None:
    """Every result must be SGLang's ``(True, message)``; RuntimeError names each failing engine."""
    problems = []
    for i, result in enumerate(results):
        if isinstance(result, dict):
            result = (result.get("success"), result.get("message", ""))
        if not (isinstance(result, (tuple, list)) and len(result) == 2 and isinstance(result[0], bool)):
            problems.append(f"engine {i}: malformed result {result!r} (want (success, message))")
        elif not result[0]:
            problems.append(f"engine {i}: {result[1]}")
    if problems:
        raise RuntimeError(f"{what} failed: " + "; ".join(problems))


def _default_gather(obj: Any, gathered: list[Any] | None, dst: int, group: Any) -> None:
    import torch.distributed as dist

    dist.gather_object(obj, gathered, dst=dst, group=group)


def _default_broadcast(objs: list[Any], src: int, group: Any) -> None:
    import torch.distributed as dist

    dist.broadcast_object_list(objs, src=src, group=group)


def send_hf_buckets_colocated(
    *,
    bucket_iterator: Iterable[Bucket],
    rollout_engines: Sequence[Any],
    topology: ColocateTopology,
    weight_version: str | int | None = None,
    group_size: int | None = None,
    gather_object: Callable[[Any, list[Any] | None, int, Any], None] = _default_gather,
    broadcast_object_list: Callable[[list[Any], int, Any], None] = _default_broadcast,
) -> int:
    """Send every bucket to this rank's colocated engine; the number of engine calls made (source only).

    Collective over each engine's colocate subgroup: all its ranks must pass
    the same buckets (names, dtypes and order). ``group_size`` defaults to the
    subgroup's size. Raises RuntimeError on every rank of the subgroup when the
    engine refuses a chunk.
    """
    if topology.group is None:  # a placeholder: no engine, no collective
        return 0
    if group_size is None:
        import torch.distributed as dist

        group_size = dist.get_world_size(topology.group)
    src = topology.src
    assert src is not None and topology.engine_index is not None
    calls = 0
    for bucket in bucket_iterator:
        for dtype, named in group_by_dtype(bucket):
            flat = FlattenedBucket(named)
            payload: Any = flat.payload()
            gathered: list[Any] | None = [None] * group_size if topology.is_source else None
            gather_object(payload, gathered, src, topology.group)
            verdict: list[Any] = [None]
            if topology.is_source:
                engine = rollout_engines[topology.engine_index]  # resolved now: a recovered engine is picked up
                result = engine.update_weights_from_tensor(
                    gathered, load_format=LOAD_FORMAT, flush_cache=False, weight_version=weight_version)
                calls += 1
                try:
                    check_weight_sync_results([result], what=f"colocated refit ({dtype}, {len(named)} tensor(s))")
                    verdict = [None]
                except RuntimeError as exc:
                    verdict = [str(exc)]
            broadcast_object_list(verdict, src, topology.group)
            del flat, payload, gathered  # the bucket's references go before the next bucket
            if verdict[0] is not None:
                raise RuntimeError(f"rank {topology.rank}: {verdict[0]}")
    return calls


def connect_rollout_engines_from_distributed(
    *,
    group_name: str,
    rollout_engines: Sequence[Any],
    engine_gpu_counts: Sequence[int],
    master_address: str,
    master_port: int,
    executor: Executor,
    backend: str = "gloo",
    timeout_s: float = 120.0,
) -> Any:
    """Trainer rank 0: build the weight-update group with the engines; returns the trainer's member.

    The store at ``master_address:master_port`` must already be served (a
    :class:`harness.parallel.rendezvous.RendezvousServer`). On any engine's refusal the
    trainer's member is closed, the engines that joined leave, and RuntimeError
    is raised.
    """
    from harness.refit.broadcast import create_side_group

    if len(engine_gpu_counts) != len(rollout_engines):
        raise ValueError(f"{len(engine_gpu_counts)} engine_gpu_counts for {len(rollout_engines)} engine(s)")
    offsets = derive_engine_gpu_offsets(engine_gpu_counts)
    world = 1 + sum(int(c) for c in engine_gpu_counts)
    futures = [
        executor.submit(engine.init_weights_update_group, master_address=master_address, master_port=master_port,
                        rank_offset=1 + offset, world_size=world, group_name=group_name, backend=backend)
        for engine, offset in zip(rollout_engines, offsets)
    ]
    group = None
    try:
        group = create_side_group(host=master_address, port=master_port, rank=0, world_size=world,
                                  timeout_s=timeout_s, backend=backend, prefix=group_name)
    finally:
        results = [f.result() for f in futures]
    try:
        check_weight_sync_results(results, what=f"init_weights_update_group {group_name!r}")
    except RuntimeError:
        group.close()
        for engine, result in zip(rollout_engines, results):
            if isinstance(result, (tuple, list)) and result and result[0] is True:
                engine.destroy_weights_update_group(group_name)
        raise
    return group


def broadcast_hf_buckets_via_distributed(
    *,
    bucket_iterator: Iterable[Bucket],
    rollout_engines: Sequence[Any],
    rollout_engine_lock: Any,
    group_name: str,
    model_update_group: Any,
    weight_version: str | int | None,
    executor: Executor,
) -> int:
    """Trainer rank 0: broadcast every bucket to every engine; returns the number of buckets sent."""
    sent = 0
    lock = rollout_engine_lock if rollout_engine_lock is not None else contextlib.nullcontext()
    for bucket in bucket_iterator:
        names = [n for n, _ in bucket]
        dtypes = [str(t.dtype).removeprefix("torch.") for _, t in bucket]
        shapes = [list(t.shape) for _, t in bucket]
        with lock:
            futures = [
                executor.submit(engine.update_weights_from_distributed, names=names, dtypes=dtypes, shapes=shapes,
                                group_name=group_name, flush_cache=False, weight_version=weight_version)
                for engine in rollout_engines
            ]
            for _, tensor in bucket:
                model_update_group.broadcast(tensor.detach().contiguous(), 0)
            results = [f.result() for f in futures]
        check_weight_sync_results(results, what=f"update_weights_from_distributed ({len(bucket)} tensor(s))")
        sent += 1
    return sent


def disconnect_rollout_engines_from_distributed(
    *, group_name: str, model_update_group: Any, rollout_engines: Sequence[Any]
) -> None:
    """Close the trainer's member and make every engine destroy its side; engine failures raise after both."""
    results = [engine.destroy_weights_update_group(group_name) for engine in rollout_engines]
    model_update_group.close()
    check_weight_sync_results(results, what=f"destroy_weights_update_group {group_name!r}")
