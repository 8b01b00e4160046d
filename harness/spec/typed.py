"""The loaded spec as frozen typed objects, one per block (``load_spec`` returns a :class:`Workload`).

``Workload.from_dict(d)`` builds the objects from a *loaded* spec dict (schema-valid,
defaults filled: every field below is present, but for the ones typed ``... | None =
None``, which the schema writes no default for). Components take the block they need
(``ModelConfig.from_spec(workload.model)``, ``ClippedPGLoss(workload.grpo.loss)``, ...),
read as attributes, never by subscript.

What is gated stays the canonical dict: ``Workload.to_dict()`` returns (a deep copy of)
the mapping the objects were built from, byte for byte what ``spec_digest`` hashes and
what goldens store in ``run.json`` and the manifest. A key this module does not declare
(a block added by a newer schema) is kept there, untouched, and ignored by the objects.

A :class:`Workload` is also that dict, read-only (a ``dict`` subclass: ``json.dumps``,
``dict(workload)`` and ``workload == d`` work, so the gate half and stored documents see
the same canonical mapping as before): the subscript returns the block as a read-only :class:`FrozenDict`
(its lists a read-only :class:`FrozenList`), so nothing changes the spec behind the objects' back; setting a key
raises ``TypeError``. A deep copy or a pickle of a block is a plain ``dict`` again.

Stdlib only (gate half).
"""

from __future__ import annotations

import copy
import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class FrozenDict(dict):
    """A spec block read by subscript: a ``dict`` (``json``, ``{**block}``, ``dict(block)``
    work) that refuses every change; ``copy.deepcopy`` and pickling give a plain ``dict``."""

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("a loaded spec is read-only: edit a copy (Workload.to_dict()) and convert it again")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _refuse  # type: ignore[assignment]
    __ior__ = _refuse  # type: ignore[assignment]

    def __deepcopy__(self, memo: dict) -> dict:
        return copy.deepcopy(_thawed(self), memo)

    def __reduce__(self) -> tuple:
        return (dict, (_thawed(self),))


class FrozenList(list):
    """A list in a spec block read by subscript: a ``list`` that refuses every change."""

    _refuse = FrozenDict._refuse
    __setitem__ = __delitem__ = __iadd__ = __imul__ = append = extend = insert = _refuse  # type: ignore[assignment]
    pop = remove = clear = sort = reverse = _refuse  # type: ignore[assignment]

    def __deepcopy__(self, memo: dict) -> list:
        return copy.deepcopy(_thawed(self), memo)

    def __reduce__(self) -> tuple:
        return (list, (_thawed(self),))


def _frozen(value: Any) -> Any:
    if isinstance(value, dict):
        return FrozenDict({k: _frozen(v) for k, v in value.items()})
    if isinstance(value, list):
        return FrozenList(_frozen(v) for v in value)
    return value


def _thawed(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _thawed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_thawed(v) for v in value]
    return value


def _types(kind: Any) -> tuple[Any, ...]:
    return typing.get_args(kind) if typing.get_origin(kind) in (typing.Union, types.UnionType) else (kind,)


def _build(cls: type, data: Mapping[str, Any]) -> Any:
    """``cls`` (a dataclass below) from ``data``: nested blocks built, lists made tuples,
    integers in ``float`` fields made floats, undeclared keys ignored, absent optional
    fields left at their default."""
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name.startswith("_") or f.name not in data:
            continue
        value = data[f.name]
        kind = hints[f.name]
        if isinstance(kind, type) and dataclasses.is_dataclass(kind) and isinstance(value, Mapping):
            value = _build(kind, value)
        elif typing.get_origin(kind) in (typing.Union, types.UnionType) and isinstance(value, Mapping):
            inner = [a for a in typing.get_args(kind) if isinstance(a, type) and dataclasses.is_dataclass(a)]
            if inner:
                value = _build(inner[0], value)
        elif isinstance(value, int) and not isinstance(value, bool) and float in _types(kind):
            value = float(value)  # a number field written as 1 reads as 1.0
        elif isinstance(value, list):
            value = tuple(value)
        elif isinstance(value, dict):
            value = dict(value)
        kwargs[f.name] = value
    return cls(**kwargs)


