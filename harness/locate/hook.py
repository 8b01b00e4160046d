"""Op-level hashing inside one module call, loaded into every process of a ``golden locate`` replay.

This file is executed by path (``sitecustomize`` of the replay, ``GOLDEN_LOCATE_HOOK``), in a
tree that may be another commit's: it imports only the standard library, numpy, torch and that
tree's ``harness.taps``. ``activate()`` wraps ``harness.taps.call``; the plan
(``GOLDEN_LOCATE_PLAN``, JSON) names the rank (its coordinates), the step, the microbatch, the
phase and the targets ``(module, call)``:

* ``forward``: the target call runs under a ``TorchDispatchMode`` that writes one record per
  aten op dispatched inside it: the op, the digests of its tensor inputs and outputs, its
  non-tensor arguments and the Python stack (the frames of the tree);
* ``backward``: the target call's forward is watched to learn the autograd nodes it creates
  (their sequence numbers lie between two marker nodes made just before and after it) and the
  stack of the op that created each; a mode then stays on the thread's dispatch stack, so the
  autograd engine carries it into backward, and writes a record for each op run while the
  current autograd node is one of those (with the forward stack of the node).

Collectives (``c10d::``) are passed through undigested (their output may still be in flight).
A digest is sha256 of the tensor's bytes in memory order (read through its data pointer, so
no operator is dispatched), prefixed by dtype and shape. Records are JSON lines appended to
``plan["out"]`` and flushed one by one; the first line of each target call is a header with the
numerics probe's digest of its output, so the caller can check that the replay reproduced the
run. The probe's own bookkeeping (step, microbatch, call counts) places the call, so a target
is found exactly where the numerics surface keyed it.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import sys
import traceback
from typing import Any

PLAN_VAR = "GOLDEN_LOCATE_PLAN"
HOOK_VAR = "GOLDEN_LOCATE_HOOK"

_UINT = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}


def _digest(t: Any) -> str:
    import numpy as np
    import torch

    if t.device.type != "cpu" or t.element_size() not in _UINT or t.layout != torch.strided:
        t = t.detach().to("cpu").contiguous()
    n, size = t.numel(), t.element_size()
    if n == 0:
        raw: Any = b""
    elif t.is_contiguous():
        raw = (ctypes.c_char * (n * size)).from_address(t.data_ptr())
    else:
        span = 1 + sum((d - 1) * st for d, st in zip(t.shape, t.stride()) if d > 0)
        flat = np.frombuffer((ctypes.c_char * (span * size)).from_address(t.data_ptr()),
                             dtype=_UINT[size], count=span)
        view = np.lib.stride_tricks.as_strided(flat, shape=tuple(t.shape),
                                               strides=tuple(st * size for st in t.stride()))
        raw = np.ascontiguousarray(view).data
    dtype = str(t.dtype).removeprefix("torch.")
    return f"{dtype}{list(t.shape)}:{hashlib.sha256(raw).hexdigest()[:32]}"


def _split(tree: Any) -> tuple[list[Any], list[str]]:
    """Tensors of a (nested) argument structure, and the repr of everything else."""
    import torch
    from torch.utils._pytree import tree_flatten

    leaves, _ = tree_flatten(tree)
    tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
    other = [_short(x) for x in leaves if not isinstance(x, torch.Tensor)]
    return tensors, other


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 60 else text[:57] + "..."


def _op_name(func: Any) -> str:
    schema = getattr(func, "_schema", None)
    if schema is None:
        return str(func)
    return schema.name + (f".{schema.overload_name}" if schema.overload_name else "")


class _Recorder:
    """The dispatch modes' shared state: the tree's frames, the output file."""

    def __init__(self, plan: dict) -> None:
        self.root = os.path.realpath(plan["root"]) + os.sep
        self.out = plan["out"]
        self.skip = {os.path.realpath(__file__)}
        # an interpreter or virtual environment inside the tree (ci/bootstrap.sh makes .venv there)
        # holds installed packages (torch), not files of the tree
        self.installed = tuple({os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix)})
        self.count = 0

    def stack(self) -> list[str]:
        frames = []
        for fr in traceback.extract_stack()[:-2]:
            if fr.filename.startswith("<"):   # <frozen runpy>, <string>: no file of the tree
                continue
            path = os.path.realpath(fr.filename)
            if not path.startswith(self.root) or path in self.skip or path.startswith(self.installed) \
                    or f"{os.sep}site-packages{os.sep}" in path:
                continue
            rel = path[len(self.root):]
            if rel in ("harness/taps.py", "harness/policy/numerics_probe.py"):
                continue
            frames.append(f"{rel}:{fr.lineno} in {fr.name}: {(fr.line or '').strip()}")
        return frames

    def write(self, record: dict) -> None:
        with open(self.out, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, sort_keys=True) + "\n")


def _modes(rec: _Recorder):
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Forward(TorchDispatchMode):
        """Every op inside the target call; ``outputs`` keeps (tensor, stack) for the node map."""

        def __init__(self, target: str, write: bool, phase: str = "forward", sink: Any = None) -> None:
            super().__init__()
            self.target, self.write, self.outputs, self.i = target, write, [], 0
            self.phase, self.sink = phase, sink if sink is not None else rec.write

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if _collective(func):
                return func(*args, **kwargs)
            tin, other = _split((args, kwargs))
            ins = [_digest(t) for t in tin]
            out = func(*args, **kwargs)
            tout, _ = _split(out)
            stack = rec.stack()
            self.outputs.extend((t, stack) for t in tout)
            if self.write:
                self.sink({"kind": "op", "phase": self.phase, "target": self.target, "i": self.i,
                           "op": _op_name(func), "in": ins, "args": other,
                           "out": [_digest(t) for t in tout], "stack": stack})
            self.i += 1
            return out

    class Backward(TorchDispatchMode):
        """Ops run for an autograd node of a target's forward (sequence number in a range)."""

        def __init__(self) -> None:
            super().__init__()
            self.ranges: list[tuple[int, int, str, dict]] = []
            self.i = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            node = torch._C._current_autograd_node()
            hit = None
            if node is not None:
                seq = node._sequence_nr()
                hit = next((r for r in self.ranges if r[0] < seq < r[1]), None)
            if hit is None or _collective(func):
                return func(*args, **kwargs)
            tin, other = _split((args, kwargs))
            ins = [_digest(t) for t in tin]
            out = func(*args, **kwargs)
            tout, _ = _split(out)
            rec.write({"kind": "op", "phase": "backward", "target": hit[2], "i": self.i, "op": _op_name(func),
                       "in": ins, "args": other, "out": [_digest(t) for t in tout], "node": node.name(),
                       "stack": rec.stack(), "forward_stack": hit[3].get(seq, [])})
            self.i += 1
            return out

    return Forward, Backward


