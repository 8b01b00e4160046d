#!/usr/bin/env bash
# Tier L0: unit + property suites (no golden workloads). Minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
ci/bootstrap.sh
.venv/bin/python -m pytest suites/unit suites/property suites/faults -m "not golden and not gpu" "$@"
