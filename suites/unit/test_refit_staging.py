"""Refit staging buffers: a file system that cannot hold one is a clear error, not a SIGBUS.

The full file system is made with RLIMIT_FSIZE in a child process (SIGXFSZ
ignored, so the allocation fails with EFBIG instead of killing it): the same
failure path as a full ``/dev/shm``, which a test cannot mount without privileges.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from harness.refit.staging import STAGING_DIR_ENV, StagingBuffer, default_staging_dir, open_staging

REPO = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent("""
    import os, resource, signal, sys
    from harness.refit.staging import StagingBuffer, StagingSpaceError
    directory = sys.argv[1]
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    small = StagingBuffer.create(512 << 10, directory)
    small.tensor.fill_(7)  # every page of a buffer that fits is writable
    assert int(small.tensor.sum()) == 7 * (512 << 10)
    small.release()
    try:
        StagingBuffer.create(4 << 20, directory)
    except StagingSpaceError as exc:
        print("ERROR", exc)
    print("LEFT", sorted(os.listdir(directory)))
""")


def test_a_buffer_that_does_not_fit_is_refused_and_leaves_no_file(tmp_path):
    proc = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"ERROR refit staging buffer of {4 << 20} bytes does not fit in {tmp_path}")
    assert STAGING_DIR_ENV in lines[0] and "--shm-size" in lines[0]
    assert lines[1] == "LEFT []"


def test_the_staging_dir_can_be_chosen(tmp_path, monkeypatch):
    monkeypatch.setenv(STAGING_DIR_ENV, str(tmp_path))
    assert default_staging_dir() == str(tmp_path)
    buf = StagingBuffer.create(1000)
    try:
        assert Path(buf.path).parent == tmp_path and os.path.getsize(buf.path) == 1000
        buf.tensor.copy_(buf.tensor.new_tensor(list(range(256)) * 3 + [0] * 232))
        seen = open_staging(buf.handle())  # another mapping of the same file sees the bytes
        assert int(seen[255]) == 255 and int(seen[999]) == 0
    finally:
        buf.release()
    assert os.listdir(tmp_path) == []
