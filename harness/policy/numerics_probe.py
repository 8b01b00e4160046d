"""The numerics probe: bit-exact digests of one policy rank's module outputs, the gradients
arriving at them and its parameters, written as the rank's numerics artifact.

Contract (docs/locator.md):

* a digest is ``sha256`` of the tensor's bytes in memory order (contiguous, its own dtype),
  never a norm: two digests are equal exactly when the tensors are bitwise equal;
  a tuple output (the router's weights and indices) is digested element by element;
* per train step ``N`` (1-based, this rank's count of ``train`` / split steps) the probe
  records, keyed ``stepNNNN/<phase>/mbMMM/<module>#<call>``:
  ``forward``: the output of every tapped module call (``harness.taps``) of microbatch M
  (a microbatch is one call of the stage model), ``call`` counting calls of one module name
  inside the microbatch; ``backward``: the gradient arriving at that output (a tensor hook,
  so no operator is added); ``param``: every parameter of the rank after the optimizer step
  (microbatch 0, call 0); step 0 holds the parameters before the first step;
* each record keeps ``seq`` (the order this rank produced it within its step), ``shape``,
  ``dtype`` and for forward records ``inputs`` (the tapped modules whose outputs it took);
* sharded tensors are digested per shard: the artifact names the rank, whose coordinates
  (tp, pp, cp, ep, dp) name the piece.

The probe changes no arithmetic: it reads data pointers (CPU) or copies to the host (cuda)
outside autograd. Off the train step (logprobs, rollouts) nothing is recorded.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness import taps

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _cpu_buffer(t: torch.Tensor) -> Any:
    """The bytes of CPU tensor ``t`` in memory order as a buffer (no copy when contiguous), read
    through its data pointer and strides: no torch operator is dispatched (the operators
    surface sees none)."""
    n, size = t.numel(), t.element_size()
    if n == 0:
        return b""
    if t.is_contiguous():
        return (ctypes.c_char * (n * size)).from_address(t.data_ptr())
    span = 1 + sum((d - 1) * st for d, st in zip(t.shape, t.stride()) if d > 0)
    raw = np.frombuffer((ctypes.c_char * (span * size)).from_address(t.data_ptr()), dtype=_UINT[size], count=span)
    view = np.lib.stride_tricks.as_strided(raw, shape=tuple(t.shape), strides=tuple(st * size for st in t.stride()))
    return np.ascontiguousarray(view).data


def digest(t: torch.Tensor) -> str:
    """sha256 of ``t``'s bytes (memory order, its own dtype). On the CPU no operator is
    dispatched; elsewhere the tensor is copied to the host first (one copy operator)."""
    if t.device.type != "cpu" or t.element_size() not in _UINT:
        with torch.no_grad():
            t = t.detach().to("cpu").contiguous()
    return hashlib.sha256(_cpu_buffer(t)).hexdigest()


def _tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for t in out if isinstance(t, torch.Tensor)]
    return []


def _digest_all(ts: list[torch.Tensor]) -> str:
    if len(ts) == 1:
        return digest(ts[0])
    return hashlib.sha256("".join(digest(t) for t in ts).encode()).hexdigest()


class NumericsProbe:
    """Records one rank's digests; install with :meth:`install`, step with :meth:`begin_step`
    / :meth:`end_step`, write with :meth:`write`."""

    def __init__(self, depth: str, coords: dict[str, int], backend: str) -> None:
        if depth not in taps.DEPTHS:
            raise ValueError(f"numerics.depth must be one of {sorted(taps.DEPTHS)}, got {depth!r}")
        self.depth = depth
        self.level = taps.DEPTHS[depth]
        self.coords = dict(coords)
        self.backend = backend
        self.recording = False
        self.step = 0
        self.entries: dict[str, dict] = {}
        self._seq = 0
        self._mb = -1
        self._calls: dict[str, int] = {}
        # id(output tensor) -> (its module name, the tensor: kept alive so the id is not reused)
        self._producers: dict[int, tuple[str, torch.Tensor]] = {}

    # -- lifecycle ------------------------------------------------------------------

    def install(self) -> None:
        taps.install(self)

    def uninstall(self) -> None:
        if taps.active() is self:
            taps.install(None)

    def begin_step(self) -> None:
        self.step += 1
        self.recording = True
        self._seq = 0
        self._mb = -1

    def end_step(self, named: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Close the step: digest every parameter after the optimizer step; drop the step's
        references to module outputs."""
        self.recording = False
        self._producers = {}
        self.record_params(named)

    def record_params(self, named: Iterable[tuple[str, torch.Tensor]]) -> None:
        for name, p in named:
            self._put("param", 0, f"{name}#0", p, None)

    def begin_microbatch(self) -> None:
        """One call of the stage model: a new microbatch (forward order)."""
        if not self.recording:
            return
        self._mb += 1
        self._calls = {}
        self._producers = {}

    # -- taps -----------------------------------------------------------------------

    def _put(self, phase: str, mb: int, key: str, out: Any, inputs: list[str] | None) -> None:
        ts = _tensors(out)
        if not ts:
            return
        rec: dict[str, Any] = {"seq": self._seq, "sha256": _digest_all(ts),
                               "shape": [list(t.shape) for t in ts] if len(ts) > 1 else list(ts[0].shape),
                               "dtype": str(ts[0].dtype).removeprefix("torch.")}
        if inputs is not None:
            rec["inputs"] = inputs
        self._seq += 1
        self.entries[f"step{self.step:04d}/{phase}/mb{mb:03d}/{key}"] = rec

    def call(self, name: str, fn: Callable[..., Any], args: tuple) -> Any:
        if self._mb < 0:
            self._mb = 0
        mb = self._mb
        inputs = sorted({self._producers[id(a)][0] for a in args
                         if isinstance(a, torch.Tensor) and id(a) in self._producers})
        out = fn(*args)
        n = self._calls.get(name, 0)
        self._calls[name] = n + 1
        key = f"{name}#{n}"
        self._put("forward", mb, key, out, inputs)
        for i, t in enumerate(_tensors(out)):
            self._producers[id(t)] = (name, t)
            if t.requires_grad and torch.is_grad_enabled():
                suffix = key if i == 0 else f"{key}.out{i}"
                t.register_hook(self._grad_hook(mb, suffix, self.step))
        return out

    def _grad_hook(self, mb: int, key: str, step: int) -> Callable[[torch.Tensor], None]:
        def hook(grad: torch.Tensor) -> None:
            if self.step == step:
                self._put("backward", mb, key, grad, None)
        return hook

    # -- artifact -----------------------------------------------------------------------

    def document(self) -> dict:
        return {"backend": self.backend, "depth": self.depth, "coords": self.coords,
                "recorded": True, "entries": self.entries}

    def write(self, path: str | Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.document(), sort_keys=True))
        tmp.replace(path)


