"""Portable CPU numerics: one set of code paths on every x86-64 machine.

``pins`` (standard library) names the environment that fixes torch's and MKL's
kernel choices and sets it in the driver; ``kernels`` (torch) replaces the one
op the pins leave machine-dependent; ``canary`` (torch) hashes a battery of
kernels so a machine whose pinned bits differ is refused before any workload
runs; ``drift`` (standard library) stores and compares that battery.
"""

from __future__ import annotations

import os

__all__ = ["enter_process"]


def enter_process(device: str) -> bool:
    """Called where a worker process sets its determinism (one thread, deterministic kernels),
    before it computes anything: a process descending from a pinned driver
    (``pins.pinned_by_harness``) on the CPU gets the portable kernels
    (``kernels.activate``); True then. Raises RuntimeError naming the variables when such a
    process lost a pin on the way (a workload's ``plugins.env``, a launcher that rewrote its
    environment): its bits would be another machine's. Unpinned processes (cuda, vLLM, an
    aarch64 machine, ``GOLDEN_CPU_PINS=0``) are left as they are."""
    from harness.footprint import recorder
    from harness.portable import pins

    recorder.bind()  # what this process read goes into the run's footprint (harness.footprint)
    if device != "cpu" or not pins.pinned_by_harness():
        return False
    lost = pins.missing()
    if lost:
        named = ", ".join(f"{k}={v!r} (pinned: {pins.PINS[k]!r})" for k, v in sorted(lost.items()))
        raise RuntimeError(f"CPU numerics: this process (pid {os.getpid()}) descends from a pinned run but its "
                           f"environment changed the pins: {named}; its results would not be portable")
    from harness.portable import kernels

    kernels.activate()
    return True
