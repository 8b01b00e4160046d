"""The first diverging module: the numerics surface's findings in execution order.

``first_module(findings, golden, actual)`` picks, among the failing findings of the numerics
surface (``harness.policy.numerics_probe`` records it; docs/locator.md), the entry that comes
first in execution order and words where it is: the module, the rank (and its coordinates:
the shard it holds), step, microbatch, phase, and what the entries around it say -- for a
forward output the modules whose outputs it took (they match: they come earlier), for a
gradient the modules whose backward produced it (the consumers of that output), for a
parameter whether it is the initial weight or the one after a step. Digests are bit-exact
sha256, so the run keeps no values: the report says "digest-only" (no ulp or relative error).

Execution order of an entry ``stepNNNN/<phase>/mbMMM/<module>#<call>`` on a rank:
``(step, phase, microbatch, stage, seq, rank)`` with phase ``param`` of step 0 (the initial
weights) first, then per step ``forward`` < ``backward`` < ``param``; stage is the rank's
``pp`` coordinate, ascending in forward and descending in backward (the pipeline's order);
``seq`` the order the rank recorded it in. A collective's result (``collective.<op>.<group>``,
recorded after its wait) takes its place in that order like a module's output. Pure: no torch.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from harness.parity.findings import Finding, natural_key

__all__ = ["entry_order", "first_module", "numerics_point", "split_entry", "RULE"]

RULE = "downstream in the model"
_PHASES = {"param": 2, "forward": 0, "backward": 1}
_ENTRY = re.compile(r"^step(\d+)/(forward|backward|param)/mb(\d+)/(.+)#(\d+)(?:\.out(\d+))?$")


def split_entry(key: str) -> tuple[int, str, int, str, int] | None:
    """``(step, phase, microbatch, module, call)`` of an entry key, None if it is not one."""
    m = _ENTRY.match(key)
    if m is None:
        return None
    return int(m.group(1)), m.group(2), int(m.group(3)), m.group(4), int(m.group(5))


def _entry_key(f: Finding) -> str | None:
    if f.surface != "numerics" or f.section is None or len(f.path) < 2 or f.path[0] != "entries":
        return None
    return str(f.path[1])


def _body(doc: Mapping[str, Any] | None, section: str) -> Mapping[str, Any]:
    sections = (doc or {}).get("sections") or {}
    body = sections.get(section)
    return body if isinstance(body, Mapping) else {}


def entry_order(section: str, key: str, golden: Mapping[str, Any] | None,
                actual: Mapping[str, Any] | None) -> tuple:
    """Sort key of one entry in execution order (module docstring)."""
    parts = split_entry(key)
    if parts is None:
        return (1 << 30,)
    step, phase, mb, _, _ = parts
    seq, stage = 1 << 30, 0
    for doc in (golden, actual):
        body = _body(doc, section)
        rec = (body.get("entries") or {}).get(key)
        if isinstance(rec, Mapping) and isinstance(rec.get("seq"), int):
            seq = rec["seq"]
            stage = int((body.get("coords") or {}).get("pp", 0))
            break
    if step == 0 and phase == "param":
        return (0, -1, 0, stage, seq, natural_key(section))
    return (step, _PHASES[phase], mb, stage if phase != "backward" else -stage, seq, natural_key(section))


def _consumers(body: Mapping[str, Any], key: str, module: str) -> list[str]:
    """Modules of the same step and microbatch whose forward took ``module``'s output."""
    step, _, mb, _, _ = split_entry(key)  # type: ignore[misc]
    prefix = f"step{step:04d}/forward/mb{mb:03d}/"
    out = set()
    for k, rec in (body.get("entries") or {}).items():
        if k.startswith(prefix) and isinstance(rec, Mapping) and module in (rec.get("inputs") or ()):
            out.add(k[len(prefix):].split("#", 1)[0])
    return sorted(out)


def _describe(f: Finding, key: str, golden: Mapping[str, Any] | None, actual: Mapping[str, Any] | None) -> str:
    step, phase, mb, module, call = split_entry(key)  # type: ignore[misc]
    body = _body(golden, f.section or "") or _body(actual, f.section or "")
    coords = body.get("coords") or {}
    shard = ",".join(f"{k}={v}" for k, v in sorted(coords.items())) or "1 rank"
    where = f"{f.section} [{shard}], step {step}, microbatch {mb}, call {call}"
    if module.startswith("collective."):
        _, op, group = module.split(".", 2)
        what = (f"first diverging collective: {op} over {group} ({phase}, its result after the wait) on {where}; "
                f"every entry this rank recorded before it matches, so a peer of the {group} group sent "
                f"other bits (or untapped code between them changed its input)")
    elif phase == "forward":
        rec = (body.get("entries") or {}).get(key) or {}
        inputs = list(rec.get("inputs") or ())
        what = (f"first diverging module: {module} (forward output) on {where}; its inputs "
                + (f"({', '.join(inputs)}) match" if inputs else "come from untapped code or another rank and match"))
    elif phase == "backward":
        users = _consumers(body, key, module)
        what = (f"first diverging gradient: at the output of {module} on {where}; the gradients arriving at "
                f"the outputs of its consumers match, so the divergence is in the backward of "
                + (", ".join(users) if users else "the code consuming it (untapped)"))
    elif step == 0:
        what = f"first diverging parameter: {module} as initialised, on {where}"
    else:
        what = f"first diverging parameter: {module} after the optimizer step, on {where}"
    return what + "; digest-only (sha256 of the bytes: no ulp or relative error kept)"


def first_module(findings: list[Finding], golden: Mapping[str, Any] | None,
                 actual: Mapping[str, Any] | None) -> tuple[Finding, Finding] | None:
    """``(finding, annotated)``: the first failing numerics entry in execution order and a copy
    whose ``note`` says where it is (None when no numerics entry fails)."""
    candidates = [(entry_order(f.section or "", k, golden, actual), f) for f in findings
                  if f.status in ("fail", "stale") and (k := _entry_key(f)) is not None
                  and split_entry(k) is not None]
    if not candidates:
        return None
    _, first = min(candidates, key=lambda item: item[0])
    key = _entry_key(first)
    assert key is not None
    return first, dataclasses.replace(first, note=_describe(first, key, golden, actual))


def numerics_point(f: Finding, golden: Mapping[str, Any] | None, actual: Mapping[str, Any] | None) -> tuple:
    """The (step, stage, rank) point of a numerics cause, as ``divergence.execution_point``
    gives it for other findings: training is stage 1."""
    key = _entry_key(f) or ""
    parts = split_entry(key)
    return (parts[0] if parts else 0, 1, natural_key(f.section or ""))
