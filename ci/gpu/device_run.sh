#!/usr/bin/env bash
# On the GPU machine, from a copy of this tree: install the carried wheels
# (ci/gpu/install.sh) and run the named phases in order, each under its own
# time limit, with its log in $OUT/<phase>.log and one line per phase
# (exit status, seconds) in $OUT/phases.log. docs/gpu.md lists the phases.
#
#   ci/gpu/device_run.sh env unit refit      # then: native; vllm; capture; check; before; smoke-check
#   LIGHT_WHEELS=.gpuwheels GOLDEN_REASON=... ci/gpu/device_run.sh gpu-tests refresh:W check:W   # no vLLM
#   BENCH_VLLM_ARGS='--arms native,async,hf --repeat 1' BENCH_VLLM_TIMEOUT=150 ci/gpu/device_run.sh vllm
set -uo pipefail
cd "$(dirname "$0")/../.."
source ci/gpu/install.sh || exit 2
if [ -n "${EXTRA_WHEELS:-}" ] && [ ! -f /tmp/site/.extra-installed ]; then  # e.g. megatron-core for its golden
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $EXTRA_WHEELS \
        && touch /tmp/site/.extra-installed || exit 2
fi
export PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 TOKENIZERS_PARALLELISM=false
out=${OUT:-/tmp/device-out}
keep=/tmp/golden-keep   # survives between calls while the machine stays warm
mkdir -p "$out" "$keep"
W=qwen3_moe_medium_vllm
for phase in "$@"; do
    start=$(date +%s)
    case $phase in
        env) timeout 120 bash -c 'nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; df -h /dev/shm /tmp;
             python3 -c "import torch, vllm, ray, zmq, jsonschema, deepdiff; from vllm import LLM;
print(\"torch\", torch.__version__, \"vllm\", vllm.__version__, \"ray\", ray.__version__, torch.cuda.get_device_name(0))"' ;;
        unit) timeout 180 python3 -m pytest -q -p no:cacheprovider suites/unit/test_refit_cuda_ipc.py \
                  suites/unit/test_refit_zmq.py suites/unit/test_vllm_cuda_config.py \
                  suites/unit/test_decode_probe_device.py suites/unit/test_grouped_experts.py ;;
        unit-refit) timeout 180 python3 -m pytest -q -p no:cacheprovider suites/unit/test_refit_cuda_ipc.py \
                        suites/unit/test_refit_zmq.py suites/unit/test_refit_staging.py \
                        suites/unit/test_vllm_cuda_config.py ;;
        native) timeout 330 python3 benches/native_gpu_bench.py --repeat 1 --per-request --profile \
                    --out "$out/native_gpu_bench.json" ;;
        capture:*) w=${phase#capture:}   # GOLDEN_REASON: the capture's --reason
                   timeout 580 python3 -m harness.cli capture "$w" --platform cuda --reason "$GOLDEN_REASON" \
                   && rm -rf "$keep/$w" && cp -r "goldens/$w/cuda" "$keep/$w" \
                   && tar -C "goldens/$w" -cf "$out/golden_$w.tar" cuda ;;
        refresh:*) w=${phase#refresh:}   # GOLDEN_REASON: the refresh's --reason
                   timeout 580 python3 -m harness.cli refresh "$w" --platform cuda --reason "$GOLDEN_REASON" \
                       --run-dir "/tmp/refresh-$w" \
                   && rm -rf "$keep/$w" && cp -r "goldens/$w/cuda" "$keep/$w" \
                   && tar -C "goldens/$w" -cf "$out/golden_$w.tar" cuda;
                   find "/tmp/refresh-$w" -name 'timings.json' -path '*surfaces*' | tar -cf "$out/refresh_run_$w.tar" -T - ;;
        gpu-tests) timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu ${GPU_TESTS:-suites/unit} ;;
        bench-native) timeout 330 python3 benches/native_gpu_bench.py ${BENCH_NATIVE_ARGS:---repeat 1} \
                          --out "$out/native_gpu_bench.json" ;;
        check:*) w=${phase#check:}
                 { [ ! -d "$keep/$w" ] || { rm -rf "goldens/$w/cuda" && cp -r "$keep/$w" "goldens/$w/cuda"; }; } \
                 && rd=$(mktemp -d "/tmp/run-$w-XXXX") \
                 && timeout 580 python3 -m harness.cli check "$w" --platform cuda --run-dir "$rd";
                 find "$rd" -name 'timings.json' -path '*surfaces*' | tar -cf "$out/run_$w-${rd##*-}.tar" -T - ;;
        refit) timeout 300 python3 benches/refit_cuda_ipc_bench.py --floor --out "$out/refit_bench.json" ;;
        vllm) timeout "${BENCH_VLLM_TIMEOUT:-560}" python3 benches/vllm_gpu_bench.py \
                  ${BENCH_VLLM_ARGS:---batch 8 --new-tokens 32 --repeat 2} --out "$out/vllm_gpu_bench.json" ;;
        capture) timeout 580 python3 -m harness.cli capture $W --platform cuda \
                     --reason "first capture on one H200: official vLLM 0.26.0 async engine, CUDA IPC refit (issue 24)" \
                 && rm -rf "$keep/$W" && cp -r goldens/$W/cuda "$keep/$W" \
                 && tar -C goldens/$W -cf "$out/golden_$W.tar" cuda ;;
        check) { [ -d goldens/$W/cuda ] || cp -r "$keep/$W" goldens/$W/cuda; } \
               && timeout 580 python3 -m harness.cli check $W --platform cuda --run-dir /tmp/run-check;
               find /tmp/run-check -name 'timings.json' -o -name 'manifest.json' | tar -cf "$out/check_run.tar" -T - ;;
        smoke-check) timeout 300 python3 -m harness.cli check qwen3_moe_tiny_smoke --platform cuda \
                         --run-dir /tmp/run-smoke;
                     find /tmp/run-smoke -name '*.json' -path '*surfaces*' | tar -cf "$out/smoke_run.tar" -T - ;;
        before) { [ -d goldens/$W/cuda ] || cp -r "$keep/$W" goldens/$W/cuda; } \
                && HARNESS_REFIT_STAGING=host timeout 330 python3 -m harness.cli check $W --platform cuda --run-dir /tmp/run-before;
                find /tmp/run-before -name 'timings.json' -o -name 'manifest.json' | tar -cf "$out/before_run.tar" -T - ;;
        *) echo "device_run.sh: unknown phase $phase"; false ;;
    esac > "$out/${phase//:/_}.log" 2>&1
    rc=$?
    echo "phase $phase: rc $rc, $(( $(date +%s) - start )) s" | tee -a "$out/phases.log"
    tail -n 25 "$out/${phase//:/_}.log"
done