def _collective(func: Any) -> bool:
    """A c10d op: its output may still be in flight when it returns (it is read after the
    wait), so it is not digested; the ops that consume the gathered values record them."""
    return _op_name(func).startswith(("c10d::", "_c10d_functional::", "c10d_functional::"))


def _marker() -> int:
    import torch

    with torch.enable_grad():
        return (torch.zeros((), requires_grad=True) * 1.0).grad_fn._sequence_nr()


_ACTIVE: dict[str, Any] = {}


def deactivate() -> None:
    """Undo :func:`activate` in this process (tests): ``taps.call`` / ``taps.install`` put back, the
    backward mode popped if it is on top of this thread's stack."""
    from harness import taps

    for name in ("call", "install"):
        if name in _ACTIVE:
            setattr(taps, name, _ACTIVE.pop(name))
    mode = (_ACTIVE.pop("state", {}) or {}).get("backward")
    if mode is not None:
        mode.__exit__(None, None, None)


def activate() -> None:
    """Wrap ``harness.taps.call`` as the plan in ``GOLDEN_LOCATE_PLAN`` says (module docstring)."""
    plan = json.loads(os.environ[PLAN_VAR])
    from harness import taps

    original = taps.call
    _ACTIVE.setdefault("call", original)
    _ACTIVE.setdefault("install", taps.install)
    targets = {(t["module"], int(t["call"])) for t in plan["targets"]}
    names = {m for m, _ in targets}
    step, mb, phase, coords = int(plan["step"]), int(plan["microbatch"]), plan["phase"], plan["coords"]
    rec = _Recorder(plan)
    state: dict[str, Any] = {}
    _ACTIVE["state"] = state

    def call(name, fn, *args, level=taps.MODULE):
        p = taps.active()
        if (name not in names or p is None or not getattr(p, "recording", False) or level > p.level
                or getattr(p, "step", None) != step or dict(getattr(p, "coords", {})) != coords):
            return original(name, fn, *args, level=level)
        n = (getattr(p, "_calls", None) or {}).get(name, 0)
        if max(getattr(p, "_mb", 0), 0) != mb or (name, n) not in targets:
            return original(name, fn, *args, level=level)
        return _observe(p, name, n, fn, args, level)

    def _observe(p, name, n, fn, args, level):
        Forward, Backward = _modes(rec)
        key = f"step{step:04d}/forward/mb{mb:03d}/{name}#{n}"
        target = f"{name}#{n}"
        tin, _ = _split(args)
        if phase == "forward":
            with Forward(target, write=True):
                out = original(name, fn, *args, level=level)
        else:
            lo = _marker()
            mode = Forward(target, write=False)
            with mode:
                out = original(name, fn, *args, level=level)
            hi = _marker()
            stacks = {}
            for t, stack in mode.outputs:
                node = getattr(t, "grad_fn", None)
                if node is not None:
                    stacks.setdefault(node._sequence_nr(), stack)
            bwd = state.get("backward")
            if bwd is None:
                bwd = state["backward"] = Backward()
                bwd.__enter__()   # stays on this thread's stack: backward runs under it
            bwd.ranges.append((lo, hi, target, stacks))
        entry = (getattr(p, "entries", {}) or {}).get(key) or {}
        rec.write({"kind": "target", "phase": phase, "target": target, "entry": key,
                   "sha256": entry.get("sha256"), "inputs": [_digest(t) for t in tin]})
        return out

    taps.call = call
    if phase == "init":
        _watch_construction(plan, rec, coords)


