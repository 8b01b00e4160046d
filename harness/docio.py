"""The gate's one reader for JSON documents (manifests, surfaces, goldens, run.json, provenance).

Contract
--------
``read_json(path)`` / ``parse_json(data, source=...)`` return the parsed value of a
*strict*, *bounded* JSON document, or raise ``DocumentError`` (a ``StrictJSONError``,
so a ``ValueError``) whose message is ``FILE#POINTER: what (near 'excerpt')``:

* strict: UTF-8 only (a BOM, UTF-16 and invalid bytes are refused), RFC 8259 JSON;
  the ``NaN``/``Infinity``/``-Infinity`` tokens, numbers that overflow to inf
  (``1e999``), integers outside 64 bits (``harness.surfaces.canonical.INT_MIN..INT_MAX``,
  the gate's numeric domain), lone UTF-16 surrogate escapes and duplicate object keys
  are refused;
* bounded: ``Limits.max_bytes`` (file size, checked with ``fstat`` before any byte
  is read and again while reading, so a growing file or a device is cut off),
  ``Limits.max_depth`` (nesting of arrays/objects), and ``Limits.max_memory``, an
  upper estimate of what the parsed value would occupy, computed from byte counts
  before anything is parsed. A refused document never costs more than its own bytes
  in memory (over ``max_bytes``: nothing); an accepted one at most about ``max_memory``;
* located: the pointer (RFC 6901) is that of the offending value or key, ``""`` for
  the whole document (size limits, encoding of the file); the excerpt is at most
  ``EXCERPT`` characters of the input around the error, escaped;
* never a traceback: every failure of the input is a ``DocumentError``; an
  ``OSError`` (missing file, permission) is turned into one too.

Limits default to ``Limits()`` and can be set per call or through the environment
(``GOLDEN_DOC_MAX_BYTES``, ``GOLDEN_DOC_MAX_DEPTH``, ``GOLDEN_DOC_MAX_MEMORY``,
integers, bytes). ``short(text)`` bounds any message built from document content.

Standard library only (this module sits at the bottom of the gate half).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any

from harness.surfaces.canonical import INT_MAX, INT_MIN, StrictJSONError, json_pointer, out_of_range_message

__all__ = ["DocumentError", "Limits", "read_json", "read_bytes", "parse_json", "short", "estimate_memory",
           "max_depth_of", "EXCERPT"]

MiB = 1 << 20
EXCERPT = 60
_MESSAGE_LIMIT = 400
_SEGMENT_LIMIT = 40
# estimated bytes of one parsed value / one container beyond the text (calibrated on
# CPython 3.11: an empty dict in a list costs ~72 bytes, a small int pointer 8, a float 32)
_PER_VALUE = 64
_PER_CONTAINER = 128
_SCAN_TOKENS = 4_000_000  # the locating scanner gives up (pointer "") after this many tokens


@dataclass(frozen=True)
class Limits:
    """Bounds on one document. The defaults sit far above the largest real surface
    (the 235B-scale collectives surface is ~18 MB, nesting depth 8)."""

    max_bytes: int = 128 * MiB
    max_depth: int = 64
    max_memory: int = 768 * MiB
    # the sum of the documents one golden, or one run, may have read (issue 41): checked from
    # the listing (sizes from lstat) before any of them is read
    max_total: int = 512 * MiB

    @classmethod
    def from_env(cls, environ: os._Environ | dict | None = None) -> Limits:
        env = os.environ if environ is None else environ
        values = {}
        for field, var in (("max_bytes", "GOLDEN_DOC_MAX_BYTES"), ("max_depth", "GOLDEN_DOC_MAX_DEPTH"),
                           ("max_memory", "GOLDEN_DOC_MAX_MEMORY"), ("max_total", "GOLDEN_READ_BUDGET")):
            raw = env.get(var)
            if raw:
                try:
                    values[field] = int(raw)
                except ValueError:
                    raise DocumentError(f"${var}={short(raw, 40)!r} is not an integer", source="environment") from None
                if values[field] < 1:
                    raise DocumentError(f"${var} must be >= 1, got {values[field]}", source="environment")
        return cls(**values)


class DocumentError(StrictJSONError):
    """A document that is unreadable, not strict JSON, or over a limit. ``source`` is
    the file, ``pointer`` the JSON pointer, ``detail`` the bare reason."""

    def __init__(self, detail: str, *, source: str = "", pointer: str = "", excerpt: str | None = None):
        self.detail = detail
        self.excerpt = excerpt
        shown = _show_pointer(pointer)
        near = f" (near {excerpt})" if excerpt else ""
        where = f"{source}#{shown}" if source else shown
        ValueError.__init__(self, short(f"{where}: {detail}{near}", _MESSAGE_LIMIT))
        self.pointer = pointer
        self.source = source


def short(text: str, limit: int = _MESSAGE_LIMIT) -> str:
    """``text`` cut to at most ``limit`` characters (with a marker saying how much was cut)."""
    text = str(text)
    if len(text) <= limit:
        return text
    keep = max(limit - 40, 10)
    return f"{text[:keep]}... [{len(text) - keep} more characters]"


def _show_pointer(pointer: str) -> str:
    if not pointer:
        return "/"
    parts = pointer.split("/")[1:]
    if len(parts) > 12:
        parts = parts[:5] + [f"...{len(parts) - 10} more..."] + parts[-5:]
    return "".join("/" + (p if len(p) <= _SEGMENT_LIMIT else p[:_SEGMENT_LIMIT] + "...") for p in parts)


def _excerpt(text: str, pos: int) -> str:
    start = max(0, pos - EXCERPT // 3)
    piece = text[start:start + EXCERPT]
    return ascii(piece)[: EXCERPT + 20]


# --- reading ---------------------------------------------------------------------

def read_json(path: str | Path, *, limits: Limits | None = None, sha256: str | None = None,
              what: str = "document") -> Any:
    """Parse the file at ``path`` (see module contract). With ``sha256``, the bytes read
    must have that digest (what is parsed is exactly what was validated)."""
    limits = limits or Limits.from_env()
    source = str(path)
    box = [_read_into(path, limits, what)]
    if sha256 is not None and hashlib.sha256(box[0]).hexdigest() != sha256:
        raise DocumentError("sha256 of the bytes read does not match the manifest (changed while being read?)",
                            source=source)
    return _parse(box, source, limits)  # _parse drops the bytes once decoded


def read_bytes(path: str | Path, *, limits: Limits | None = None, what: str = "document") -> bytearray:
    """The bytes of a regular file of at most ``limits.max_bytes`` (else DocumentError), in one
    buffer (a ``bytearray``: no second copy)."""
    return _read_into(path, limits or Limits.from_env(), what)


def _read_into(path: str | Path, limits: Limits, what: str) -> bytearray:
    """The file's bytes in one buffer sized from ``fstat`` (no second copy), cut off at
    ``max_bytes + 1`` if the file grows while being read."""
    source = str(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise DocumentError(f"cannot open {what}: {exc.strerror or exc}", source=source) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise DocumentError(f"{what} is not a regular file", source=source)
        if info.st_size > limits.max_bytes:
            raise DocumentError(f"{what} is {info.st_size} bytes, over the limit of {limits.max_bytes} bytes "
                                "(GOLDEN_DOC_MAX_BYTES)", source=source)
        buf = bytearray(info.st_size + 1)  # one spare byte notices growth
        total = 0
        with open(fd, "rb", buffering=0, closefd=False) as handle:
            while True:
                if total == len(buf):
                    if total > limits.max_bytes:
                        raise DocumentError(f"{what} grew past the limit of {limits.max_bytes} bytes while being "
                                            "read", source=source)
                    buf.extend(bytes(min(len(buf), limits.max_bytes + 1 - total)))
                got = handle.readinto(memoryview(buf)[total:])
                if not got:
                    break
                total += got
    except OSError as exc:
        raise DocumentError(f"cannot read {what}: {exc.strerror or exc}", source=source) from None
    finally:
        os.close(fd)
    del buf[total:]
    return buf


# --- parsing ---------------------------------------------------------------------

class _Stop(Exception):
    """Raised inside the C parser's hooks: the slow scanner then locates the problem."""


