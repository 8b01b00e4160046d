#!/usr/bin/env bash
# On the GPU machine, from a copy of this tree, after the chunks of ci/gpu/sglang_wheels.sh
# were copied into /tmp/wheels by earlier calls (docs/sglang.md "On the GPU"): install them
# into /tmp/sgl-site (once per machine), install EXTRA_DIR's wheels when the image's
# transformers is not sglang 0.5.17's pin (5.12.1), then run benches/sglang_gpu_bench.py for
# each workload named, logs and JSON in $OUT. The install is ci/gpu/sglang_install.sh.
#
#   EXTRA_DIR=.sgl/extra ci/gpu/sglang_run.sh qwen3_moe_tiny_smoke [qwen3_moe_medium_vllm ...]
set -uo pipefail
cd "$(dirname "$0")/../.."
source ci/gpu/sglang_install.sh || exit 2   # sets $out
for w in "$@"; do
    s=$(date +%s)
    timeout "${BENCH_TIMEOUT:-300}" python3 benches/sglang_gpu_bench.py --workload "$w" ${BENCH_ARGS:-} \
        --out "$out/sglang_$w.json" > "$out/sglang_$w.log" 2>&1
    echo "bench $w: rc $?, $(( $(date +%s) - s )) s" | tee -a "$out/phases.log"
    grep "sglang-bench\|Error\|error" "$out/sglang_$w.log" | cut -c1-600 | tail -n 30
done
