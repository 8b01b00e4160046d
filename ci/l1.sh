#!/usr/bin/env bash
# Tier L1: the CPU golden workloads (strict parity against goldens/<w>/cpu),
# plus the integration suites. Writes a JUnit report and a Markdown summary.
set -euo pipefail
cd "$(dirname "$0")/.."
ci/bootstrap.sh
mkdir -p reports
.venv/bin/python -m pytest suites/integration suites/golden -m "not gpu" \
    --junitxml=reports/l1-junit.xml --golden-summary=reports/l1-summary.md "$@"
if [ -n "${GITHUB_STEP_SUMMARY:-}" ] && [ -f reports/l1-summary.md ]; then
    cat reports/l1-summary.md >> "$GITHUB_STEP_SUMMARY"
fi
