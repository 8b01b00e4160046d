"""Counting operators in C++: a RecordFunction callback, built on first use.

``torch.profiler`` (CPU activity) observes operators through ATen's
RecordFunction callbacks, then keeps a timed event per call and turns every
event into Python objects when it stops. For the golden workloads, whose steps
are hundreds of thousands of tiny ops, that costs ~10x the step itself (see
docs/plugins.md section 5). An operator inventory needs only *name -> count*:
this module registers a thread-local RecordFunction callback (the same
observation point, the same names, the same thread-local-state propagation
into autograd threads) that only increments a counter. Measured overhead on
the smoke workload's generation: ~1.2x instead of ~10x.

The callback lives in a ~100-line C++ file (``SOURCE``) compiled against the
installed torch on first use, with the system C++ compiler, and cached under
``HARNESS_TRACE_BUILD_DIR`` (default ``$XDG_CACHE_HOME/harness-trace`` or
``~/.cache/harness-trace``), keyed by the source and the torch build. It has no
Python API (plain ``extern "C"`` functions loaded with ``ctypes``), so the build
needs only torch's headers and libraries, not Python headers, pybind11 or
ninja: ~3 s with g++ 12. Concurrent builders (several workers starting at once)
serialise on an ``flock`` and publish with an atomic rename, so a killed build
never blocks a later one. When no compiler is available :func:`load` raises
:class:`OpCountUnavailable` and the trace profilers fall back to the
``torch.profiler`` source, which yields the same inventory (slowly).

Semantics: every RecordFunction *entry* observed on the starting thread (and on
threads that inherit its thread-local state, e.g. autograd device threads)
between ``start`` and ``stop``, all scopes, named as ``RecordFunction::name()``
(``aten::mm``, ``autograd::engine::evaluate_function: MmBackward0``,
``Optimizer.step#AdamW.step``, ``gloo:all_reduce``, ...), minus
:data:`IGNORED_NAMES`. Up to :data:`MAX_SESSIONS` sessions may be open at once
(nested phases on one thread each count everything in their own window).
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import torch

BUILD_DIR_ENV = "HARNESS_TRACE_BUILD_DIR"
CXX_ENV = "CXX"
BUILD_TIMEOUT_S = 300
ABI_VERSION = 1
MAX_SESSIONS = 8

# Utility events torch.profiler's own aggregation drops (torch.autograd.profiler_util
# ._filter_name), plus our instrumentation; applied to every operator source alike.
IGNORED_NAMES = frozenset({
    "[memory]",
    "[OutOfMemory]",
    "profiler::_record_function_enter",
    "profiler::_record_function_enter_new",
    "profiler::_record_function_exit",
    "aten::is_leaf",
    "aten::output_nr",
    "aten::_version",
    "PythonDispatchMode",
})

SOURCE = r"""
// harness/profiler/opcount.py: RecordFunction name -> entry count, per session slot.
#include <ATen/record_function.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

constexpr int kSlots = 8;
enum SlotState : int { kFree = 0, kActive = 1, kStale = 2 };

struct Slot {
  std::atomic<int> state{kFree};
  std::mutex mu;  // guards counting, counts, by_ptr, snapshot
  bool counting = false;
  std::unordered_map<std::string, int64_t> counts;
  // Name pointer -> its entry in counts (element references survive rehashing), so
  // the common case neither allocates a key nor hashes the text. A hit is checked
  // by comparing the text: a name's storage may be reused for another name.
  std::unordered_map<const char*, std::pair<const std::string*, int64_t*>> by_ptr;
  std::vector<std::pair<std::string, int64_t>> snapshot;
  at::CallbackHandle handle = 0;
};

inline const char* c_str_of(const char* s) { return s; }
inline const char* c_str_of(const std::string& s) { return s.c_str(); }

std::array<Slot, kSlots> g_slots;
std::mutex g_api;

// One callback per slot: RecordFunction callbacks carry no user data.
template <int K>
std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& fn) {
  Slot& s = g_slots[K];
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.counting) return nullptr;
  auto&& raw = fn.name();
  const char* name = c_str_of(raw);
  auto hit = s.by_ptr.find(name);
  if (hit != s.by_ptr.end() && std::strcmp(hit->second.first->c_str(), name) == 0) {
    ++*hit->second.second;
    return nullptr;
  }
  auto& entry = *s.counts.try_emplace(name, 0).first;
  ++entry.second;
  s.by_ptr[name] = {&entry.first, &entry.second};
  return nullptr;
}