def _no_constant(token: str) -> Any:
    raise _Stop(token)


def _bounded_int(text: str) -> int:
    """An integer token within the gate's 64-bit domain (a 19-digit token is the shortest
    that can fall outside it)."""
    value = int(text)
    if len(text) > 18 and not INT_MIN <= value <= INT_MAX:
        raise _Stop(text)
    return value


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Stop(text)
    return value


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise _Stop("duplicate")
    return out


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_STRING_BODY = re.compile(rb'"[^"]*"')
_BRACKETS = bytes(range(256)).translate(None, b'[]{}"')
_DEPTH_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def estimate_memory(data: bytes) -> int:
    """An upper estimate (bytes) of the decoded text plus the parsed value of ``data``."""
    text = len(data) if data.isascii() else 4 * len(data)
    containers = data.count(b"[") + data.count(b"{")
    values = data.count(b",") + data.count(b":") + 1
    return text + _PER_VALUE * values + _PER_CONTAINER * containers


def max_depth_of(data: bytes) -> int:
    """Nesting depth of arrays/objects in ``data`` (exact for valid JSON; brackets
    inside strings are not counted)."""
    if b"\\" in data:  # escapes only exist inside strings; without any, skip the copies
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    reduced = data.translate(None, _BRACKETS)
    reduced = _STRING_BODY.sub(b"", reduced).replace(b'"', b"")  # an unterminated string: the parser says so
    if not reduced:
        return 0
    return max(0, max(accumulate(map(_DEPTH_STEP.__getitem__, reduced))))


