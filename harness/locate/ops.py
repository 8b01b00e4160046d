"""The first diverging aten op of two op streams (the golden's replay and the run's).

A stream is the list of op records ``harness.locate.hook`` wrote for the target calls: per op
``op`` (``aten::topk``), ``in`` / ``out`` (value ids: dtype, shape and sha256 of the bytes of
each tensor input and output), ``args`` (the non-tensor arguments), ``stack`` (file:line of the
tree's frames, innermost last) and, in backward, ``node`` and ``forward_stack``.

The first diverging op is the first op of the run's stream, in its order, whose tensor inputs
are all *known* -- each is a value the golden's stream holds, or one the run's stream made
earlier from known values only by an op that moves, views or casts (``MOVES``), or a constant
(an op with no tensor input) -- and one of whose outputs the golden's stream never holds.
That is "the first op whose inputs match and whose output differs": its inputs are values
the golden computed too, its result is not. An op whose input is already unknown is
downstream of it. Where the golden's stream has an op of the same name on
the same inputs, it is the counterpart (its non-tensor arguments are shown beside the run's).
Pure: no torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any


@dataclasses.dataclass
class Located:
    op: Mapping[str, Any]                    # the run's record of the first diverging op
    counterpart: Mapping[str, Any] | None    # the golden's op of that name on the same inputs
    then: list[Mapping[str, Any]]            # the next ops whose outputs differ (downstream)
    derived: list[Mapping[str, Any]] = dataclasses.field(default_factory=list)  # moves/casts feeding it


def ops_of(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [r for r in records if r.get("kind") == "op"]


def first_op(golden: list[Mapping[str, Any]], actual: list[Mapping[str, Any]], *,
             then: int = 3) -> Located | None:
    """The first diverging op of ``actual`` against ``golden`` (module docstring), None if every
    op of ``actual`` computed values the golden's stream holds."""
    known: set[str] = set()
    by_inputs: dict[tuple, Mapping[str, Any]] = {}
    for r in golden:
        known.update(r.get("in") or ())
        known.update(r.get("out") or ())
        by_inputs.setdefault((r.get("op"), tuple(r.get("in") or ())), r)
    tainted: set[str] = set()   # values downstream of a diverging op
    derived: dict[str, Mapping[str, Any]] = {}   # new values that only move or convert known ones
    found: Located | None = None
    for r in actual:
        ins, outs = list(r.get("in") or ()), list(r.get("out") or ())
        fresh = [o for o in outs if o not in known]
        if found is not None or any(i in tainted for i in ins):
            tainted.update(fresh)
            if found is not None and fresh and len(found.then) < then:
                found.then.append(r)
            continue
        if not fresh:
            continue
        if not ins or _same_bytes(ins, fresh) or op_base(r) in MOVES:
            derived.update((o, r) for o in fresh)   # a constant, a view, a copy or a cast
            continue
        found = Located(r, by_inputs.get((r.get("op"), tuple(ins))), [],
                        [derived[i] for i in dict.fromkeys(ins) if i in derived])
        tainted.update(fresh)
    return found


# ops that move, view or convert a value without computing on it: a new value they make (a
# cast of a matching tensor) is not the divergence; the first op computing on it is
MOVES = frozenset({
    "aten::_to_copy", "aten::to", "aten::clone", "aten::contiguous", "aten::copy_", "aten::lift_fresh",
    "aten::lift_fresh_copy", "aten::detach", "aten::alias", "aten::view", "aten::_unsafe_view",
    "aten::reshape", "aten::expand", "aten::t", "aten::transpose", "aten::permute", "aten::slice",
    "aten::select", "aten::unsqueeze", "aten::squeeze", "aten::as_strided", "aten::split",
    "aten::split_with_sizes", "aten::unbind", "aten::narrow", "aten::cat", "aten::stack",
    "aten::empty_like", "aten::zeros_like", "aten::ones_like", "aten::new_empty_strided", "aten::_reshape_alias",
})


def op_base(r: Mapping[str, Any]) -> str:
    """``aten::sum`` of ``aten::sum.dim_IntList``."""
    return str(r.get("op", "")).split(".", 1)[0]


def _same_bytes(ins: list[str], outs: list[str]) -> bool:
    """Every output holds the bytes of an input (a view, a reshape, a copy: same bytes)."""
    have = {i.rsplit(":", 1)[-1] for i in ins}
    return all(o.rsplit(":", 1)[-1] in have for o in outs)


def where(r: Mapping[str, Any]) -> str:
    """The innermost frame of the tree on the op's stack (``file:line in function: source``);
    in backward, where the op's stack holds no frame of the model, the frame that made its
    autograd node in forward."""
    stack = list(r.get("stack") or ())
    fwd = list(r.get("forward_stack") or ())
    if r.get("phase") == "backward" and fwd and (not stack or _driver(stack[-1])):
        return f"{fwd[-1]} (backward of this forward op, autograd node {r.get('node')})"
    return stack[-1] if stack else "(no frame of the tree on the stack)"


def _driver(frame: str) -> bool:
    """A frame that calls into autograd (``torch.autograd.backward(...)``, ``loss.backward()``)."""
    return "backward(" in frame.split(": ", 1)[-1]
