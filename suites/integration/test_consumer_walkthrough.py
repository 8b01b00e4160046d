"""docs/consumer.md, run: every command of the walkthrough, in order, from the isolated wheel.

The page's fenced blocks are read with the HTML comment before each one:
``walkthrough: file PATH`` (written into the consumer repository, as the page shows it),
``walkthrough: run`` (each command must succeed: ``bash -euo pipefail``),
``walkthrough: exit N`` (the block must exit N), ``walkthrough: install`` (stood in for by
``suites.isolated_wheel.install_isolated``: the wheel built from this checkout, installed
alone into a fresh venv; the page's text is checked to name the wheel, the ``[workload]``
extra and the torch pin) and ``walkthrough: ci`` (a GitHub Actions job: each ``run:``
line but the install is run). Blocks without a comment are not run: the test fails if a
bash block has none, so a command cannot be added to the page untested.

Every block runs with the venv's ``bin/`` first on ``PATH`` (as after ``. .venv/bin/activate``)
in a directory outside the checkout; the harness's environment variables are removed and
``XDG_CACHE_HOME`` points into the test's folder, so the default run directory is checked
to be there and not in the consumer repository. Five workload runs (capture, pytest gate,
golden check, refresh, CI gate): about 90-150 s on the 2-core box.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from suites.isolated_wheel import REPO, IsolatedInstall, clean_env, install_isolated

pytestmark = pytest.mark.slow

PAGE = REPO / "docs" / "consumer.md"
WORKLOAD = "qwen3_moe_tiny_smoke"
GATED = ("topology", "lifecycle", "operators", "collectives", "rollouts", "training")
_MARK = re.compile(r"<!-- walkthrough: (\w+)(?: (\S+))? -->")


@dataclass
class Block:
    kind: str  # file | run | exit | install | ci | none
    arg: str | None
    lang: str
    text: str
    line: int


def blocks(page: Path = PAGE) -> list[Block]:
    """The page's fenced blocks, each with the walkthrough comment right before it (or kind none)."""
    lines = page.read_text().splitlines()
    out, i, mark = [], 0, None
    while i < len(lines):
        found = _MARK.fullmatch(lines[i].strip())
        if found:
            mark = (found.group(1), found.group(2))
        elif lines[i].startswith("```"):
            lang, start, body = lines[i][3:].strip(), i + 1, []
            i += 1
            while not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            kind, arg = mark or ("none", None)
            out.append(Block(kind, arg, lang, "\n".join(body) + "\n", start))
            mark = None
        elif lines[i].strip():
            mark = None if not lines[i].startswith("<!--") else mark
        i += 1
    return out


def test_every_bash_block_of_the_page_is_marked():
    unmarked = [b.line for b in blocks() if b.lang == "bash" and b.kind == "none"]
    assert not unmarked, f"docs/consumer.md: bash blocks without a walkthrough comment at lines {unmarked}"


@pytest.fixture(scope="module")
def isolated(tmp_path_factory: pytest.TempPathFactory) -> IsolatedInstall:
    return install_isolated(tmp_path_factory.mktemp("wheel"))


def test_the_consumer_walkthrough_runs_as_written(isolated: IsolatedInstall, tmp_path: Path):
    work = tmp_path / "work"
    work.mkdir()
    cache = tmp_path / "cache"
    env = clean_env(XDG_CACHE_HOME=str(cache), GIT_AUTHOR_NAME="consumer", GIT_AUTHOR_EMAIL="c@example.invalid",
                    GIT_COMMITTER_NAME="consumer", GIT_COMMITTER_EMAIL="c@example.invalid",
                    GITHUB_STEP_SUMMARY=str(tmp_path / "step-summary.md"), PYTHONDONTWRITEBYTECODE="1")
    cwd = work
    outputs: list[tuple[Block, str, float]] = []
    for block in blocks():
        if block.kind == "install":
            assert "grpo_golden_harness-0.1.0-py3-none-any.whl[workload]" in block.text
            assert "'torch==2.13.0'" in block.text and isolated.wheel.name in block.text
            continue
        if block.kind == "file":
            target = cwd / block.arg
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.text)
            continue
        if block.kind not in ("run", "exit", "ci"):
            continue
        commands = block.text
        if block.kind == "ci":
            runs = [line.split("- run: ", 1)[1] for line in block.text.splitlines() if "- run: " in line]
            assert any("pip install" in r for r in runs)
            commands = "\n".join(r for r in runs if "pip install" not in r) + "\n"
        strict = "set -euo pipefail\n" if block.kind != "exit" else ""
        where = cwd / ".walkthrough-cwd"
        t = time.perf_counter()
        script = f"{strict}{commands}__rc=$?\npwd > {where}\nexit $__rc\n"
        proc = isolated.shell(script, cwd, env, timeout=400)
        wall = time.perf_counter() - t
        out = proc.stdout + proc.stderr
        want = int(block.arg) if block.kind == "exit" else 0
        assert proc.returncode == want, (f"docs/consumer.md line {block.line}: exit {proc.returncode}, want {want}\n"
                                         f"{commands}\n{out[-5000:]}")
        if where.exists():
            cwd = Path(where.read_text().strip())
            where.unlink()
        outputs.append((block, out, wall))
    repo = work / "my-trainer"
    stored = repo / "goldens" / WORKLOAD / "cpu"
    def first(kind: str, needle: str) -> tuple[str, float]:
        return next((out, wall) for b, out, wall in outputs if b.kind == kind and needle in b.text)

    # 3. fails closed, at once
    out, wall = first("exit", "python -m pytest")
    assert f"goldens root {repo / 'goldens'} does not exist" in out and wall < 15
    # 4. capture: created, provenance with the spec, the built-in spec vendored
    out, _ = first("run", "--golden-capture-missing")
    assert "7 passed" in out and "created" in out
    # lint said what to do about cuda
    out, _ = first("exit", "golden lint")
    assert f"remove 'cuda' from platform.platforms in {repo / 'goldens' / WORKLOAD / 'workload.yaml'}" in out
    # 5. the gate passed both ways; golden check announced its run directory outside the repository
    gate = next(out for b, out, _ in outputs if "golden check" in b.text)
    assert "7 passed" in gate and f"run directory {cache / 'grpo-golden-harness' / 'runs'}/{WORKLOAD}-" in gate
    assert not (repo / "runs").exists() and not (work / "runs").exists()
    # 6. the planted seed: the spec finding, before anything ran
    planted = [(out, wall) for b, out, wall in outputs if b.kind == "exit" and "pytest" in b.text][-1]
    assert planted[0].count("seed: 1234 -> 1235") >= 6 and "fail before any run" in planted[0], planted[0][-3000:]
    assert "Started a local Ray instance" not in planted[0]
    # 7. the refresh showed what changed, recorded the reason and the new spec
    refresh = next(out for b, out, _ in outputs if "--golden-refresh" in b.text)
    review = refresh[refresh.index("golden refresh: what changed"):]
    assert "seed: 1234 -> 1235" in review and "training" in review
    provenance = json.loads((stored / "PROVENANCE.json").read_text())
    assert provenance["reason"] == "seed 1235: new sampling" and provenance["spec"]["seed"] == 1235
    assert provenance["repository"]["goldens_root"] == "goldens" and provenance["commit"] is None
    # 8. the CI job: gate green on the refreshed golden, summary written
    assert "parity" in (repo / "golden-summary.md").read_text()
    assert (tmp_path / "step-summary.md").read_text().startswith("## Golden gate")
