#!/usr/bin/env bash
# On the GPU machine: join the chunks that earlier device calls copied into
# /tmp/wheels (ci/gpu/receive.sh), check them, and install the wheels into
# /tmp/site (no index, no dependency resolution). Idempotent: a second call
# after a finished install does nothing. Source the printed exports.
#
#   source ci/gpu/install.sh         # sets PYTHONPATH and the vLLM variables
#   LIGHT_WHEELS=DIR source ci/gpu/install.sh   # a light run: DIR's wheels (carried in
#   the tree copy: ray, deepdiff, jsonschema, pyzmq, megatron-core, ...; no vLLM), no chunks
set -eu
dir=${WHEELS_DIR:-/tmp/wheels}
site=${SITE_DIR:-/tmp/site}
if [ -n "${LIGHT_WHEELS:-}" ] && [ ! -f "$site/.harness-installed" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$LIGHT_WHEELS"/*.whl
    touch "$site/.harness-installed"
fi
if [ ! -f "$site/.harness-installed" ]; then
    (cd "$dir" && sha256sum -c --quiet wheels.sha256) || { echo "install.sh: chunks missing or damaged in $dir" >&2; return 2 2>/dev/null || exit 2; }
    rm -rf "$dir/whl" && cat "$dir"/wheels.tar.* | tar -C "$dir" -xf -
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$dir"/whl/*.whl
    rm -rf "$dir/whl"
    touch "$site/.harness-installed"
fi
set +eu
export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export RAY_AUTH_MODE=disabled VLLM_HOST_IP=127.0.0.1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
