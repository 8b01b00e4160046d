#!/usr/bin/env bash
# On the GPU machine, after ci/gpu/sglang_wheels.sh's chunks were copied into /tmp/wheels
# (docs/sglang.md "On the GPU"): install SGLang and Ray (ci/gpu/sglang_install.sh), then run
# the named phases of a cuda golden of an SGLang workload, each under its own time limit, its
# log in $OUT/<phase>.log, one line per phase (exit status, seconds) in $OUT/phases.log.
#
#   RAY_WHEEL_DIR=.gpuray EXTRA_DIR=.sgl/extra GOLDEN_REASON=... \
#       ci/gpu/sglang_golden.sh capture:qwen3_moe_tiny_sglang check:qwen3_moe_tiny_sglang
#
# capture:W / refresh:W store the golden in this copy's goldens/ and put a tar of
# goldens/W/cuda in $OUT (golden_W.tar); check:W runs `golden check W --platform cuda`.
set -uo pipefail
cd "$(dirname "$0")/../.."
source ci/gpu/sglang_install.sh || exit 2   # sets $out
for phase in "$@"; do
    s=$(date +%s)
    w=${phase#*:}
    case $phase in
        capture:*|refresh:*)
            timeout "${PHASE_TIMEOUT:-300}" python3 -m harness.cli "${phase%%:*}" "$w" --platform cuda \
                --reason "$GOLDEN_REASON" > "$out/$phase.log" 2>&1 \
                && tar -C "goldens/$w" -cf "$out/golden_$w.tar" cuda ;;
        check:*)
            timeout "${PHASE_TIMEOUT:-300}" python3 -m harness.cli check "$w" --platform cuda > "$out/$phase.log" 2>&1 ;;
        *) echo "sglang_golden.sh: unknown phase $phase" >&2; false ;;
    esac
    echo "$phase: rc $?, $(( $(date +%s) - s )) s" | tee -a "$out/phases.log"
    tail -n 25 "$out/$phase.log" | cut -c1-400
done
