#!/usr/bin/env bash
# Sourced on the GPU machine (ci/gpu/sglang_run.sh, ci/gpu/sglang_golden.sh): install the
# SGLang wheels that earlier calls copied into /tmp/wheels (ci/gpu/sglang_wheels.sh's chunks)
# into /tmp/sgl-site once per machine; EXTRA_DIR's wheels (transformers 5.12.1, SGLang 0.5.17's
# pin) when the image has another transformers; RAY_WHEEL_DIR's ray wheel when given (a
# GRPO run needs Ray; the SGLang closure leaves it out). Exports PYTHONPATH and the run's
# determinism variables; sets out=${OUT:-/tmp/device-out} and logs the install's seconds to
# $out/phases.log. Sourced from the checkout root.
out=${OUT:-/tmp/device-out}
mkdir -p "$out"
install_start=$(date +%s)
export WHEELS_DIR=/tmp/wheels SITE_DIR=/tmp/sgl-site
source ci/gpu/install.sh || return 2
image_tf=$(cd /tmp && env -u PYTHONPATH python3 -c "import transformers; print(transformers.__version__)")
echo "image transformers: $image_tf"
if [ "$image_tf" != "5.12.1" ] && [ -n "${EXTRA_DIR:-}" ] && [ ! -f "$SITE_DIR/.extra-installed" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE_DIR" "$EXTRA_DIR"/*.whl \
        && touch "$SITE_DIR/.extra-installed"
fi
if [ -n "${RAY_WHEEL_DIR:-}" ] && [ ! -f "$SITE_DIR/.ray-installed" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE_DIR" "$RAY_WHEEL_DIR"/ray-*.whl \
        && touch "$SITE_DIR/.ray-installed"
fi
export PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 TOKENIZERS_PARALLELISM=false NCCL_NVLS_ENABLE=0
echo "install: $(( $(date +%s) - install_start )) s" | tee -a "$out/phases.log"
