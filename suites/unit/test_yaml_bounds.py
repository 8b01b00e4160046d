"""The YAML reader behind specs and tolerance files is bounded: alias bombs,
nesting the parser cannot follow and oversized files are refused with a
``SpecError`` naming the file, never a hang, a MemoryError or a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.parity import ToleranceFileError
from harness.parity.tolerances import load_tolerances
from harness.spec.errors import SpecError
from harness.spec.yaml_io import StrictLoader, expanded_size, load_yaml_file, load_yaml_text


def alias_bomb(levels: int, fan: int = 10) -> str:
    """``levels`` anchors, each a list of ``fan`` aliases of the previous:
    ~``fan ** levels`` values in a few hundred bytes."""
    lines = ["l0: &l0 [" + ", ".join(["x"] * fan) + "]"]
    for i in range(1, levels + 1):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * fan) + "]")
    return "\n".join(lines) + "\n"


def test_alias_bomb_is_refused_naming_the_file() -> None:
    with pytest.raises(SpecError, match=r"bomb\.yaml: \(root\): document expands to more than 1000000 nodes"):
        load_yaml_text(alias_bomb(9), source="bomb.yaml")


def test_expanded_size_counts_every_reference() -> None:
    # l0 = 1 list + 3 scalars = 4; l1 = 1 + 3*4 = 13; plus 2 key scalars and the root mapping.
    node = StrictLoader(alias_bomb(1, fan=3)).get_single_node()
    assert expanded_size(node, limit=10**9) == 1 + (1 + 4) + (1 + 13)


def test_aliases_within_the_limit_still_load() -> None:
    assert load_yaml_text("a: &x {b: 1}\nc: *x\n", source="ok.yaml") == {"a": {"b": 1}, "c": {"b": 1}}
    assert load_yaml_text(alias_bomb(3), source="small.yaml", max_nodes=20000)["l3"][0][0][0] == ["x"] * 10


def test_nesting_too_deep_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match=r"deep\.yaml: \(root\): nesting too deep to parse"):
        load_yaml_text("[" * 20000 + "]" * 20000, source="deep.yaml")


def test_oversized_file_is_refused_from_its_size(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text("a: " + "x" * 5000 + "\n")
    with pytest.raises(SpecError, match=r"big\.yaml: \(file\): 5004 bytes is more than the 4096-byte limit"):
        from harness.spec.yaml_io import read_yaml_text
        read_yaml_text(path, max_bytes=4096)


def test_non_utf8_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "latin.yaml"
    path.write_bytes(b"a: caf\xe9\n")
    with pytest.raises(SpecError, match=r"latin\.yaml: \(file\): not UTF-8 \(byte 6\)"):
        load_yaml_file(path)


def test_tolerance_file_alias_bomb_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "tolerances.yaml"
    path.write_text(alias_bomb(9))
    with pytest.raises(ToleranceFileError, match=r"tolerances\.yaml: \(root\): document expands"):
        load_tolerances(path)


def test_tolerance_file_duplicate_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "tolerances.yaml"
    path.write_text("deterministic: true\ndeterministic: false\n")
    with pytest.raises(ToleranceFileError, match=r"duplicate key 'deterministic'"):
        load_tolerances(path)


def test_control_character_is_a_spec_error() -> None:
    # PyYAML's reader refuses it while the loader is built, before parsing starts
    # (found by hypothesis in test_spec_props: a ReaderError escaped as a traceback).
    with pytest.raises(SpecError, match=r"ctl\.yaml: \(root\): invalid YAML: unacceptable character #x0008"):
        load_yaml_text("a: \x08\n", source="ctl.yaml")
