#!/usr/bin/env bash
# Tier L0: lint, then the unit + property suites (no golden workloads). Minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
ci/bootstrap.sh
.venv/bin/ruff check harness suites benches  # the lint contract: pyproject.toml [tool.ruff]
.venv/bin/python -m pytest suites/unit suites/property suites/faults -m "not golden and not gpu" "$@"
