"""SGLang's weight-update API, served by the native rollout engine.

:class:`SGLangWeightAPI` names the calls a trainer makes on an SGLang engine
to refit it, with SGLang's names, arguments and result convention: every call
returns ``(success, message)`` and reports a refused or failed update there
instead of raising.

* ``update_weights_from_tensor(named_tensors, load_format, flush_cache,
  weight_version)``: the colocated path. With ``load_format=
  "flattened_bucket"`` ``named_tensors`` holds one flattened one-dtype bucket
  payload per engine TP rank (``harness.refit.flat_bucket``), else a plain
  ``[(name, tensor), ...]`` list every TP rank loads.
* ``init_weights_update_group(master_address, master_port, rank_offset,
  world_size, group_name, backend)``: join a weight-update group in which the
  trainer is rank 0 and this engine's TP rank ``i`` is ``rank_offset + i``.
* ``update_weights_from_distributed(names, dtypes, shapes, group_name,
  flush_cache, weight_version)``: receive one broadcast per tensor from rank 0
  of that group, in ``names`` order, then load them.
* ``destroy_weights_update_group(group_name)``: leave and close it.
* ``get_weight_version()``: the version the last update set (a string, as
  SGLang reports it).

:class:`NativeSGLangEngine` implements it over native engines (one object
per TP rank, ``harness.rollout.native.engine.Engine`` or anything exposing its
``load_weights`` / ``state_dict_info`` / ``weight_version``): every load goes
through the engine's own ``load_weights``, which checks names, shapes and
dtypes and copies exactly, so a refit through this API is bit-exact. An
update is checked against ``state_dict_info`` of every TP rank before any
tensor loads, so a refused update leaves the weights as they were.
``flush_cache`` is accepted for SGLang compatibility; the native engine keeps
no prefix cache across ``generate`` calls, so there is nothing to flush.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import torch

from harness.refit.flat_bucket import LOAD_FORMAT, dtype_from_str, reconstruct

Result = tuple[bool, str]
DEFAULT_GROUP = "weight_update_group"


class SGLangWeightAPI(Protocol):
    """What an SGLang-compatible engine offers a refit (names and semantics as SGLang's)."""

    def update_weights_from_tensor(self, named_tensors: Sequence[Any], load_format: str | None = None,
                                   flush_cache: bool = True, weight_version: str | int | None = None) -> Result: ...

    def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                                  group_name: str = DEFAULT_GROUP, backend: str = "nccl") -> Result: ...

    def update_weights_from_distributed(self, names: Sequence[str], dtypes: Sequence[str],
                                        shapes: Sequence[Sequence[int]], group_name: str = DEFAULT_GROUP,
                                        flush_cache: bool = True,
                                        weight_version: str | int | None = None) -> Result: ...

    def destroy_weights_update_group(self, group_name: str = DEFAULT_GROUP) -> Result: ...

    def get_weight_version(self) -> str: ...


def _in_threads(fns: Sequence[Callable[[], Any]]) -> list[Any]:
    """Run one function per TP rank concurrently (a group's members must join and receive together)."""
    if len(fns) == 1:
        return [fns[0]()]
    results: list[Any] = [None] * len(fns)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            results[i] = fns[i]()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def _check_against(shard: Any, tensors: Sequence[tuple[str, torch.Tensor]]) -> None:
    """Refuse the whole update before anything loads: names, shapes, dtypes as the engine expects."""
    info = shard.state_dict_info()
    for name, tensor in tensors:
        if name not in info:
            raise ValueError(f"engine has no parameter named {name!r}")
        shape, dtype = info[name]
        if tuple(tensor.shape) != tuple(shape) or tensor.dtype != dtype:
            raise ValueError(f"{name}: {tuple(tensor.shape)} {tensor.dtype}, engine expects {tuple(shape)} {dtype}")


def _version(weight_version: str | int | None) -> int | None:
    if weight_version is None:
        return None
    try:
        return int(str(weight_version))
    except ValueError:
        raise ValueError(f"weight_version must be an integer (or its string), got {weight_version!r}") from None