@dataclass(frozen=True)
class ModelSpec:
    """``model``: the Qwen3-MoE config (HF names in docs/design.md)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    experts: int
    top_k: int
    moe_intermediate: int
    vocab: int
    rope_theta: float
    rms_eps: float
    norm_topk_prob: bool
    qk_norm: bool
    max_position: int
    init_std: float
    dtype: str


@dataclass(frozen=True)
class OptimizerSpec:
    """``policy.optimizer``: AdamW."""

    lr: float
    weight_decay: float
    beta1: float
    beta2: float
    eps: float
    max_grad_norm: float | None = None


@dataclass(frozen=True)
class LoraSpec:
    """``policy.lora`` (dtensor only; absent: off)."""

    enabled: bool = False
    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass(frozen=True)
class PolicySpec:
    """``policy``: backend, parallel sizes (world = tp*pp*cp*dp), batch shape, optimizer."""

    backend: str
    tp: int
    pp: int
    cp: int
    ep: int
    etp: int
    dp: int
    sp: bool
    pp_layout: tuple[int, ...] | None
    micro_batch_size: int
    seq_len: int
    optimizer: OptimizerSpec
    lora: LoraSpec | None = None

    @property
    def world_size(self) -> int:
        """tp * pp * cp * dp (the dense grid; ``harness.spec.constraints.policy_world``)."""
        return self.tp * self.pp * self.cp * self.dp

    @property
    def lora_enabled(self) -> bool:
        return self.lora is not None and self.lora.enabled


@dataclass(frozen=True)
class RefitSpec:
    """``rollout.refit``."""

    transport: str
    buffer_size_bytes: int


@dataclass(frozen=True)
class RolloutSpec:
    """``rollout``: backend, engines and their TP size, generation settings."""

    backend: str
    engines: int
    tp: int
    pp: int
    ep: int
    is_async: bool  # the spec field ``async`` (a Python keyword)
    colocated: bool
    max_batch_size: int
    max_new_tokens: int
    temperature: float
    top_p: float
    worker_cls: str | None
    refit: RefitSpec


@dataclass(frozen=True)
class LossSpec:
    """``grpo.loss``: the clipped policy-gradient loss and its KL term."""

    ratio_clip_min: float
    ratio_clip_max: float
    kl_beta: float
    kl_type: str
    kl_input_clamp: float
    kl_output_clamp: float
    token_level_loss: bool
    use_importance_sampling_correction: bool


@dataclass(frozen=True)
class GrpoSpec:
    """``grpo``: the trainer and the step loop."""

    trainer: str
    iterations: int
    prompts_per_step: int
    generations_per_prompt: int
    normalize_rewards: bool
    leave_one_out: bool
    dynamic_sampling: bool
    max_attempts: int
    loss: LossSpec
    checkpoint_every: int = 0
    min_verified_samples: int | None = None  # no default written (absent means 1)

    @property
    def samples_per_step(self) -> int:
        return self.prompts_per_step * self.generations_per_prompt


@dataclass(frozen=True)
class EnvSpec:
    """``env``: the task and its turns."""

    task: str
    turns: int


@dataclass(frozen=True)
class PluginsSpec:
    """``plugins``: profiler class paths and the plugins' extra environment."""

    policy_profiler: str | None
    rollout_profiler: str | None
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CaptureSpec:
    """``capture``: token capture."""

    enabled: bool
    fail_stage_rate: float


@dataclass(frozen=True)
class PlatformSpec:
    """``platform``: the device and the cluster shape the planner lays ranks on."""

    device: str
    nodes: int
    gpus_per_node: int
    head_node: bool
    platforms: tuple[str, ...]
    ray_address: str | None = None  # no default written: join this Ray cluster (docs/cluster.md)


@dataclass(frozen=True)
class TeacherSpec:
    """``distill.teacher``: the teacher's seed, the model fields it changes, its layout."""

    seed: int
    model: dict[str, Any] = field(default_factory=dict)
    tp: int = 1
    ep: int = 1
    dp: int = 1
    micro_batch_size: int = 2


