"""Download the wheels a GPU machine without network lacks (``ci/gpu/wheels.sh`` calls this).

Walks the dependency graph breadth first from the root requirements: every
requirement whose project the machine already holds (``installed.txt``) or
that a text run never imports (``SKIP``) is left out; every other one is
fetched once with ``pip download --no-deps`` for the machine's interpreter
(CPython 3.12, manylinux x86-64) and its own ``Requires-Dist`` lines are
queued (markers evaluated for that interpreter, with the extras asked for).
``PINS`` override the first specifier seen for a project. One version per
project: the first one fetched wins, and a later, different specifier is
reported, not fetched (two versions of one project stop the whole install).

No resolver: the machine's own packages are taken as they are (the closure
was shown to import and generate with them; docs/gpu.md).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import zipfile
from collections import deque
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

HERE = Path(__file__).resolve().parent
PLATFORMS = ["manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_24_x86_64", "manylinux_2_27_x86_64",
             "manylinux_2_28_x86_64", "manylinux_2_31_x86_64", "manylinux_2_34_x86_64", "manylinux_2_35_x86_64",
             "manylinux1_x86_64", "linux_x86_64"]
SKIP = {  # a text generation run never imports these (measured 2026-12-01); 250 MB saved
    "tokenspeed-triton", "nvidia-cutlass-dsl-libs-cu12", "tilelang", "z3-solver", "nvidia-cuda-nvdisasm",
    # video/audio decoding and the CUDA compiler wheels of humming-kernels' cu13 extra
    # (the image has its own nvcc); left out here, 170 MB
    "pynvvideocodec", "torchcodec", "nvidia-cuda-nvcc", "nvidia-nvvm",
}
ALSO_SKIP = {  # the machine's torch build and its CUDA libraries, under the names vLLM's metadata uses
    "torch", "torchaudio", "torchvision", "triton", "nvidia-nccl-cu13", "nvidia-cudnn-cu13",
}
PINS = {  # xgrammar 0.2.9 fails against the apache-tvm-ffi 0.1.10 vLLM pins; 0.2.1 works
    "xgrammar": "xgrammar==0.2.1",
}


def environment() -> dict[str, str]:
    env = default_environment()
    env.update(python_version="3.12", python_full_version="3.12.3", implementation_name="cpython",
               platform_python_implementation="CPython", sys_platform="linux", platform_system="Linux",
               platform_machine="x86_64", os_name="posix")
    return env


def installed_names(path: Path) -> set[str]:
    lines = [ln.strip() for ln in path.read_text().splitlines()]
    return {canonicalize_name(ln) for ln in lines if ln and not ln.startswith("#")}


def wheel_requirements(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(meta).decode("utf-8", "replace")
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


def download(requirement: str, dest: Path) -> Path:
    before = set(dest.glob("*.whl"))
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312", "--abi", "abi3",
           "--abi", "none", "-d", str(dest), requirement]
    for platform in PLATFORMS:
        cmd[5:5] = ["--platform", platform]
    subprocess.run(cmd, check=True)
    new = set(dest.glob("*.whl")) - before
    if not new:  # already there from an earlier run: find it by project name
        stem = re.sub(r"[-_.]+", "_", Requirement(requirement).name).lower()
        new = {w for w in dest.glob("*.whl") if w.name.lower().startswith(stem + "-")}
    if len(new) != 1:
        raise SystemExit(f"closure: pip download {requirement!r} gave {sorted(p.name for p in new)}")
    return new.pop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dest", type=Path)
    ap.add_argument("roots", nargs="+", help="root requirements, e.g. vllm==0.26.0")
    ap.add_argument("--installed", type=Path, default=HERE / "installed.txt")
    args = ap.parse_args(argv)
    args.dest.mkdir(parents=True, exist_ok=True)
    have = installed_names(args.installed) | {canonicalize_name(n) for n in SKIP | ALSO_SKIP}
    env = environment()
    fetched: dict[str, str] = {}
    queue = deque((Requirement(r), ()) for r in args.roots)
    scanned: set[tuple[str, tuple[str, ...]]] = set()
    while queue:
        req, extras = queue.popleft()
        name = canonicalize_name(req.name)
        if (name, tuple(sorted(req.extras))) in scanned:
            continue
        if req.marker is not None and not any(req.marker.evaluate({**env, "extra": e}) for e in (extras or ("",))):
            continue
        if name in have:
            continue
        text = PINS.get(name, f"{req.name}{req.specifier}")
        if name in fetched:
            if str(req.specifier) and fetched[name] != text:
                print(f"closure: {name}: kept {fetched[name]!r}, also asked for {text!r}", file=sys.stderr)
            wheel = None
        else:
            wheel = download(text, args.dest)
            fetched[name] = text
            print(f"closure: {wheel.name}", file=sys.stderr)
        if wheel is None and not req.extras:
            continue
        scanned.add((name, tuple(sorted(req.extras))))
        wheel = wheel or next(w for w in args.dest.glob("*.whl")
                              if canonicalize_name(w.name.split("-")[0]) == name)
        for line in wheel_requirements(wheel):
            queue.append((Requirement(line), tuple(sorted(req.extras))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