MODEL_MODULE = "harness.policy.native.parallel_model"
MODEL_CLASS = "ParallelQwen3Moe"


def _watch_construction(plan: dict, rec: _Recorder, coords: dict) -> None:
    """Phase ``init``: every op of the native policy model's construction (``ParallelQwen3Moe``
    from the full reference weights: slicing, copies, whatever edits them) is buffered; when
    the numerics probe of the planned rank is installed (``taps.install``, right after the
    engine is built) the buffer is written, in any other process it is dropped."""
    import importlib.abc
    import importlib.machinery
    import sys

    from harness import taps

    buffer: list[dict] = []
    target = f"{MODEL_CLASS}.__init__"

    def wrap(module: Any) -> None:
        cls = getattr(module, MODEL_CLASS, None)
        if cls is None or getattr(cls.__init__, "_golden_locate", False):
            return
        init = cls.__init__

        def __init__(self, *args, **kwargs):
            Forward, _ = _modes(rec)
            with Forward(target, write=True, phase="init", sink=buffer.append):
                init(self, *args, **kwargs)

        __init__._golden_locate = True
        cls.__init__ = __init__

    if MODEL_MODULE in sys.modules:
        wrap(sys.modules[MODEL_MODULE])
    else:
        class After(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target_=None):
                if name != MODEL_MODULE:
                    return None
                spec = importlib.machinery.PathFinder.find_spec(name, path)
                if spec is None or spec.loader is None:
                    return spec
                loader_exec = spec.loader.exec_module

                def exec_module(module):
                    loader_exec(module)
                    wrap(module)

                spec.loader.exec_module = exec_module
                return spec

        sys.meta_path.insert(0, After())

    install = taps.install

    def install_probe(probe):
        install(probe)
        if probe is not None and buffer:
            if dict(getattr(probe, "coords", {}) or {}) == coords:
                for r in buffer:
                    rec.write(r)
                rec.write({"kind": "target", "phase": "init", "target": target, "entry": None, "sha256": None,
                           "inputs": []})
            buffer.clear()

    taps.install = install_probe
