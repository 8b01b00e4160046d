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
from harness.registry import refit as refit_registry
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
    assert ["auto", *refit_registry.TRANSPORTS] == SCHEMA["properties"]["rollout"]["properties"]["refit"][
        "properties"]["transport"]["enum"]


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


# -- one record per backend: the other tables are read from the records (issue 42) ----------------


def test_the_schema_file_keeps_the_registries_names():
    """``workload.schema.json`` holds a copy of each generated enum: it must not drift."""
    from harness.registry.schema import SCHEMA_ENUMS

    assert set(SCHEMA_ENUMS) == {("policy", "backend"), ("rollout", "backend"), ("grpo", "trainer"),
                                 ("rollout", "refit", "transport")}
    for path, names in SCHEMA_ENUMS.items():
        node = SCHEMA
        for key in path:
            node = node["properties"][key]
        assert node["enum"] == list(names), f"workload.schema.json {'.'.join(path)} drifted from the registry"


@pytest.fixture
def fresh_schema():
    from harness.spec import schema

    schema.load_schema.cache_clear()
    schema._validator.cache_clear()
    yield schema
    schema.load_schema.cache_clear()
    schema._validator.cache_clear()


def test_the_validator_takes_its_enums_from_the_registries(monkeypatch, fresh_schema):
    from harness.registry import schema as registry_schema
    from harness.spec import load_spec
    from harness.spec.errors import SpecError

    monkeypatch.setitem(registry_schema.SCHEMA_ENUMS, ("rollout", "backend"), ("native", "vllm"))
    monkeypatch.setitem(registry_schema.SCHEMA_ENUMS, ("policy", "backend"), ("native", "megatron", "dtensor", "jax"))
    loaded = fresh_schema.load_schema()
    assert loaded["properties"]["policy"]["properties"]["backend"]["enum"][-1] == "jax"
    with pytest.raises(SpecError) as refused:
        load_spec("qwen3_moe_tiny_smoke", ["rollout.backend=sglang"])
    assert refused.value.field == "rollout.backend"


def test_worker_environments_are_read_from_the_backend_records(monkeypatch):
    import dataclasses

    from harness.registry import NATIVE_ENV, WorkerEnv
    from harness.workerenv import declare

    assert declare._environments() == declare.ENVIRONMENTS
    assert declare.ENVIRONMENTS["native"].roles == ("policy.backend=native", "rollout.backend=native")
    assert declare.environment_of("rollout", "sglang") is None
    assert declare.environment_of("policy", "dtensor") == "dtensor"
    jax = policy_registry.PolicyBackend("jax", "x:Y", worker_env=WorkerEnv("jax", ("workload",), ("harness", "jax"),
                                                                           "a planted backend"))
    monkeypatch.setitem(policy_registry.POLICY_BACKENDS, "jax", jax)
    planted = declare._environments()
    assert planted["jax"].roles == ("policy.backend=jax",) and planted["jax"].imports == ("harness", "jax")
    other = dataclasses.replace(NATIVE_ENV, imports=("harness",))  # the same name, another environment
    monkeypatch.setitem(policy_registry.POLICY_BACKENDS, "jax", dataclasses.replace(jax, worker_env=other))
    with pytest.raises(RuntimeError, match="policy.backend=jax: worker environment 'native' is declared twice"):
        declare._environments()


def test_zygote_flavours_are_read_from_the_policy_records():
    import dataclasses

    from harness.runner.zygote import FLAVOURS, _flavours

    assert _flavours() == FLAVOURS and set(FLAVOURS) == {"megatron", "dtensor"}
    planted = dataclasses.replace(policy_registry.POLICY_BACKENDS["native"], name="jax", flavour=("jax",))
    assert _flavours({**policy_registry.POLICY_BACKENDS, "jax": planted})["jax"] == ("jax",)
    assert FLAVOURS["megatron"][-1] == "harness.policy.megatron.compat:import_megatron"
    for name in FLAVOURS:  # a flavour serves fresh (never pooled) ranks only
        assert policy_registry.POLICY_BACKENDS[name].cold


# -- the refit transport: a registry role like the others ------------------------------------------


@pytest.mark.parametrize("name", list(refit_registry.TRANSPORTS))
def test_refit_transports_have_the_role_methods(name):
    impl = refit_registry.refit_transport(name)
    assert isinstance(impl, refit_registry.RefitTransport)
    assert not _missing(type(impl), refit_registry.RefitTransport)
    assert impl.name == name and refit_registry.refit_transport(name) is impl  # one instance per transport


def test_auto_is_resolved_from_the_placement_and_unknown_transports_are_refused():
    assert refit_registry.resolve("auto", True) == "zmq"
    assert refit_registry.resolve("auto", False) == "broadcast"
    assert refit_registry.resolve("broadcast", True) == "broadcast"
    with pytest.raises(refit_registry.UnknownTransport, match=r"rollout.refit.transport: refit transport must be "
                                                              r"'zmq' or 'broadcast', got 'nccl'"):
        refit_registry.resolve("nccl", True)
    with pytest.raises(ValueError, match="got 'nccl'"):
        refit_registry.refit_transport("nccl")


def test_the_distillation_students_are_read_from_the_policy_records():
    from harness.spec.distill import DISTILL_POLICY_BACKENDS

    assert tuple(n for n, b in policy_registry.POLICY_BACKENDS.items() if b.distill) == DISTILL_POLICY_BACKENDS
    assert DISTILL_POLICY_BACKENDS == ("native",)
