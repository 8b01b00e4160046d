#!/usr/bin/env bash
# Tier L2: GPU goldens, for runners with a CUDA device. Installs the CUDA
# torch already present on the runner image (no pin), then runs the gpu marker.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv --system-site-packages .venv-gpu
.venv-gpu/bin/python -m pip install -q -e '.[dev]'
mkdir -p reports
GOLDEN_PLATFORM=cuda .venv-gpu/bin/python -m pytest suites -m "gpu or golden" --junitxml=reports/l2-junit.xml \
    --golden-platform=cuda --golden-summary=reports/l2-summary.md "$@"