class NativeSGLangEngine:
    """SGLang's weight-update calls over native engine shards (``shards[i]`` is TP rank ``i``)."""

    def __init__(self, shards: Sequence[Any], *, timeout_s: float = 120.0) -> None:
        if not shards:
            raise ValueError("NativeSGLangEngine needs at least one engine shard")
        self.shards = list(shards)
        self.timeout_s = timeout_s
        self._groups: dict[str, list[Any]] = {}  # group_name -> one SideGroup per TP rank

    @property
    def tp_size(self) -> int:
        return len(self.shards)

    # -- colocated -----------------------------------------------------------------
    def update_weights_from_tensor(self, named_tensors: Sequence[Any], load_format: str | None = None,
                                   flush_cache: bool = True, weight_version: str | int | None = None) -> Result:
        try:
            version = _version(weight_version)
            if load_format == LOAD_FORMAT:
                if len(named_tensors) != self.tp_size:
                    raise ValueError(f"{len(named_tensors)} flattened bucket(s) for an engine of "
                                     f"{self.tp_size} TP rank(s): one per TP rank")
                per_rank = [reconstruct(p) for p in named_tensors]
            elif load_format is None:
                per_rank = [list(named_tensors)] * self.tp_size
            else:
                raise ValueError(f"load_format {load_format!r} is not supported (None or {LOAD_FORMAT!r})")
            names = [[n for n, _ in tensors] for tensors in per_rank]
            if any(n != names[0] for n in names):
                raise ValueError("the TP ranks' buckets name different tensors")
            self._load_all_or_none(per_rank, version)
        except (ValueError, TypeError) as exc:
            return False, f"update_weights_from_tensor failed: {exc}"
        return True, f"loaded {len(names[0])} tensor(s)"

    # -- separate (weight-update group) --------------------------------------------------
    def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                                  group_name: str = DEFAULT_GROUP, backend: str = "nccl") -> Result:
        from harness.refit.broadcast import create_side_group

        if group_name in self._groups:
            return False, f"weight update group {group_name!r} already exists"
        try:
            groups = _in_threads([
                (lambda i=i: create_side_group(host=master_address, port=master_port, rank=rank_offset + i,
                                               world_size=world_size, timeout_s=self.timeout_s, backend=backend,
                                               prefix=group_name))
                for i in range(self.tp_size)
            ])
        except (ValueError, TypeError, RuntimeError) as exc:
            return False, f"init_weights_update_group {group_name!r} failed: {exc}"
        self._groups[group_name] = groups
        return True, f"joined {group_name!r} as ranks {rank_offset}..{rank_offset + self.tp_size - 1} of {world_size}"

    def update_weights_from_distributed(self, names: Sequence[str], dtypes: Sequence[str],
                                        shapes: Sequence[Sequence[int]], group_name: str = DEFAULT_GROUP,
                                        flush_cache: bool = True,
                                        weight_version: str | int | None = None) -> Result:
        groups = self._groups.get(group_name)
        if groups is None:
            return False, f"no weight update group named {group_name!r}"
        if not len(names) == len(dtypes) == len(shapes):
            return False, f"names, dtypes, shapes differ in length: {len(names)}, {len(dtypes)}, {len(shapes)}"
        try:
            version = _version(weight_version)
            specs = [(n, tuple(int(d) for d in s), dtype_from_str(t)) for n, t, s in zip(names, dtypes, shapes)]
        except ValueError as exc:
            return False, f"update_weights_from_distributed failed: {exc}"

        def receive(group: Any) -> list[tuple[str, torch.Tensor]]:
            out = []
            for name, shape, dtype in specs:  # every broadcast is received, whatever the load says later
                tensor = torch.empty(shape, dtype=dtype, device=group.device)
                group.broadcast(tensor, 0)
                out.append((name, tensor))
            return out

        received = _in_threads([lambda g=g: receive(g) for g in groups])
        try:
            self._load_all_or_none(received, version)
        except (ValueError, TypeError) as exc:
            return False, f"update_weights_from_distributed failed: {exc}"
        return True, f"loaded {len(specs)} tensor(s) from {group_name!r}"

    def destroy_weights_update_group(self, group_name: str = DEFAULT_GROUP) -> Result:
        groups = self._groups.pop(group_name, None)
        if groups is None:
            return False, f"no weight update group named {group_name!r}"
        for group in groups:
            group.close()
        return True, f"destroyed {group_name!r}"

    def weight_update_groups(self) -> list[str]:
        """The names of the weight-update groups this engine holds."""
        return sorted(self._groups)

    def _load_all_or_none(self, per_rank: Sequence[Sequence[tuple[str, torch.Tensor]]], version: int | None) -> None:
        """Check every TP rank's tensors before any loads (a refused update changes nothing),
        then load them and set the weight version."""
        for shard, tensors in zip(self.shards, per_rank):
            _check_against(shard, tensors)
        for shard, tensors in zip(self.shards, per_rank):
            shard.load_weights(tensors)
        self._set_version(version)

    # -- versions --------------------------------------------------------------------------
    def get_weight_version(self) -> str:
        return str(self.shards[0].weight_version)

    def _set_version(self, version: int | None) -> None:
        for shard in self.shards:
            shard.weight_version = shard.weight_version + 1 if version is None else version

    def state_dicts(self) -> list[Mapping[str, torch.Tensor]]:
        """Each TP rank's shards under HF names (tests compare them with the trainer's weights)."""
        return [shard.state_dict() for shard in self.shards]
