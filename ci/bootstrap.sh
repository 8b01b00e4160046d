#!/usr/bin/env bash
# Create (or reuse) .venv and install the harness with the workload half and
# the development tools. torch is pinned to the CPU build on purpose: an
# unpinned torch pulls several GB of CUDA wheels.
#   ci/bootstrap.sh          workload + megatron-core backend + dev (default)
#   ci/bootstrap.sh light    the gate half only (no torch, no ray)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
VENV_PY=.venv/bin/python
"$VENV_PY" -m pip install -q --upgrade pip >/dev/null
case "${1:-full}" in
    light) "$VENV_PY" -m pip install -q -e '.[dev]' ;;
    full)  "$VENV_PY" -m pip install -q 'torch==2.13.0' -e '.[workload,dev,megatron]' ;;
    *) echo "usage: ci/bootstrap.sh [full|light]" >&2; exit 2 ;;
esac
# The editable install leaves the checkout's modules uncompiled (pip compiles only what it copies
# into site-packages); with PYTHONDONTWRITEBYTECODE=1 (set on the CI boxes) every process would
# then parse the harness from source again: every engine process and fork server of a gate run.
"$VENV_PY" -m compileall -q -j 0 harness suites benches >/dev/null
echo "bootstrap: $("$VENV_PY" --version), harness installed in .venv"
