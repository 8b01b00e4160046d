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
from concurrent.futures import ThreadPoolExecutor
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
    if not t.is_cpu or t.element_size() not in _UINT:
        with torch.no_grad():
            t = t.detach().to("cpu").contiguous()
    return hashlib.sha256(_cpu_buffer(t)).hexdigest()


# parameters are hashed on a few threads at the step's end (hashlib lets go of the GIL for
# buffers over 2 KiB): the same digests, in the same order, sooner
_POOL: ThreadPoolExecutor | None = None
_POOL_MIN_BYTES = 1 << 20


def digest_many(ts: list[torch.Tensor]) -> list[str]:
    """``[digest(t) for t in ts]``, on up to ``torch.get_num_threads()`` threads when there are
    enough bytes to be worth it."""
    global _POOL
    workers = min(8, torch.get_num_threads())
    if workers < 2 or sum(t.numel() * t.element_size() for t in ts) < _POOL_MIN_BYTES:
        return [digest(t) for t in ts]
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="numerics-digest")
    return list(_POOL.map(digest, ts))


def _tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for t in out if isinstance(t, torch.Tensor)]
    return []


def _combine(hexes: list[str]) -> str:
    """The digest of a tuple output: sha256 of its elements' digests."""
    return hexes[0] if len(hexes) == 1 else hashlib.sha256("".join(hexes).encode()).hexdigest()


_DTYPES: dict[torch.dtype, str] = {}


def _dtype(t: torch.Tensor) -> str:
    name = _DTYPES.get(t.dtype)
    if name is None:
        name = _DTYPES[t.dtype] = str(t.dtype).removeprefix("torch.")
    return name


