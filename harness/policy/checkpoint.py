"""Sharded, atomic policy checkpoints, shared by every policy backend.

Every rank writes ``rank{r:05d}.pt`` (model shards, optimizer, reference
weights, step count, RNG, coordinates) through a temp file + fsync + rename;
after a barrier rank 0 writes the ``COMPLETE.json`` marker (world size,
backend, layout). A checkpoint without the marker is incomplete and refused by
``load_checkpoint``, as are ones from another backend, world size or rank
layout. A backend provides ``backend``, ``rank``, ``spec``, ``coords``,
``named`` (name, parameter) pairs, ``optimizer``, ``reference_state`` and
``steps_done``; checkpointing with an open split step is refused.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import torch
import torch.distributed as dist

CHECKPOINT_MARKER = "COMPLETE.json"


class ShardedCheckpoint:
    def save_checkpoint(self, directory: str | os.PathLike) -> None:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        if self._split is not None:
            raise RuntimeError(f"policy rank {self.rank}: cannot checkpoint while a train step is open")
        state = {
            "backend": self.backend,
            "model": {n: p.detach().clone() for n, p in self.named},
            "optimizer": self.optimizer.state_dict(),
            "reference": self.reference_state,
            "steps_done": self.steps_done,
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
            "coords": dict(self.coords),
        }
        path = d / f"rank{self.rank:05d}.pt"
        tmp = d / f".rank{self.rank:05d}.pt.tmp"
        torch.save(state, tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        dist.barrier()
        if self.rank == 0:
            policy = self.spec.policy  # the plan's typed workload (EngineCommon._bind)
            marker = {"world": dist.get_world_size(), "backend": self.backend,
                      "policy": {k: getattr(policy, k) for k in ("tp", "pp", "cp", "dp", "ep", "etp")},
                      "steps_done": self.steps_done}
            tmp_m = d / (CHECKPOINT_MARKER + ".tmp")
            tmp_m.write_text(json.dumps(marker, sort_keys=True))
            os.replace(tmp_m, d / CHECKPOINT_MARKER)
        dist.barrier()

    def load_checkpoint(self, directory: str | os.PathLike) -> None:
        d = Path(directory)
        marker = d / CHECKPOINT_MARKER
        if not marker.exists():
            raise FileNotFoundError(f"{marker}: checkpoint is incomplete or missing (no completion marker)")
        meta = json.loads(marker.read_text())
        if meta.get("backend", "native") != self.backend:
            raise ValueError(
                f"{marker}: saved by the {meta.get('backend', 'native')} backend, this policy is {self.backend}"
            )
        if meta["world"] != dist.get_world_size():
            raise ValueError(
                f"{marker}: saved with world {meta['world']}, this policy has {dist.get_world_size()} ranks"
            )
        path = d / f"rank{self.rank:05d}.pt"
        state = torch.load(path, weights_only=False)
        if state["coords"] != dict(self.coords):
            raise ValueError(f"{path}: saved for coords {state['coords']}, this rank has {dict(self.coords)}")
        with torch.no_grad():
            for n, p in self.named:
                p.copy_(state["model"][n])
        self.optimizer.load_state_dict(state["optimizer"])
        self.reference_state = state["reference"]
        self.steps_done = state["steps_done"]
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        dist.barrier()
