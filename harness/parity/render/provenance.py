"""The golden's provenance block of every report format (what produced the golden compared against).

One small function per format; each renderer appends its block when given the
golden's PROVENANCE.json document (``provenance=None``: no block, as before).
Fields shown (``harness.store.provenance.describe``): the consumer repository's
commit and dirty flag (or that there was none / it was not recorded), the date,
the harness version and the versions of Python, torch, megatron-core and vLLM
("absent" when the package was not installed).
"""

from __future__ import annotations

import html
import xml.etree.ElementTree as ET

from harness.store.provenance import describe, repository_text, versions_text

__all__ = ["provenance_html", "provenance_json", "provenance_lines", "provenance_markdown",
           "provenance_properties"]


def provenance_lines(provenance: dict | None) -> list[str]:
    """Terminal: two indented lines under a heading."""
    if provenance is None:
        return []
    d = describe(provenance)
    return ["", f"golden provenance: captured {d['date']}; repository {repository_text(d)}",
            f"  produced with {versions_text(d)}"]


def provenance_markdown(provenance: dict | None) -> list[str]:
    if provenance is None:
        return []
    d = describe(provenance)
    rows = [("repository", repository_text(d)), ("captured", str(d["date"]))]
    rows += [(k, v) for k, v in d["versions"].items()]
    out = ["", "**golden provenance**", "", "| | |", "|---|---|"]
    out += ["| " + k + " | " + v.replace("|", "\\|") + " |" for k, v in rows]
    return out


def provenance_properties(provenance: dict | None) -> ET.Element | None:
    """JUnit ``<properties>``: ``golden.repository.commit``, ``golden.repository.dirty``,
    ``golden.date``, ``golden.version.<package>``."""
    if provenance is None:
        return None
    d = describe(provenance)
    repo = d["repository"]
    props = ET.Element("properties")
    pairs = [("golden.repository", repository_text(d))]
    if isinstance(repo, dict):
        pairs += [("golden.repository.commit", str(repo.get("commit"))),
                  ("golden.repository.dirty", str(repo.get("dirty")).lower())]
    pairs += [("golden.date", str(d["date"]))]
    pairs += [(f"golden.version.{k}", v) for k, v in d["versions"].items()]
    for name, value in pairs:
        ET.SubElement(props, "property", name=name, value=value)
    return props


def provenance_json(provenance: dict | None) -> dict:
    """``{"golden_provenance": described}`` (empty without provenance)."""
    if provenance is None:
        return {}
    return {"golden_provenance": describe(provenance)}


def provenance_html(provenance: dict | None) -> list[str]:
    if provenance is None:
        return []
    d = describe(provenance)
    rows = [("repository", repository_text(d)), ("captured", str(d["date"])), ("reason", str(d["reason"]))]
    rows += list(d["versions"].items())
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return ['<section id="provenance"><h2>Golden provenance</h2>',
            f'<table class="summary-table provenance">{body}</table></section>']