def not_recorded(path: str | Path, *, backend: str, coords: dict[str, int], reason: str) -> None:
    """Write the artifact of a rank that records no numerics, saying why (never an empty
    surface that would pass)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"backend": backend, "coords": dict(coords), "recorded": False,
                                "reason": reason, "entries": {}}, sort_keys=True))


class NumericsRecorder:
    """A policy worker's numerics: the probe (when its engine has taps) and the per-step
    artifacts ``artifacts/numerics/policy/rankNNNNN.stepNNNN.json`` (``harness.artifacts.layout``).

    ``spec``'s ``numerics.depth`` (absent: ``modules``) picks the depth; an engine without
    ``NUMERICS_TAPS`` (or depth ``off``) writes one artifact saying the surface is not
    recorded and why. Each step's file is written when the step finishes; an aborted
    step's digests are dropped. ``enabled`` False (a distillation teacher's ranks): nothing.
    """

    def __init__(self, spec: Any, engine: Any, rank: int, run_dir: str | Path, *, enabled: bool = True) -> None:
        from harness.artifacts import layout

        self.rank = rank
        self.run_dir = Path(run_dir)
        self.engine = engine
        self._path = lambda step: self.run_dir / layout.numerics_path("policy", rank, step)
        block = spec.to_dict().get("numerics") or {}
        device = spec.platform.device
        # absent: modules on the CPU; on cuda off (the host copies would add operators to a
        # golden stored without them), unless the spec asks for a depth
        depth = block.get("depth", "modules" if device == "cpu" else "off")
        backend = getattr(engine, "backend", "unknown")
        coords = dict(getattr(engine, "coords", {}) or {})
        self.probe: NumericsProbe | None = None
        if not enabled:
            return
        if depth == "off":
            not_recorded(self._path(0), backend=backend, coords=coords,
                         reason="numerics.depth is off" if "depth" in block else
                         f"numerics.depth absent on {device}: off there (set it to record)")
        elif not getattr(engine, "NUMERICS_TAPS", False):
            not_recorded(self._path(0), backend=backend, coords=coords,
                         reason=f"policy backend {backend} has no numerics taps (only native records this surface)")
        else:
            self.probe = NumericsProbe(depth, coords, backend)
            self.probe.install()

    def begin(self) -> None:
        p = self.probe
        if p is None:
            return
        done = getattr(self.engine, "steps_done", None)
        if isinstance(done, int):   # the engine's optimizer steps: a resumed run goes on counting
            p.step = done
        if p.step == 0:
            p.record_params(self.engine.named)   # step0000: the parameters as initialised
        p.begin_step()

    def finish(self) -> None:
        p = self.probe
        if p is None or not p.recording:
            return
        p.end_step(self.engine.named)
        p.write(self._path(p.step))
        p.entries = {}

    def abort(self) -> None:
        p = self.probe
        if p is None:
            return
        p.recording = False
        p.entries = {k: v for k, v in p.entries.items() if not k.startswith(f"step{p.step:04d}/")}
        p.step -= 1

    def close(self) -> None:
        if self.probe is not None:
            self.probe.uninstall()
