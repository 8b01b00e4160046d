"""Where the goldens live (harness.spec.roots), built-in specs as package data, and the backend check."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness import flows
from harness.spec.backends import BackendMissing, missing_backends, module_available, require_backends
from harness.spec.errors import SpecError
from harness.spec.load import BUILTIN_WORKLOADS, builtin_workload_path, load_spec, spec_digest
from harness.spec.roots import goldens_config

REPO = Path(__file__).resolve().parents[2]
SMOKE = "qwen3_moe_tiny_smoke"


@pytest.fixture
def consumer(tmp_path: Path, monkeypatch) -> Path:
    """tmp/repo/pyproject.toml with [tool.golden]; the cwd is a folder below it."""
    monkeypatch.delenv("GOLDEN_ROOT", raising=False)
    repo = tmp_path / "repo"
    (repo / "src" / "deep").mkdir(parents=True)
    (repo / "pyproject.toml").write_text('[project]\nname = "x"\n[tool.golden]\ngoldens-root = "gate/goldens"\n'
                                         f'workloads = ["{SMOKE}"]\n')
    monkeypatch.chdir(repo / "src" / "deep")
    return repo


def test_the_nearest_pyproject_table_names_the_root_relative_to_itself(consumer: Path):
    cfg = goldens_config()
    assert cfg.root == consumer / "gate" / "goldens" and cfg.workloads == (SMOKE,)
    assert cfg.source == f"{consumer / 'pyproject.toml'} [tool.golden] goldens-root" and cfg.explicit


def test_option_then_environment_win_over_the_table(consumer: Path, monkeypatch):
    monkeypatch.setenv("GOLDEN_ROOT", "from-env")
    assert goldens_config().root == Path("from-env") and goldens_config().source == "$GOLDEN_ROOT"
    cfg = goldens_config("from-option")
    assert cfg.root == Path("from-option") and cfg.source == "--goldens-root"
    assert cfg.workloads == (SMOKE,)  # the table's selection still applies


def test_a_pyproject_without_the_table_is_walked_past(consumer: Path):
    (consumer / "src" / "pyproject.toml").write_text('[project]\nname = "inner"\n')
    assert goldens_config().root == consumer / "gate" / "goldens"


def test_outside_any_configured_repository_the_harness_checkout_or_cwd_is_the_fallback(tmp_path, monkeypatch):
    monkeypatch.delenv("GOLDEN_ROOT", raising=False)
    monkeypatch.chdir(tmp_path)
    cfg = goldens_config()
    assert (cfg.root, cfg.source) == (REPO / "goldens", "the harness checkout") and not cfg.explicit


@pytest.mark.parametrize(("table", "field"), [
    ('goldens-root = 3', "tool.golden.goldens-root"),
    ('goldens_root = "g"', "tool.golden.goldens_root"),
    ('workloads = "smoke"', "tool.golden.workloads"),
    ('workloads = []', "tool.golden.workloads"),
])
def test_a_bad_table_names_the_key_and_the_file(consumer: Path, table: str, field: str):
    (consumer / "pyproject.toml").write_text(f"[tool.golden]\n{table}\n")
    with pytest.raises(SpecError) as info:
        goldens_config()
    assert info.value.field == field and info.value.source == str(consumer / "pyproject.toml")


def test_unparsable_toml_is_a_spec_error_naming_the_file(consumer: Path):
    (consumer / "pyproject.toml").write_text("[tool.golden\n")
    with pytest.raises(SpecError, match=r"pyproject\.toml: \(toml\): not valid TOML"):
        goldens_config()


def test_a_root_without_the_spec_falls_back_to_the_built_in_one(tmp_path: Path):
    assert builtin_workload_path(SMOKE) == BUILTIN_WORKLOADS / SMOKE / "workload.yaml"
    spec = load_spec(SMOKE, goldens_root=tmp_path)
    assert spec_digest(spec) == spec_digest(load_spec(REPO / "goldens" / SMOKE / "workload.yaml"))
    with pytest.raises(SpecError, match=r"no workload named 'nope' under .* nor a built-in one \(built-in: .*"
                                        + SMOKE):
        load_spec("nope", goldens_root=tmp_path)


def test_a_root_spec_wins_over_the_built_in_and_capture_copies_the_built_in_once(tmp_path: Path):
    written = flows.vendor_builtin_spec(tmp_path, SMOKE)
    assert written == tmp_path / SMOKE / "workload.yaml"
    assert written.read_bytes() == (REPO / "goldens" / SMOKE / "workload.yaml").read_bytes()
    written.write_text(written.read_text().replace("seed: 1234", "seed: 99"))
    assert flows.vendor_builtin_spec(tmp_path, SMOKE) is None  # never overwrites the consumer's copy
    assert load_spec(SMOKE, goldens_root=tmp_path)["seed"] == 99
    assert flows.vendor_builtin_spec(tmp_path, "not_built_in") is None


def test_a_missing_backend_is_refused_naming_package_and_install_command(monkeypatch):
    """megatron-core is installed here; ``sys.modules[name] = None`` is Python's own way of
    marking a module as not importable, so it stands in for an install without it."""
    megatron = load_spec("qwen3_moe_tiny_megatron_tp2pp2ep2")
    assert module_available("megatron.core") and missing_backends(megatron) == []
    monkeypatch.setitem(sys.modules, "megatron", None)
    with pytest.raises(BackendMissing) as info:
        require_backends(megatron)
    assert info.value.field == "policy.backend"
    assert "megatron-core" in str(info.value) and "pip install 'grpo-golden-harness[megatron]'" in str(info.value)


def test_module_available_does_not_count_a_bare_folder(tmp_path: Path, monkeypatch):
    (tmp_path / "fakepkg" / "core").mkdir(parents=True)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert not module_available("fakepkg.core")
    (tmp_path / "fakepkg" / "core" / "__init__.py").write_text("")
    assert module_available("fakepkg.core")
    assert not module_available("fakepkg.nothere")


@pytest.mark.skipif(module_available("vllm"), reason="vllm is installed here (the vLLM tier): nothing is missing")
def test_the_cli_refuses_a_vllm_workload_before_anything_starts(tmp_path: Path):
    """Exit 2 naming vllm and its install command; no run directory, no Ray."""
    import subprocess

    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "harness", "check", "qwen3_moe_tiny_vllm", "--run-dir", str(run_dir)],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 2, proc.stderr
    assert "rollout.backend: vllm needs the package vllm" in proc.stderr and "pip install" in proc.stderr
    assert not run_dir.exists() and "Ray" not in proc.stderr


def test_the_command_finds_the_consumer_table_from_a_subfolder(consumer: Path):
    """``golden list`` and ``golden plan`` in a consumer repository: the root comes from its
    [tool.golden] table, and a built-in workload plans without a spec in that root."""
    import subprocess

    spec_dir = consumer / "gate" / "goldens" / "mine"
    spec_dir.mkdir(parents=True)
    text = (REPO / "goldens" / SMOKE / "workload.yaml").read_text().replace(f"name: {SMOKE}", "name: mine")
    (spec_dir / "workload.yaml").write_text(text)
    env = {k: v for k, v in __import__("os").environ.items() if k != "GOLDEN_ROOT"}
    listed = subprocess.run([sys.executable, "-m", "harness", "list"], capture_output=True, text=True, timeout=120,
                            env=env)
    assert listed.returncode == 0, listed.stderr
    assert "mine" in listed.stdout and f"1 workloads in {consumer / 'gate' / 'goldens'}" in listed.stdout
    planned = subprocess.run([sys.executable, "-m", "harness", "plan", SMOKE], capture_output=True, text=True,
                             timeout=120, env=env)
    assert planned.returncode == 0, planned.stderr
    assert planned.stdout.startswith(f"workload  {SMOKE}")


@pytest.mark.parametrize("command", [["list"], ["lint"], ["plan", SMOKE], ["check", SMOKE], ["doctor", SMOKE]])
def test_a_bad_table_is_a_usage_error_of_every_command(consumer: Path, command: list[str]):
    """Exit 2 naming the key and the file, no traceback, nothing started."""
    import subprocess

    (consumer / "pyproject.toml").write_text('[tool.golden]\ngoldens_root = "g"\n')
    env = {k: v for k, v in __import__("os").environ.items() if k != "GOLDEN_ROOT"}
    proc = subprocess.run([sys.executable, "-m", "harness", *command], capture_output=True, text=True, timeout=120,
                          env=env)
    assert proc.returncode == 2, proc.stderr
    assert f"{consumer / 'pyproject.toml'}: tool.golden.goldens_root: unknown key" in proc.stderr
    assert "Traceback" not in proc.stderr
