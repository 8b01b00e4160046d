"""``golden list [--json]``: workloads, their scheduled platforms, stored goldens.

A golden for (workload, platform) exists when
``goldens/<workload>/<platform>/manifest.json`` exists. A workload with
``platform.platforms: []`` is *planned only* (e.g. a GPU-cluster job that
``golden plan`` lays out but no CI runs). Stored goldens for a platform the
workload does not schedule are listed as ``unscheduled``, and a stored golden
that ``read_golden`` refuses (edited, truncated, another schema version) as
``DAMAGED`` (``--json``: ``damaged`` maps its platform to the reason). A CPU-numerics
variant ``<platform>@<key>`` of a scheduled platform (``harness.store.variants``) is
listed as a variant of it (``--json``: ``variants``). Under each
workload, one line per readable golden gives its provenance: when it was captured,
the consumer repository's commit and dirty flag (or that there was none / it was
not recorded), and the versions of harness, Python, torch, megatron-core and vLLM
that produced it (``--json``: ``provenance`` maps the platform to
``harness.store.provenance.describe``). Exit 0, or 2 when a workload.yaml does
not load or a golden is damaged (the others are still listed).
"""

from __future__ import annotations

import argparse

HELP = "list golden workloads and their platforms"

MANIFEST = "manifest.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the listing as JSON")
    from harness.cli._options import add_goldens_root

    add_goldens_root(parser)


def collect(root) -> list[dict]:
    """One entry per workload folder: name, platforms, stored/missing/unscheduled
    goldens, description, error (``None`` when the spec loads)."""
    from harness.spec import SpecError, list_workloads, load_spec
    from harness.store.variants import base_platform

    entries = []
    for name in list_workloads(root):
        folder = root / name
        stored = sorted(p.name for p in folder.iterdir() if (p / MANIFEST).is_file())
        damaged, provenance = _read_stored(root, name, stored)
        entry = {"workload": name, "platforms": [], "stored": [], "missing": [], "unscheduled": stored, "variants": [],
                 "damaged": damaged, "provenance": provenance, "description": "", "error": None}
        try:
            spec = load_spec(name, goldens_root=root)
        except SpecError as exc:
            entry["error"] = str(exc)
            entries.append(entry)
            continue
        platforms = list(spec.platform.platforms)
        entry.update(
            platforms=platforms,
            stored=[p for p in platforms if p in stored],
            missing=[p for p in platforms if p not in stored],
            variants=[p for p in stored if p not in platforms and base_platform(p) in platforms],
            unscheduled=[p for p in stored if base_platform(p) not in platforms],
            description=" ".join(spec.description.split()),
        )
        entries.append(entry)
    return entries


def _read_stored(root, name: str, stored: list[str]) -> tuple[dict[str, str], dict[str, dict]]:
    """(damaged, provenance): the stored goldens ``read_golden`` refuses (what check/diff would
    report as unusable) with why, and the described provenance of the others."""
    from harness.store import GoldenStoreError, read_golden
    from harness.store.provenance import describe
    from harness.store.variants import manifest_key

    damaged, provenance = {}, {}
    for platform in stored:
        try:
            golden = read_golden(root, name, platform)
        except (GoldenStoreError, FileNotFoundError) as exc:
            damaged[platform] = str(exc)
            continue
        provenance[platform] = describe(golden.provenance)
        if golden.manifest.get("environment", {}).get("device") == "cpu":  # the machines it holds on
            provenance[platform]["cpu_numerics"] = manifest_key(golden.manifest)
    return damaged, provenance


def _provenance_lines(entry: dict) -> list[str]:
    from harness.store.provenance import repository_text, versions_text

    def numerics(d: dict) -> str:
        if "cpu_numerics" not in d:
            return ""
        return f"; CPU numerics {d['cpu_numerics'] or 'not recorded (an older golden)'}"

    return [f"    {platform}: captured {d['date']}, repository {repository_text(d)}; {versions_text(d)}{numerics(d)}"
            for platform, d in sorted(entry.get("provenance", {}).items())]


def _status(entry: dict) -> str:
    if entry["error"]:
        return "INVALID: " + entry["error"]

    def golden(p: str) -> str:
        return "DAMAGED (golden lint says why)" if p in entry["damaged"] else "golden"

    parts = [f"{p}: {golden(p)}" for p in entry["stored"]] + [f"{p}: MISSING" for p in entry["missing"]]
    parts += [f"{p}: {golden(p)} (CPU-numerics variant)" for p in entry.get("variants", [])]
    parts += [f"{p}: {golden(p)} (unscheduled)" for p in entry["unscheduled"]]
    if not entry["platforms"]:
        parts.insert(0, "planned only")
    return ", ".join(parts)


def run(args: argparse.Namespace) -> int:
    import json
    import sys

    from harness.spec.errors import SpecError
    from harness.spec.roots import resolve_goldens_root

    try:
        root = resolve_goldens_root(args.goldens_root)
    except SpecError as exc:  # a bad [tool.golden] table in pyproject.toml
        print(f"golden list: {exc}", file=sys.stderr)
        return 2
    if not root.is_dir():
        print(f"golden list: goldens root {root} is not a directory", file=sys.stderr)
        return 2
    entries = collect(root)
    if args.json:
        print(json.dumps({"goldens_root": str(root), "workloads": entries}, indent=1, sort_keys=True))
    else:
        width = max([len("WORKLOAD")] + [len(e["workload"]) for e in entries])
        pwidth = max([len("PLATFORMS")] + [len(",".join(e["platforms"]) or "-") for e in entries])
        print(f"{'WORKLOAD'.ljust(width)}  {'PLATFORMS'.ljust(pwidth)}  GOLDENS")
        for e in entries:
            print(f"{e['workload'].ljust(width)}  {(','.join(e['platforms']) or '-').ljust(pwidth)}  {_status(e)}")
            for line in _provenance_lines(e):
                print(line)
        print(f"{len(entries)} workloads in {root}")
    bad = [e["workload"] for e in entries if e["error"]]
    if bad:
        print(f"golden list: invalid workload spec(s): {', '.join(bad)}", file=sys.stderr)
    damaged = [f"{e['workload']}/{p}" for e in entries for p in e["damaged"]]
    if damaged:
        print(f"golden list: damaged golden(s), unusable until refreshed: {', '.join(damaged)}", file=sys.stderr)
    return 2 if bad or damaged else 0
