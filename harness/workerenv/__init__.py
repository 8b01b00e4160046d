"""Per-backend worker environments: one Python environment per backend, built ahead of a run.

``declare`` says what each backend's environment holds (one place); ``stamp``
records what a build installed and decides whether a built environment is
current and intact; ``build`` makes one (``python -m venv`` + pip) into the
cache directory; ``select`` maps a run's backends to the interpreters their
workers start with (``--worker-env`` / ``GOLDEN_WORKER_ENV``); ``smoke`` is the
per-environment import + one-step check that ``golden doctor`` runs inside each
environment. docs/worker-envs.md has the contract.

Everything but ``smoke`` is standard library only (the CLI and gate import it).
Not to be confused with ``harness.envs`` (the RL environments: tasks, tool env).
"""
