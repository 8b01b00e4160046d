"""Footprints: which files a golden's run can depend on, and which goldens a change can affect.

* ``recorder`` (every process of a run, stdlib only): an audit hook records every file the
  process opens and every directory it lists; ``bind`` writes them, with every module file in
  ``sys.modules``, to ``RUN_DIR/footprint/<pid>-<n>.paths`` (appended as they happen, so a
  killed process loses nothing it already did).
* ``merge`` (postflight, gate half): the per-process files -> ``RUN_DIR/footprint.json``:
  repository-relative files and listed directories, third-party code as distribution
  names and versions, the interpreter version.
* ``affected`` (gate half): the workloads a change since a git revision can affect
  (``golden affected BASE``, ``pytest --golden-since=BASE``; docs/gate.md, "Affected goldens").

The gate modules (``merge``, ``affected``, ``schema``) never import torch or ray.
"""
