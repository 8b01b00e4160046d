"""Follow-up command hints ("to accept: golden refresh ...") that repeat the options the user gave.

A hint is meant to be copy-pasted: it names the same workload (as typed, a name
or a path), the same overrides, the resolved golden platform and, when the user
chose one, the same goldens root, so the suggested command acts on the golden the
user was looking at (not on the repository's own ``goldens/``). Values are
shell-quoted; ``TEXT`` is the placeholder the user replaces.

Standard library only: the pytest plugin (gate half) builds its hint text here too.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

__all__ = ["golden_command", "pytest_refresh_hint", "root_if_chosen"]

PLACEHOLDER = "TEXT"


def golden_command(subcommand: str, workload: str, *, overrides: Sequence[str] = (), platform: str | None = None,
                   goldens_root: str | Path | None = None, reason: bool = False) -> str:
    """``golden SUBCOMMAND WORKLOAD [overrides] [--platform P] [--goldens-root R] [--reason TEXT]``."""
    parts = ["golden", subcommand, workload, *overrides]
    if platform:
        parts += ["--platform", platform]
    if goldens_root is not None:
        parts += ["--goldens-root", str(goldens_root)]
    text = " ".join(shlex.quote(p) for p in parts)
    return text + (f" --reason {PLACEHOLDER}" if reason else "")


def pytest_refresh_hint(workload: str, *, platform: str | None = None,
                        goldens_root: str | Path | None = None) -> str:
    """The pytest spelling of a refresh of one workload's golden. Options with a value are written
    ``--opt=VALUE``: in the space form pytest may read the value as a test path when it looks for
    its rootdir, before the plugin is loaded (``harness.pytest_plugin.VALUE_OPTIONS``)."""
    parts = ["pytest", "-m", "golden", "-k", workload, "--golden-refresh"]
    if platform:
        parts += [f"--golden-platform={platform}"]
    if goldens_root is not None:
        parts += [f"--goldens-root={goldens_root}"]
    return " ".join(shlex.quote(p) for p in parts) + f" --golden-reason={PLACEHOLDER}"


def root_if_chosen(root: str | Path | None) -> Path | None:
    """``root`` unless it is the default goldens root (``$GOLDEN_ROOT`` or the built-in one):
    a hint needs ``--goldens-root`` only for a root the environment would not pick again."""
    if root is None:
        return None
    from harness.spec.load import default_goldens_root

    try:
        if Path(root).resolve() == Path(default_goldens_root()).resolve():
            return None
    except OSError:
        pass
    return Path(root)
