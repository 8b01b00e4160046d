#!/usr/bin/env bash
# Wheels of SGLang 0.5.17 for the GPU machine without network (docs/sglang.md "On the GPU"):
# sglang==0.5.17 (torch==2.11.0, the machine's torch) with its closure minus what the image
# holds (ci/gpu/closure.py, ci/gpu/installed.txt), plus the harness's light wheels it lacks
# (jsonschema, deepdiff, ... from LIGHT_DIR; no ray, no megatron-core), for CPython 3.12 /
# manylinux x86-64. sglang-kernel is repacked without sgl_kernel/flash_ops.abi3.so (the FA3
# library, 326 MiB of 365: the harness runs SGLang on its Triton attention backend) and
# without sgl_kernel/sm100 (Blackwell; the machines here are Hopper).
#
#   ci/gpu/sglang_wheels.sh OUT_DIR [LIGHT_DIR] [CHUNK_MIB]
#
# Writes OUT_DIR/whl/*.whl, OUT_DIR/chunk/wheels.tar.NN and OUT_DIR/chunk/wheels.sha256, the
# layout ci/gpu/install.sh reads. OUT_DIR must be ignored by git; never commit wheels.
set -euo pipefail
out=${1:?usage: ci/gpu/sglang_wheels.sh OUT_DIR [LIGHT_DIR] [CHUNK_MIB]}
light=${2:-}
chunk_mib=${3:-55}
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
mkdir -p "$out/whl" "$out/chunk"
"$py" "$here/closure.py" "$out/whl" "sglang==0.5.17"
"$py" - "$out/whl" <<'PYEOF'
import pathlib, sys, zipfile
for wheel in pathlib.Path(sys.argv[1]).glob("sglang_kernel-*.whl"):
    slim = wheel.with_suffix(".slim")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if info.filename in ("sgl_kernel/flash_ops.abi3.so",) or info.filename.startswith("sgl_kernel/sm100/"):
                continue
            dst.writestr(info, src.read(info))
    slim.replace(wheel)
    print(f"sglang_wheels: {wheel.name} repacked, {wheel.stat().st_size >> 20} MiB")
PYEOF
if [ -n "$light" ]; then  # the harness's own light dependencies, minus ray and megatron-core
    for w in "$light"/*.whl; do
        case $(basename "$w") in ray-*|megatron_core-*) ;; *) cp -n "$w" "$out/whl/" ;; esac
    done
fi
rm -f "$out"/chunk/wheels.tar.*
tar -C "$out" -cf - whl | split -b "${chunk_mib}M" -d - "$out/chunk/wheels.tar."
(cd "$out/chunk" && sha256sum wheels.tar.* > wheels.sha256)
echo "sglang_wheels: $(ls "$out"/whl | wc -l) wheels, $(du -sm "$out/whl" | cut -f1) MiB, $(ls "$out"/chunk/wheels.tar.* | wc -l) chunks of ${chunk_mib} MiB in $out/chunk"
