"""Fuzzing the gate's document reader and its run-directory checks (issue 16 item 8).

Properties, for generated documents (valid JSON, JSON with one planted defect at a known
pointer, arbitrary bytes in several encodings, deep and wide nestings) and generated run
directories (surface paths spelled absolute / with ``..`` / through symlinks in and out of
the run, dangling links, directories, FIFOs, oversized and non-UTF-8 files, damaged
manifests):

* nothing but ``DocumentError`` / ``RunRefused`` ever escapes (no traceback);
* a planted defect is reported at exactly its pointer, and every error names its file;
* a valid document parses to what ``json.loads`` gives;
* memory stays bounded: the traced peak of a parse is within ``max_memory`` plus a few
  times the input, whatever the input;
* nothing outside the run directory is opened.

Hypothesis draws; one example = one document or one directory tree.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
import tracemalloc
from pathlib import Path

from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from harness.docio import DocumentError, Limits, parse_json
from harness.parity.synthetic import synthetic_surfaces
from harness.postflight.read import RunRefused, load_run
from harness.surfaces.canonical import json_pointer
from suites.run_dirs import OpenLog, make_run, read_manifest, write_manifest

DOCS = settings(max_examples=max(300, settings().max_examples), deadline=None,
                suppress_health_check=[HealthCheck.too_slow])
TREES = settings(max_examples=max(120, settings().max_examples), deadline=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SMALL = Limits(max_bytes=256 * 1024, max_depth=16, max_memory=4 << 20)

scalars = st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | \
    st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20)
values = st.recursive(scalars, lambda kids: st.lists(kids, max_size=5) | st.dictionaries(st.text(max_size=8), kids,
                                                                                       max_size=5), max_leaves=40)


def paths_in(doc, prefix=()):
    """Every (path, value) inside ``doc`` (containers included)."""
    yield prefix, doc
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from paths_in(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from paths_in(v, prefix + (i,))


def parse(data, limits=SMALL):
    """parse_json, which may only return or raise DocumentError naming the source."""
    try:
        return True, parse_json(data, source="doc.json", limits=limits)
    except DocumentError as exc:
        assert str(exc).startswith("doc.json#"), str(exc)
        assert len(str(exc)) <= 400
        return False, exc


@DOCS
@given(values)
def test_valid_documents_parse_as_json_loads_does(doc):
    text = json.dumps(doc, ensure_ascii=False)
    assume(max((len(p) for p, _ in paths_in(doc)), default=0) < SMALL.max_depth)
    ok, value = parse(text.encode("utf-8"))
    assert ok, value
    assert value == json.loads(text)


PLANTS = ["NaN", "Infinity", "-Infinity", "1e999", '"\\ud800"', "9223372036854775808", "-9223372036854775809",
          "1" + "0" * 400]  # the last three: integers outside the gate's 64-bit domain (issue 41)


@DOCS
@given(values, st.data())
def test_a_planted_defect_is_reported_at_its_pointer(doc, data):
    sites = [p for p, v in paths_in(doc) if p and not isinstance(v, (dict, list))]
    containers = [p for p, v in paths_in(doc) if isinstance(v, dict) and v]
    kind = data.draw(st.sampled_from(["token", "duplicate"] if containers else ["token"]))
    if kind == "token" or not containers:
        if not sites:
            doc, sites = {"x": 1}, [("x",)]
        site = data.draw(st.sampled_from(sites))
        token = data.draw(st.sampled_from(PLANTS))
        marker = "\u0000PLANT\u0000"
        planted = copy.deepcopy(doc)
        node = planted
        for part in site[:-1]:
            node = node[part]
        node[site[-1]] = marker
        text = json.dumps(planted).replace(json.dumps(marker), token)
        expect = json_pointer(site)
    else:
        site = data.draw(st.sampled_from(containers))
        node = doc
        for part in site:
            node = node[part]
        key = next(iter(node))
        text = json.dumps(doc)
        inner = json.dumps(node)
        # repeat the first key of that object (its serialisation is unique enough to find)
        dup = "{" + json.dumps(key) + ": 0, " + inner[1:]
        assume(text.count(inner) == 1)
        text = text.replace(inner, dup)
        expect = json_pointer(site + (key,))
    assume(len(site) < SMALL.max_depth)
    event(kind if kind == "duplicate" else f"token {token}")
    ok, exc = parse(text.encode("utf-8"))
    assert not ok, f"accepted {text[:200]}"
    assert exc.pointer == expect, (str(exc), expect)


encodings = st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "utf-32", "latin-1"])


@DOCS
@given(st.one_of(st.binary(max_size=300), values.map(lambda v: json.dumps(v, ensure_ascii=False))), encodings,
       st.integers(0, 400))
def test_arbitrary_bytes_never_raise_anything_else(payload, encoding, cut):
    errors = "replace" if encoding == "latin-1" else "surrogatepass"
    data = payload if isinstance(payload, bytes) else payload.encode(encoding, errors)
    data = data[:cut] if cut < len(data) else data
    ok, _result = parse(data)
    if ok:
        data.decode("utf-8", "strict")  # what is accepted is UTF-8 (raises otherwise)
        assert not data.startswith(b"\xef\xbb\xbf")


@DOCS
@given(st.integers(1, 200_000), st.sampled_from(["[", "{\"a\":"]), st.sampled_from(["wide", "deep"]))
def test_memory_stays_bounded_on_hostile_shapes(n, opener, shape):
    if shape == "deep":
        closer = "]" if opener == "[" else "}"
        data = (opener * n + "0" + closer * n).encode()
    else:
        data = ("[" + ",".join([opener + ("]" if opener == "[" else "0}")] * n) + "]").encode()
    limits = Limits(max_bytes=8 << 20, max_depth=64, max_memory=4 << 20)
    tracemalloc.start()
    try:
        ok, result = parse(data, limits)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= limits.max_memory + 3 * len(data) + (1 << 20), (peak, len(data))
    event("accepted" if ok else "refused")
    if not ok:
        assert result.pointer == "" or result.pointer.startswith("/")


# --- run directories ----------------------------------------------------------------

BASE = synthetic_surfaces("w", seed=3)
VARIANTS = ["absolute", "dotdot", "link_out", "link_in", "dangling", "directory", "fifo", "big", "deep",
            "latin1", "empty", "manifest_field", "manifest_type", "loop"]


def mutate(run: Path, outside: Path, variant: str, name: str, depth: int) -> str | None:
    """Apply one variant to surface ``name``; returns the pointer the error must name ("" any;
    None: the run is valid and must load)."""
    manifest = read_manifest(run)
    index = next(i for i, e in enumerate(manifest["surfaces"]) if e["name"] == name)
    target = run / "surfaces" / f"{name}.json"
    entry = manifest["surfaces"][index]
    pointer = f"/surfaces/{index}/path"
    if variant == "absolute":
        entry["path"] = str(outside)
    elif variant == "dotdot":
        entry["path"] = f"surfaces/../../{outside.parent.name}/{outside.name}"
    elif variant in ("link_out", "link_in", "dangling", "loop"):
        target.unlink()
        if variant == "link_out":
            target.symlink_to(outside)
        elif variant == "link_in":  # a link that stays inside the run is fine
            (run / "elsewhere.json").write_bytes(outside.read_bytes())
            target.symlink_to(run / "elsewhere.json")
            pointer = None
        elif variant == "dangling":
            target.symlink_to(run / "nothing-here.json")
        else:
            target.symlink_to(target)
    elif variant == "directory":
        target.unlink()
        target.mkdir()
    elif variant == "fifo":
        target.unlink()
        os.mkfifo(target)
    elif variant == "big":
        target.write_bytes(b"[" + b"0," * (300 * 1024) + b"0]")
        pointer = f"/surfaces/{index}/sha256"
    elif variant == "deep":
        target.write_bytes(b"[" * depth + b"]" * depth)
        pointer = f"/surfaces/{index}/sha256"
    elif variant == "latin1":
        target.write_bytes('{"surface": "caf\xe9"}'.encode("latin-1"))
        pointer = f"/surfaces/{index}/sha256"
    elif variant == "empty":
        target.write_bytes(b"")
        pointer = f"/surfaces/{index}/sha256"
    elif variant == "manifest_field":
        del manifest["status"]
        pointer = "/status"
    elif variant == "manifest_type":
        manifest["surfaces"][index]["sha256"] = 7
        pointer = f"/surfaces/{index}/sha256"
    write_manifest(run, manifest)
    return pointer


@TREES
@given(st.sampled_from(VARIANTS), st.sampled_from(sorted(BASE)), st.integers(65, 3000), st.booleans())
def test_run_directories_fail_closed(variant, name, depth, rehash):
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        run = make_run(tmp / "run", BASE)
        outside = tmp / "outside" / f"{name}.json"
        outside.parent.mkdir()
        outside.write_bytes((run / "surfaces" / f"{name}.json").read_bytes())
        pointer = mutate(run, outside, variant, name, depth)
        event(variant)
        if rehash and variant in ("big", "deep", "latin1", "empty"):
            import hashlib

            manifest = read_manifest(run)
            for entry in manifest["surfaces"]:
                if entry["name"] == name:
                    entry["sha256"] = hashlib.sha256((run / entry["path"]).read_bytes()).hexdigest()
            write_manifest(run, manifest)
            pointer = ""  # now the surface itself is refused (its file and pointer are named)
        os.environ["GOLDEN_DOC_MAX_BYTES"] = str(512 * 1024)
        try:
            with OpenLog() as log:
                try:
                    loaded = load_run(run)
                except RunRefused as exc:
                    message = str(exc)
                else:
                    assert pointer is None, f"{variant}: accepted"
                    assert loaded.surfaces == BASE
                    message = None
        finally:
            del os.environ["GOLDEN_DOC_MAX_BYTES"]
        assert os.path.realpath(outside) not in log.paths, f"{variant}: opened {outside}"
        if message is None:
            return
        assert str(run) in message, message
        if pointer:
            assert f"#{pointer}" in message, (pointer, message)
        else:
            assert f"{name}.json#" in message or "manifest.json#" in message, message