def parse_json(data: bytes | bytearray | str, *, source: str = "", limits: Limits | None = None) -> Any:
    """Parse ``data`` strictly within ``limits`` (see module contract)."""
    return _parse([data], source, limits or Limits.from_env())


def _parse(box: list, source: str, limits: Limits) -> Any:
    data = box.pop()
    if isinstance(data, str):
        try:
            data = data.encode("utf-8")
        except UnicodeEncodeError:
            raise DocumentError("text holds a lone surrogate", source=source) from None
    if len(data) > limits.max_bytes:
        raise DocumentError(f"document is {len(data)} bytes, over the limit of {limits.max_bytes} bytes",
                            source=source)
    if data.startswith(b"\xef\xbb\xbf"):
        raise DocumentError("starts with a UTF-8 byte order mark (not allowed in JSON)", source=source)
    estimate = estimate_memory(data)
    if estimate > limits.max_memory:
        raise DocumentError(
            f"too many values to parse within the memory limit (estimated {estimate // MiB} MiB for "
            f"{len(data)} bytes, limit {limits.max_memory // MiB} MiB, GOLDEN_DOC_MAX_MEMORY)", source=source)
    depth = max_depth_of(data)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DocumentError(f"not UTF-8: {exc.reason} at byte {exc.start}", source=source,
                            excerpt=ascii(bytes(data[max(0, exc.start - 20):exc.start + 20]))) from None
    del data  # the text alone from here on
    if depth > limits.max_depth:
        _raise_located(text, source, limits, fallback=f"nested deeper than {limits.max_depth} levels")
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float, parse_int=_bounded_int,
                           object_pairs_hook=_unique_pairs)
    except (_Stop, ValueError, RecursionError) as exc:
        fallback = f"not valid JSON: {exc.msg}" if isinstance(exc, json.JSONDecodeError) else \
            f"not strict JSON: {short(exc, 120)}"
        pos = exc.pos if isinstance(exc, json.JSONDecodeError) else None
        _raise_located(text, source, limits, fallback=fallback, pos=pos)
    if _SURROGATE_ESCAPE.search(text):
        _raise_located(text, source, limits, fallback=None)  # raises only for a lone surrogate
    return value


# --- locating a problem (slow path, only after the fast path refused) -------------

_WS = re.compile(r"[ \t\n\r]*")
_STRING = re.compile(r'"((?:[^"\\\x00-\x1f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*)"')
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")
_LITERAL = re.compile(r"true|false|null")
_CONSTANT = re.compile(r"-?(?:NaN|Infinity)")


class _Found(Exception):
    def __init__(self, pointer: str, detail: str, pos: int):
        self.pointer, self.detail, self.pos = pointer, detail, pos


