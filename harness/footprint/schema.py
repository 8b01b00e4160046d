"""The footprint document: its file names and what a valid one holds (gate half, stdlib).

``RUN_DIR/footprint.json`` (postflight) and ``goldens/<w>/<platform>/FOOTPRINT.json`` (the
store) hold the same document::

    {"format": 1, "python": ["3.11.7"], "files": ["harness/model/qwen3_moe.py", ...],
     "dirs": ["harness/model", ...], "distributions": {"torch": "2.13.0+cpu", ...},
     "unresolved": [...], "processes": 14, "external": 120}

``problems(doc, where)`` lists what makes a document unusable, naming ``where`` and the
JSON pointer; ``[]`` when it is valid.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FORMAT", "GOLDEN_FILE", "RUN_FILE", "problems"]

FORMAT = 1
RUN_FILE = "footprint.json"
GOLDEN_FILE = "FOOTPRINT.json"

_KEYS = {"format", "python", "files", "dirs", "distributions", "unresolved", "processes", "external"}


def problems(doc: Any, where: str) -> list[str]:
    if not isinstance(doc, dict):
        return [f"{where}: not a JSON object"]
    out = []
    if set(doc) != _KEYS:
        missing, extra = sorted(_KEYS - set(doc)), sorted(set(doc) - _KEYS)
        out.append(f"{where}: keys must be exactly {sorted(_KEYS)} (missing {missing}, unknown {extra})")
        return out
    if doc["format"] != FORMAT:
        out.append(f"{where}#/format: {doc['format']!r}, this harness reads {FORMAT}")
    for key in ("python", "files", "dirs", "unresolved"):
        value = doc[key]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            out.append(f"{where}#/{key}: must be a list of strings")
        elif value != sorted(set(value)):
            out.append(f"{where}#/{key}: must be sorted and without duplicates")
    if not doc["python"] if isinstance(doc["python"], list) else False:
        out.append(f"{where}#/python: empty (the interpreter version is part of the footprint)")
    dists = doc["distributions"]
    if not isinstance(dists, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in dists.items()):
        out.append(f"{where}#/distributions: must map distribution names to version strings")
    for key in ("processes", "external"):
        if not isinstance(doc[key], int) or isinstance(doc[key], bool) or doc[key] < 0:
            out.append(f"{where}#/{key}: must be a non-negative integer")
    if isinstance(doc.get("files"), list) and any(f.startswith("/") or ".." in f.split("/") for f in doc["files"]):
        out.append(f"{where}#/files: paths must be repository-relative")
    return out
