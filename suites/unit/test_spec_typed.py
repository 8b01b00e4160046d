"""``load_spec`` returns a frozen :class:`Workload`: typed blocks equal to the canonical
dict they came from, a digest byte-identical to the dict's, and no way to change it."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest

from harness.spec import list_workloads, load_spec, spec_digest
from harness.spec.constraints import policy_world
from harness.spec.load import canonical_json
from harness.spec.typed import FrozenDict, Workload, as_workload

WORKLOADS = list_workloads()


def _plain(value):
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value) if not f.name.startswith("_")}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


@pytest.mark.parametrize("name", WORKLOADS)
def test_blocks_equal_the_canonical_dict_and_the_digest_is_the_dicts(name):
    workload = load_spec(name, check_topology=False)
    assert isinstance(workload, Workload)
    source = workload.to_dict()
    assert type(source) is dict and source == dict(workload)
    assert canonical_json(workload) == canonical_json(source)
    assert spec_digest(workload) == spec_digest(source)
    for block in ("model", "policy", "rollout", "grpo", "env", "plugins", "capture", "platform"):
        typed = _plain(getattr(workload, block))
        expected = {**source[block]}
        if block == "rollout":
            expected["is_async"] = expected.pop("async")
        typed = {k: v for k, v in typed.items() if k in expected or v not in (None, {})}  # absent optional fields
        assert typed == expected, block
    assert workload.policy.world_size == policy_world(source)
    assert workload.name == source["name"] and workload.seed == source["seed"]


def test_a_loaded_spec_cannot_be_changed():
    workload = load_spec("qwen3_moe_tiny_smoke")
    with pytest.raises(dataclasses.FrozenInstanceError):
        workload.seed = 1  # type: ignore[misc]
    with pytest.raises(TypeError, match="read-only"):
        workload["policy"]["tp"] = 2
    with pytest.raises(TypeError, match="read-only"):
        workload["platform"]["platforms"].append("cuda")
    with pytest.raises(TypeError):
        workload["policy"] = {}  # type: ignore[index]
    assert workload.policy.tp == 1 and workload["policy"]["tp"] == 1


def test_copies_are_plain_and_edits_of_a_copy_convert_again():
    workload = load_spec("qwen3_moe_tiny_smoke")
    assert isinstance(workload["policy"], FrozenDict)
    edited = copy.deepcopy(dict(workload))
    assert type(edited["policy"]) is dict and type(edited["platform"]["platforms"]) is list
    edited["policy"]["tp"] = 2
    assert as_workload(edited).policy.tp == 2 and workload.policy.tp == 1
    assert type(pickle.loads(pickle.dumps(workload["rollout"]))) is dict
    again = pickle.loads(pickle.dumps(workload))
    assert again == workload and again.rollout == workload.rollout and again["rollout"] == workload["rollout"]
    assert as_workload(workload) is workload
