#!/usr/bin/env bash
# On the GPU machine, from a copy of this tree, after the chunks of ci/gpu/sglang_wheels.sh
# were copied into /tmp/wheels by earlier calls (docs/sglang.md "On the GPU"): install them
# into /tmp/sgl-site (once per machine), install EXTRA_DIR's wheels when the image's
# transformers is not sglang 0.5.17's pin (5.12.1), then run benches/sglang_gpu_bench.py for
# each workload named, logs and JSON in $OUT.
#
#   EXTRA_DIR=.sgl/extra ci/gpu/sglang_run.sh qwen3_moe_tiny_smoke [qwen3_moe_medium_vllm ...]
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/device-out}
mkdir -p "$out"
start=$(date +%s)
export WHEELS_DIR=/tmp/wheels SITE_DIR=/tmp/sgl-site
source ci/gpu/install.sh || exit 2
echo "install: $(( $(date +%s) - start )) s" | tee -a "$out/phases.log"
image_tf=$(cd /tmp && env -u PYTHONPATH python3 -c "import transformers; print(transformers.__version__)")
echo "image transformers: $image_tf" | tee -a "$out/phases.log"
if [ "$image_tf" != "5.12.1" ] && [ -n "${EXTRA_DIR:-}" ] && [ ! -f "$SITE_DIR/.extra-installed" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE_DIR" "$EXTRA_DIR"/*.whl \
        && touch "$SITE_DIR/.extra-installed"
fi
export PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 TOKENIZERS_PARALLELISM=false NCCL_NVLS_ENABLE=0
for w in "$@"; do
    s=$(date +%s)
    timeout "${BENCH_TIMEOUT:-300}" python3 benches/sglang_gpu_bench.py --workload "$w" ${BENCH_ARGS:-} \
        --out "$out/sglang_$w.json" > "$out/sglang_$w.log" 2>&1
    echo "bench $w: rc $?, $(( $(date +%s) - s )) s" | tee -a "$out/phases.log"
    grep "sglang-bench\|Error\|error" "$out/sglang_$w.log" | cut -c1-600 | tail -n 30
done
