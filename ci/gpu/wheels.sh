#!/usr/bin/env bash
# Wheels for a GPU machine without network (docs/gpu.md, "Carrying vLLM"):
# the pinned vLLM and the harness's own dependencies, minus what the machine's
# image already holds (ci/gpu/installed.txt) and what a text run never imports
# (ci/gpu/closure.py SKIP), for CPython 3.12 / manylinux x86-64; ray repacked
# without its Java jars and the dashboard's source maps; all packed into one
# tar and split into chunks small enough for one device call each.
#
#   ci/gpu/wheels.sh OUT_DIR [CHUNK_MIB]
#
# Writes OUT_DIR/whl/*.whl, OUT_DIR/chunk/wheels.tar.NN (CHUNK_MIB each,
# default 55) and OUT_DIR/chunk/wheels.sha256. OUT_DIR must be ignored by git
# (e.g. a folder listed in .git/info/exclude); never commit wheels.
set -euo pipefail
out=${1:?usage: ci/gpu/wheels.sh OUT_DIR [CHUNK_MIB]}
chunk_mib=${2:-55}
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
mkdir -p "$out/whl" "$out/chunk"
"$py" "$here/closure.py" "$out/whl" "vllm==0.26.0" "ray==2.60.0" "deepdiff>=8" "jsonschema>=4.18" "pyzmq>=25"
# ray without ray/jars (Java workers) and *.map source maps: 79 MB -> 46 MB
"$py" - "$out/whl" <<'EOF'
import pathlib, sys, zipfile
for wheel in pathlib.Path(sys.argv[1]).glob("ray-*.whl"):
    slim = wheel.with_suffix(".slim")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if info.filename.startswith("ray/jars/") or info.filename.endswith(".map"):
                continue
            dst.writestr(info, src.read(info))
    slim.replace(wheel)
    print(f"wheels: {wheel.name} repacked, {wheel.stat().st_size >> 20} MiB")
EOF
rm -f "$out"/chunk/wheels.tar.*
tar -C "$out" -cf - whl | split -b "${chunk_mib}M" -d - "$out/chunk/wheels.tar."
(cd "$out/chunk" && sha256sum wheels.tar.* > wheels.sha256)
echo "wheels: $(ls "$out"/whl | wc -l) wheels, $(du -sm "$out/whl" | cut -f1) MiB, $(ls "$out"/chunk/wheels.tar.* | wc -l) chunks of ${chunk_mib} MiB in $out/chunk"