using StartFn = std::unique_ptr<at::ObserverContext> (*)(const at::RecordFunction&);
const StartFn kStart[kSlots] = {&on_enter<0>, &on_enter<1>, &on_enter<2>, &on_enter<3>,
                                &on_enter<4>, &on_enter<5>, &on_enter<6>, &on_enter<7>};

}  // namespace

extern "C" {

int harness_opcount_abi_version() { return 1; }

int harness_opcount_slots() { return kSlots; }

// Registers a thread-local callback on the calling thread; returns the slot or -1.
int harness_opcount_start() {
  std::lock_guard<std::mutex> api(g_api);
  for (int k = 0; k < kSlots; ++k) {
    Slot& s = g_slots[k];
    if (s.state.load() != kFree) continue;
    {
      std::lock_guard<std::mutex> lock(s.mu);
      s.counts.clear();
      s.by_ptr.clear();
      s.snapshot.clear();
      s.counting = true;
    }
    s.handle = at::addThreadLocalCallback(
        at::RecordFunctionCallback(kStart[k]).needsInputs(false).needsOutputs(false).needsIds(false));
    s.state.store(kActive);
    return k;
  }
  return -1;
}

// Stops counting and snapshots the counts; returns the number of entries (-1: bad slot).
// remove != 0 removes the callback (must run on the starting thread); otherwise the
// slot is retired (its callback stays registered on the starting thread, inert).
int64_t harness_opcount_stop(int k, int remove) {
  std::lock_guard<std::mutex> api(g_api);
  if (k < 0 || k >= kSlots) return -1;
  Slot& s = g_slots[k];
  if (s.state.load() != kActive) return -1;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.counting = false;
    s.snapshot.assign(s.counts.begin(), s.counts.end());
    s.by_ptr.clear();
    s.counts.clear();
  }
  if (remove) {
    at::removeCallback(s.handle);
    s.state.store(kFree);
  } else {
    s.state.store(kStale);
  }
  return static_cast<int64_t>(s.snapshot.size());
}

