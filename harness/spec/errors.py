"""Errors raised by spec loading and topology planning.

Contract: every error names the offending *field path* (dotted, e.g.
``policy.tp``; ``(root)`` for the document itself) and, when known, the file it
came from, so a user can find the line to change without reading a traceback.
Both are ``ValueError`` subclasses; ``TopologyError`` is a ``SpecError`` so a
caller that loads and plans can catch one type.
"""

from __future__ import annotations


class SpecError(ValueError):
    """A workload spec is unusable.

    Attributes: ``field`` (dotted path), ``message`` (what is wrong, without
    the path), ``source`` (file name or ``None``).
    """

    def __init__(self, field: str, message: str, *, source: str | None = None) -> None:
        self.field = field
        self.message = message
        self.source = source
        super().__init__(self._render())

    def _render(self) -> str:
        where = f"{self.source}: " if self.source else ""
        return f"{where}{self.field}: {self.message}"

    def with_source(self, source: str) -> SpecError:
        """Return the same error attributed to ``source`` (keeps the subclass)."""
        self.source = source
        self.args = (self._render(),)
        return self


class TopologyError(SpecError):
    """A parallel layout violates a constraint.

    ``rule`` is the violated constraint written as a formula
    (e.g. ``model.experts % policy.ep == 0``) so tests and users can tell which
    rule fired, independently of the prose in ``message``.
    """

    def __init__(self, field: str, rule: str, message: str, *, source: str | None = None) -> None:
        self.rule = rule
        super().__init__(field, message, source=source)

    def _render(self) -> str:
        where = f"{self.source}: " if self.source else ""
        return f"{where}{self.field}: {self.message} [rule: {self.rule}]"