class NumericsProbe:
    """Records one rank's digests; install with :meth:`install`, step with :meth:`begin_step`
    / :meth:`end_step`, write with :meth:`write`.

    Cheap per call: a tensor seen again unchanged (the same object, the same version counter:
    a block returning its last module's output) is hashed once; the gradient arriving at a
    tapped output is read by one pre-hook on its autograd node (``Node.register_prehook``,
    a C++ call: no operator, no extra reference to the gradient); the parameters are hashed
    on a few threads (:func:`digest_many`)."""

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
        self._bwd_mb = 0     # the microbatch whose backward ran last (its gradients' hooks)
        self._calls: dict[str, int] = {}
        self._collectives: dict[tuple[str, str], int] = {}
        # id(output tensor) -> (its module name, the tensor: kept alive so the id is not reused)
        self._producers: dict[int, tuple[str, torch.Tensor]] = {}
        # id(tensor) -> (tensor, version, digest): an unchanged tensor is hashed once
        self._known: dict[int, tuple[torch.Tensor, int, str]] = {}
        # id(tensor) -> (tensor, keys): one gradient hook per tapped output, however many names
        self._hooked: dict[int, tuple[torch.Tensor, list[str]]] = {}

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
        self._bwd_mb = 0
        self._collectives = {}

    def end_step(self, named: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Close the step: digest every parameter after the optimizer step; drop the step's
        references to module outputs."""
        self.recording = False
        self._forget()
        self.record_params(named)

    def record_params(self, named: Iterable[tuple[str, torch.Tensor]]) -> None:
        named = list(named)
        hexes = digest_many([p for _, p in named])
        for (name, p), h in zip(named, hexes):
            self._record(f"step{self.step:04d}/param/mb000/{name}#0", [h], [p], None)

    def begin_microbatch(self) -> None:
        """One call of the stage model: a new microbatch (forward order)."""
        if not self.recording:
            return
        self._mb += 1
        self._calls = {}
        self._forget()

    def _forget(self) -> None:
        self._producers = {}
        self._known = {}
        self._hooked = {}

    # -- taps -----------------------------------------------------------------------

    def _record(self, key: str, hexes: list[str], ts: list[torch.Tensor], inputs: list[str] | None) -> None:
        rec: dict[str, Any] = {"seq": self._seq, "sha256": _combine(hexes),
                               "shape": [list(t.shape) for t in ts] if len(ts) > 1 else list(ts[0].shape),
                               "dtype": _dtype(ts[0])}
        if inputs is not None:
            rec["inputs"] = inputs
        self._seq += 1
        self.entries[key] = rec

    def _digest_output(self, t: torch.Tensor) -> str:
        seen = self._known.get(id(t))
        version = t._version
        if seen is not None and seen[0] is t and seen[1] == version:
            return seen[2]
        h = digest(t)
        self._known[id(t)] = (t, version, h)
        return h

    def call(self, name: str, fn: Callable[..., Any], args: tuple) -> Any:
        if self._mb < 0:
            self._mb = 0
        mb = self._mb
        producers = self._producers
        # a live argument's id is in producers only if it is that very tensor (kept alive there)
        inputs = sorted({producers[id(a)][0] for a in args if id(a) in producers})
        out = fn(*args)
        n = self._calls.get(name, 0)
        self._calls[name] = n + 1
        key = f"{name}#{n}"
        ts = _tensors(out)
        if not ts:
            return out
        self._record(f"step{self.step:04d}/forward/mb{mb:03d}/{key}", [self._digest_output(t) for t in ts], ts, inputs)
        grad = torch.is_grad_enabled()
        for i, t in enumerate(ts):
            producers[id(t)] = (name, t)
            if grad and t.requires_grad:
                self._hook(t, mb, key if i == 0 else f"{key}.out{i}")
        return out

    def _hook(self, t: torch.Tensor, mb: int, key: str) -> None:
        """Digest the gradient arriving at ``t`` under ``key`` (and any later name of ``t``)."""
        seen = self._hooked.get(id(t))
        if seen is not None and seen[0] is t:
            seen[1].append(key)
            return
        keys = [key]
        self._hooked[id(t)] = (t, keys)
        step, node = self.step, t.grad_fn
        if node is None:   # a leaf that requires grad
            t.register_hook(lambda g: self._on_grad(step, mb, keys, g))
        else:              # the node's grad_outputs[output_nr] is the gradient arriving at t
            nr = t.output_nr
            node.register_prehook(lambda grads: self._on_grad(step, mb, keys, grads[nr]))

    def _on_grad(self, step: int, mb: int, keys: list[str], g: torch.Tensor | None) -> None:
        if self.step != step or g is None:
            return
        self._bwd_mb = mb
        h = digest(g)
        for key in keys:
            self._record(f"step{step:04d}/backward/mb{mb:03d}/{key}", [h], [g], None)

    def collective(self, op: str, group: str, out: Any, phase: str | None, mb: int | None) -> None:
        """A collective's result after its wait, keyed ``collective.<op>.<group>#<call>`` (call:
        this step's count of that op and group in that phase). ``phase`` None: backward inside
        the autograd engine, forward outside; ``mb`` None: the microbatch running (forward) or
        the one whose backward ran last."""
        if not self.recording:
            return
        ts = _tensors(out)
        if not ts:
            return
        if phase is None:
            phase = "backward" if torch._C._current_graph_task_id() != -1 else "forward"
        if mb is None:
            mb = max(self._mb, 0) if phase == "forward" else self._bwd_mb
        name = f"collective.{op}.{group}"
        n = self._collectives.get((phase, name), 0)
        self._collectives[(phase, name)] = n + 1
        self._record(f"step{self.step:04d}/{phase}/mb{mb:03d}/{name}#{n}", [digest(t) for t in ts], ts, None)

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
    recorded and why. ``numerics.steps`` picks the steps: ``first_last`` (absent) the run's
    first step and its last (``grpo.iterations``) and any after it, ``all`` every step; the
    parameters as initialised (step 0) are always recorded. Each recorded step's file is
    written when the step finishes; an aborted step's digests are dropped. ``enabled``
    False (a distillation teacher's ranks): nothing.
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
        self.every_step = block.get("steps", "first_last") == "all"
        grpo = spec.to_dict().get("grpo") or {}
        self.last_step = int(grpo.get("iterations") or 1)
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
        p.recording = self.records(p.step)

    def records(self, step: int) -> bool:
        """Whether train step ``step`` (1-based, the engine's count) is digested."""
        return self.every_step or step == 1 or step >= self.last_step

    def finish(self) -> None:
        p = self.probe
        if p is None or not p.recording:
            return
        p.end_step(self.engine.named)
        p.write(self._path(p.step))
        p.entries = {}

    def abort(self) -> None:
        p = self.probe
        if p is None or p.step == 0:
            return
        p.recording = False
        p.entries = {k: v for k, v in p.entries.items() if not k.startswith(f"step{p.step:04d}/")}
        p.step -= 1

    def close(self) -> None:
        if self.probe is not None:
            self.probe.uninstall()