// Entry i of slot k's last snapshot; 0 on success.
int harness_opcount_entry(int k, int64_t i, const char** name, int64_t* count) {
  if (k < 0 || k >= kSlots) return -1;
  Slot& s = g_slots[k];
  std::lock_guard<std::mutex> lock(s.mu);
  if (i < 0 || i >= static_cast<int64_t>(s.snapshot.size())) return -1;
  *name = s.snapshot[i].first.c_str();
  *count = s.snapshot[i].second;
  return 0;
}

}  // extern "C"
"""


class OpCountUnavailable(RuntimeError):
    """The C++ operator counter could not be built or loaded (the reason is the message)."""


_lib: ctypes.CDLL | None = None
_lib_error: str | None = None
_lib_lock = threading.Lock()
_api_lock = threading.Lock()


def _torch_dirs() -> tuple[Path, Path]:
    root = Path(torch.__file__).resolve().parent
    return root / "include", root / "lib"


def _compiler() -> str | None:
    explicit = os.environ.get(CXX_ENV)
    if explicit:
        return shutil.which(explicit) or explicit
    for name in ("c++", "g++", "clang++"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _compile_command(cxx: str, src: Path, out: Path) -> list[str]:
    include, lib = _torch_dirs()
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    cmd = [
        cxx, "-O2", "-std=c++20", "-shared", "-fPIC", "-w",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        "-isystem", str(include),
        str(src), "-o", str(out),
        f"-L{lib}", f"-Wl,-rpath,{lib}", "-lc10", "-ltorch_cpu",
    ]
    if sys.platform == "darwin":
        cmd[cmd.index("-shared")] = "-dynamiclib"
        cmd.remove(f"-Wl,-rpath,{lib}")
        cmd += ["-undefined", "dynamic_lookup", f"-Wl,-rpath,{lib}"]
    return cmd


def build_dir() -> Path:
    explicit = os.environ.get(BUILD_DIR_ENV)
    if explicit:
        return Path(explicit)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "harness-trace"


def library_path(cxx: str) -> Path:
    """Where the counter built by ``cxx`` for this torch lives (keyed by source and torch build)."""
    include, _ = _torch_dirs()
    key = "\n".join([
        SOURCE, str(ABI_VERSION), torch.__version__, str(getattr(torch.version, "git_version", "")),
        str(include), cxx, platform.machine(), sys.platform,
    ])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return build_dir() / f"opcount-{digest}.so"


def _build(cxx: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released by the kernel if this process dies
        if target.exists():
            return  # another process built it while we waited
        src = target.with_suffix(f".{os.getpid()}.cpp")
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        try:
            src.write_text(SOURCE, encoding="utf-8")
            proc = subprocess.run(
                _compile_command(cxx, src, tmp), capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
            )
            if proc.returncode != 0:
                raise OpCountUnavailable(
                    f"compiling the operator counter with {cxx} failed (exit {proc.returncode}): "
                    f"{(proc.stderr or proc.stdout).strip()[-800:]}"
                )
            os.replace(tmp, target)
        finally:
            for path in (src, tmp):
                try:
                    path.unlink()
                except FileNotFoundError:
                    pass


def load() -> ctypes.CDLL:
    """The counter library, built if needed; raises :class:`OpCountUnavailable` (cached per process)."""
    global _lib, _lib_error
    with _lib_lock:
        if _lib is not None:
            return _lib
        if _lib_error is not None:
            raise OpCountUnavailable(_lib_error)
        try:
            if sys.platform.startswith("win"):
                raise OpCountUnavailable("the operator counter is not built on Windows")
            cxx = _compiler()
            if cxx is None:
                raise OpCountUnavailable(f"no C++ compiler found (set {CXX_ENV}, or install g++/clang++)")
            target = library_path(cxx)
            if not target.exists():
                _build(cxx, target)
            lib = ctypes.CDLL(str(target))
            lib.harness_opcount_abi_version.restype = ctypes.c_int
            if lib.harness_opcount_abi_version() != ABI_VERSION:
                raise OpCountUnavailable(f"{target}: unexpected ABI version")
            lib.harness_opcount_start.restype = ctypes.c_int
            lib.harness_opcount_stop.restype = ctypes.c_int64
            lib.harness_opcount_stop.argtypes = [ctypes.c_int, ctypes.c_int]
            lib.harness_opcount_entry.restype = ctypes.c_int
            lib.harness_opcount_entry.argtypes = [
                ctypes.c_int, ctypes.c_int64, ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_int64),
            ]
        except OpCountUnavailable as exc:
            _lib_error = str(exc)
            raise
        except (OSError, subprocess.SubprocessError) as exc:
            _lib_error = f"building or loading the operator counter failed: {exc!r}"
            raise OpCountUnavailable(_lib_error) from exc
        _lib = lib
        return lib


class OpCountBusy(RuntimeError):
    """All counter sessions are in use in this process."""


class RecordFunctionCounter:
    """One counting window: ``start()`` on a thread, ``stop()`` on the same thread."""

    def __init__(self) -> None:
        self._lib = load()
        self._slot: int | None = None
        self._thread: int | None = None

    @property
    def active(self) -> bool:
        return self._slot is not None

    def start(self) -> None:
        if self._slot is not None:
            raise RuntimeError("operator counter already started")
        with _api_lock:
            slot = self._lib.harness_opcount_start()
        if slot < 0:
            raise OpCountBusy(f"all {MAX_SESSIONS} operator-counter sessions are in use in this process")
        self._slot, self._thread = slot, threading.get_ident()

    def stop(self) -> tuple[dict[str, int], str | None]:
        """``(counts sorted by name, problem or None)``. Counting stops even on the wrong thread."""
        if self._slot is None:
            return {}, "operator counter was not started"
        same_thread = self._thread == threading.get_ident()
        problem = None if same_thread else (
            "operator counter stopped on a different thread than it was started on "
            "(its callback stays registered, inert, on the starting thread)"
        )
        slot, self._slot, self._thread = self._slot, None, None
        counts: dict[str, int] = {}
        with _api_lock:
            n = self._lib.harness_opcount_stop(slot, 1 if same_thread else 0)
            name, count = ctypes.c_char_p(), ctypes.c_int64()
            for i in range(max(n, 0)):
                if self._lib.harness_opcount_entry(slot, i, ctypes.byref(name), ctypes.byref(count)) == 0:
                    key = (name.value or b"").decode("utf-8", "replace")
                    if key not in IGNORED_NAMES:
                        counts[key] = counts.get(key, 0) + int(count.value)
        return dict(sorted(counts.items())), problem