def _raise_located(text: str, source: str, limits: Limits, *, fallback: str | None, pos: int | None = None) -> None:
    try:
        _scan(text, limits)
    except _Found as found:
        raise DocumentError(found.detail, source=source, pointer=found.pointer,
                            excerpt=_excerpt(text, found.pos)) from None
    if fallback is None:
        return
    raise DocumentError(fallback, source=source, excerpt=_excerpt(text, pos) if pos is not None else None)


def _decode_string(body: str, pointer: str, pos: int) -> str:
    value = json.loads(f'"{body}"')
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _Found(pointer, "string holds a lone UTF-16 surrogate escape", pos) from None
    return value


def _scan(text: str, limits: Limits) -> None:
    """Walk ``text`` as JSON tracking the pointer; raise ``_Found`` at the first problem.
    Returns silently when it finds none (or after ``_SCAN_TOKENS`` tokens)."""
    path: list[Any] = []          # keys / indices of the containers we are in
    frames: list[list] = []       # [kind, keys seen (objects), count]
    pos, n, tokens = 0, len(text), 0

    def pointer() -> str:
        return json_pointer(path)

    def value(pos: int) -> int:
        """Parse one value at ``pos`` (after whitespace); returns the position after it."""
        nonlocal tokens
        tokens += 1
        if tokens > _SCAN_TOKENS:
            raise _GiveUp
        ch = text[pos] if pos < n else ""
        if ch and ch in "[{":
            if len(frames) + 1 > limits.max_depth:
                raise _Found(pointer(), f"nested deeper than {limits.max_depth} levels", pos)
            frames.append(["object" if ch == "{" else "array", set(), 0])
            path.append(None)
            return pos + 1
        if ch == '"':
            m = _STRING.match(text, pos)
            if not m:
                raise _Found(pointer(), "invalid string (unescaped control character or bad escape)", pos)
            _decode_string(m.group(1), pointer(), pos)
            return m.end()
        m = _CONSTANT.match(text, pos)
        if m:
            raise _Found(pointer(), f"non-finite token {m.group()} (NaN/Infinity are refused)", pos)
        m = _NUMBER.match(text, pos)
        if m:
            token = m.group()
            if any(c in token for c in ".eE"):
                if not math.isfinite(float(token)):
                    raise _Found(pointer(), f"number {short(token, 30)} overflows to infinity", pos)
            elif len(token.lstrip("-")) > 4300:
                raise _Found(pointer(), f"integer with {len(token)} digits (more than 4300)", pos)
            elif len(token) > 18 and not INT_MIN <= int(token) <= INT_MAX:
                raise _Found(pointer(), out_of_range_message(token), pos)
            return m.end()
        m = _LITERAL.match(text, pos)
        if m:
            return m.end()
        raise _Found(pointer(), "expected a JSON value", pos)

    try:
        pos = _WS.match(text, pos).end()
        pos = value(pos)
        while frames:
            pos = _WS.match(text, pos).end()
            kind, keys, count = frames[-1]
            ch = text[pos] if pos < n else ""
            closer = "}" if kind == "object" else "]"
            if ch == closer:
                frames.pop()
                path.pop()
                pos += 1
                continue
            if count:
                if ch != ",":
                    raise _Found(json_pointer(path[:-1]), f"expected ',' or '{closer}'", pos)
                pos = _WS.match(text, pos + 1).end()
                ch = text[pos] if pos < n else ""
            frames[-1][2] = count + 1
            if kind == "object":
                m = _STRING.match(text, pos)
                if ch != '"' or not m:
                    raise _Found(json_pointer(path[:-1]), "expected an object key (a string)", pos)
                key = _decode_string(m.group(1), json_pointer(path[:-1]), pos)
                path[-1] = key
                if key in keys:
                    raise _Found(pointer(), f"duplicate object key {short(key, 60)!r}", pos)
                keys.add(key)
                pos = _WS.match(text, m.end()).end()
                if text[pos:pos + 1] != ":":
                    raise _Found(pointer(), "expected ':' after an object key", pos)
                pos = _WS.match(text, pos + 1).end()
            else:
                path[-1] = count
            pos = value(pos)
        pos = _WS.match(text, pos).end()
        if pos < n:
            raise _Found("", "extra data after the document", pos)
    except _GiveUp:
        return


class _GiveUp(Exception):
    pass
