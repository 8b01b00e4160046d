"""The backend registries (``harness/registry/``): keyed by the schema's backend names,
every target importable, every implementation shaped like its role's Protocol.

Importing the implementations imports torch (not megatron-core or vLLM: their
modules import those lazily), so this is a unit test of the workload half; the
registries themselves are gate half (``test_gate_imports.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.registry import UnknownBackend, load_target
from harness.registry import policy as policy_registry
from harness.registry import rollout as rollout_registry
from harness.registry import trainer as trainer_registry

SCHEMA = json.loads((Path(policy_registry.__file__).resolve().parents[1] / "spec" / "workload.schema.json").read_text())


def _enum(role: str, key: str) -> list[str]:
    return SCHEMA["properties"][role]["properties"][key]["enum"]


def _methods(protocol: type) -> set[str]:
    return {n for n, v in vars(protocol).items() if callable(v) and not n.startswith("_")}


def _missing(cls: type, protocol: type) -> set[str]:
    return {n for n in _methods(protocol) if not callable(getattr(cls, n, None))}


def test_registries_are_keyed_by_the_schema_names():
    assert list(policy_registry.POLICY_BACKENDS) == _enum("policy", "backend")
    assert list(rollout_registry.ROLLOUT_BACKENDS) == _enum("rollout", "backend")
    assert list(trainer_registry.TRAINERS) == _enum("grpo", "trainer")


@pytest.mark.parametrize("name", list(policy_registry.POLICY_BACKENDS))
def test_policy_engines_have_the_role_methods(name):
    cls = policy_registry.engine_class(name)
    assert _methods(policy_registry.PolicyEngine) >= {"train", "get_logprobs", "hf_state_dict", "load_checkpoint"}
    missing = _missing(cls, policy_registry.PolicyEngine)
    assert not missing, f"{cls.__name__} lacks {missing}"
    assert cls.backend == name


@pytest.mark.parametrize("name", list(trainer_registry.TRAINERS))
def test_trainers_have_the_role_methods(name):
    cls = trainer_registry.trainer_class(name)
    assert not _missing(cls, trainer_registry.Trainer)
    assert cls.name == name


ROLLOUT_IMPLEMENTATIONS = {  # role -> the classes each rollout backend with an engine provides
    rollout_registry.EngineWorker: ["harness.rollout.engine_worker:EngineWorker",
                                    "harness.rollout.vllm.engine:VllmEngineWorker",
                                    "harness.rollout.sglang.worker:SGLangEngineWorker"],
    rollout_registry.EngineProcesses: ["harness.rollout.engine_procs:EngineProcesses",
                                       "harness.rollout.vllm.engine:VllmEngineProcesses"],
    rollout_registry.RolloutEngine: ["harness.rollout.native.engine:Engine", "harness.rollout.vllm.engine:VllmEngine"],
}


@pytest.mark.parametrize("role, target", [(r, t) for r, ts in ROLLOUT_IMPLEMENTATIONS.items() for t in ts],
                         ids=lambda x: x if isinstance(x, str) else x.__name__)
def test_rollout_implementations_have_the_role_methods(role, target):
    assert not _missing(load_target(target), role), f"{target} lacks {_missing(load_target(target), role)}"


def test_rollout_start_functions_resolve_without_their_engines_installed():
    for name, entry in rollout_registry.ROLLOUT_BACKENDS.items():
        assert entry.start is not None, name
        assert callable(rollout_registry.start_function(name))  # sglang / vllm are imported only inside
    assert rollout_registry.ROLLOUT_BACKENDS["sglang"].devices == ("cuda",)


def test_unknown_names_are_refused_naming_the_field():
    with pytest.raises(UnknownBackend, match=r"policy.backend='jax': no such backend \(known: native \| megatron"):
        policy_registry.policy_backend("jax")
    with pytest.raises(UnknownBackend, match=r"rollout.backend='trt'"):
        rollout_registry.rollout_backend("trt")
    with pytest.raises(ValueError, match=r"grpo.trainer: unknown trainer 'async'"):
        trainer_registry.trainer_class("async")


def test_optional_backends_are_read_from_the_registries():
    from harness.spec.backends import OPTIONAL_BACKENDS

    assert [(b.field, b.value, b.module) for b in OPTIONAL_BACKENDS] == [
        ("policy.backend", "megatron", "megatron.core"), ("rollout.backend", "vllm", "vllm"),
        ("rollout.backend", "sglang", "sglang")]
    assert [bool(b.unsupported) for b in OPTIONAL_BACKENDS] == [False, False, False]
