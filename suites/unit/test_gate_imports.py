"""The gate half never imports torch or ray, not even transitively (checked in a fresh interpreter)."""

from __future__ import annotations

import json
import subprocess
import sys

GATE_PACKAGES = ["harness.spec", "harness.registry", "harness.manifest", "harness.surfaces", "harness.parity",
                 "harness.store", "harness.artifacts", "harness.postflight", "harness.cli", "harness.pytest_plugin",
                 "harness.footprint", "harness.pytest_since"]

PROBE = r"""
import importlib, json, pkgutil, sys
offenders, imported = [], []
for name in sys.argv[1:]:
    module = importlib.import_module(name)
    names = [name] + ([m.name for m in pkgutil.walk_packages(module.__path__, name + ".")]
                      if hasattr(module, "__path__") else [])
    for sub in names:
        importlib.import_module(sub)
        imported.append(sub)
        heavy = sorted(m for m in ("torch", "ray") if m in sys.modules)
        if heavy:
            offenders.append([sub, heavy])
            for m in list(sys.modules):
                if m.split(".")[0] in ("torch", "ray"):
                    del sys.modules[m]
print(json.dumps({"imported": imported, "offenders": offenders}))
"""


def test_gate_modules_import_neither_torch_nor_ray():
    proc = subprocess.run([sys.executable, "-c", PROBE, *GATE_PACKAGES], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "harness.parity.comparison" in report["imported"] and "harness.store.atomic" in report["imported"]
    assert report["offenders"] == [], f"gate modules that pull in torch/ray: {report['offenders']}"