@dataclass(frozen=True)
class DistillSpec:
    """``distill`` (optional; docs/distill.md): the teacher and the KL term of the student's loss."""

    teacher: TeacherSpec
    kl_coef: float
    kl_type: str
    kl_direction: str
    temperature: float


@dataclass(frozen=True)
class WorkloadBlocks:
    """The typed blocks of one workload (what :class:`Workload` exposes as attributes)."""

    name: str
    description: str
    seed: int
    model: ModelSpec
    policy: PolicySpec
    rollout: RolloutSpec
    grpo: GrpoSpec
    env: EnvSpec
    plugins: PluginsSpec
    capture: CaptureSpec
    platform: PlatformSpec
    distill: DistillSpec | None = None  # no default written (absent: no distillation)


class Workload(FrozenDict):
    """One loaded workload spec: the canonical dict, read-only, with its blocks as frozen
    typed objects (``workload.policy.tp``; see the module docstring)."""

    __slots__ = ("_typed",)

    def __init__(self, source: Mapping[str, Any]) -> None:
        """Use :meth:`from_dict` (or ``load_spec``); ``source`` is a loaded spec dict."""
        source = _thawed(dict(source))
        dict.__init__(self, {k: _frozen(v) for k, v in source.items()})
        typed = _build(WorkloadBlocks, {**source, "rollout": {**source["rollout"],
                                                                "is_async": source["rollout"]["async"]}})
        object.__setattr__(self, "_typed", typed)

    @classmethod
    def from_dict(cls, spec: Mapping[str, Any]) -> Workload:
        """The objects of a loaded spec dict (a :class:`Workload` is returned as it is)."""
        return spec if isinstance(spec, Workload) else cls(spec)

    def to_dict(self) -> dict[str, Any]:
        """The canonical spec dict (a plain deep copy): what ``spec_digest`` hashes and goldens store."""
        return _thawed(self)

    name = property(lambda self: self._typed.name)
    description = property(lambda self: self._typed.description)
    seed = property(lambda self: self._typed.seed)
    model = property(lambda self: self._typed.model)
    policy = property(lambda self: self._typed.policy)
    rollout = property(lambda self: self._typed.rollout)
    grpo = property(lambda self: self._typed.grpo)
    env = property(lambda self: self._typed.env)
    plugins = property(lambda self: self._typed.plugins)
    capture = property(lambda self: self._typed.capture)
    platform = property(lambda self: self._typed.platform)
    distill = property(lambda self: self._typed.distill)

    def __setattr__(self, name: str, value: Any) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r} of a loaded spec")

    def __deepcopy__(self, memo: dict) -> Workload:
        return self  # frozen: a copy would be equal in every way

    def __reduce__(self) -> tuple:
        return (Workload, (self.to_dict(),))

    def __repr__(self) -> str:
        return f"Workload({self._typed!r})"


def as_workload(spec: Mapping[str, Any]) -> Workload:
    """``spec`` as a :class:`Workload`, returned as it is when it is one. A plain spec
    dict (``run.json``'s, a test's edited copy or hand-written part of a spec) is
    completed with the schema's defaults as ``load_spec`` completes one (numbers made
    floats where the schema says number; ``name`` ``""`` when absent), not validated."""
    if isinstance(spec, Workload):
        return spec
    from harness.spec.schema import fill_defaults

    filled = fill_defaults(dict(spec))
    filled.setdefault("name", "")
    return Workload.from_dict(filled)


def as_mapping(block: Any) -> Mapping[str, Any]:
    """A block as a mapping for helpers that read either a typed block or a plain dict
    (their unit tests pass dicts): a dataclass becomes ``{field: value}`` (one level; its
    nested blocks stay objects), a mapping is returned as it is."""
    if dataclasses.is_dataclass(block) and not isinstance(block, type):
        return {f.name: getattr(block, f.name) for f in dataclasses.fields(block) if not f.name.startswith("_")}
    return block
