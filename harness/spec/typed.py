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

For the move to attribute access a :class:`Workload` still reads like the dict it came
from (``workload["policy"]["tp"]``, ``dict(workload)``, ``json.dumps`` through
``canonical_json``): the subscript returns the block as a read-only :class:`FrozenDict`
(its lists a read-only :class:`FrozenList`), so nothing changes the spec behind the objects' back; setting a key
raises ``TypeError``. A deep copy or a pickle of a block is a plain ``dict`` again.

Stdlib only (gate half).
"""

from __future__ import annotations

import copy
import dataclasses
import types
import typing
from collections.abc import Iterator, Mapping
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


def _build(cls: type, data: Mapping[str, Any]) -> Any:
    """``cls`` (a dataclass below) from ``data``: nested blocks built, lists made tuples,
    undeclared keys ignored, absent optional fields left at their default."""
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


@dataclass(frozen=True, eq=False)
class Workload(Mapping[str, Any]):
    """One loaded workload spec: its blocks as typed objects and the canonical dict."""

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
    _source: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)
    _blocks: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)  # _source, frozen

    @classmethod
    def from_dict(cls, spec: Mapping[str, Any]) -> Workload:
        """The objects of a loaded spec dict (a :class:`Workload` is returned as it is)."""
        if isinstance(spec, Workload):
            return spec
        source = copy.deepcopy(dict(spec))
        workload = _build(cls, {**source, "rollout": {**source["rollout"], "is_async": source["rollout"]["async"]}})
        object.__setattr__(workload, "_source", source)
        object.__setattr__(workload, "_blocks", _frozen(source))
        return workload

    def to_dict(self) -> dict[str, Any]:
        """The canonical spec dict (a deep copy): what ``spec_digest`` hashes and goldens store."""
        return copy.deepcopy(self._source)

    # -- read-only mapping view of the canonical dict (see the module docstring) ----
    def __getitem__(self, key: str) -> Any:
        return self._blocks[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._source)

    def __len__(self) -> int:
        return len(self._source)

    def __deepcopy__(self, memo: dict) -> Workload:
        return self  # frozen: a copy would be equal in every way

    def __reduce__(self) -> tuple:
        return (Workload.from_dict, (self._source,))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Workload):
            return self._source == other._source
        return isinstance(other, Mapping) and self._source == dict(other)

    __hash__ = None  # type: ignore[assignment] - equal to the dict it came from, which has no hash


def as_workload(spec: Mapping[str, Any]) -> Workload:
    """``spec`` as a :class:`Workload`: a loaded spec dict (a test's edited copy) is
    converted without validation; a :class:`Workload` is returned as it is."""
    return Workload.from_dict(spec)
