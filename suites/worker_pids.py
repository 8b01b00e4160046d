"""A progress sink that keeps the pids of a run's workers (the warm-isolation test and bench).

``flows.execute(..., say=PidRecorder())``: the session reports each group of workers it
starts or adopts through ``detail(what, records)``; the recorder keeps ``what -> [pid]``
(``pid``, else ``actor_pid``) and ignores the plain progress lines.
"""

from __future__ import annotations


class PidRecorder:
    def __init__(self) -> None:
        self.pids: dict[str, list[int]] = {}

    def __call__(self, text: str) -> None:
        pass

    def detail(self, what: str, records: list[dict]) -> None:
        self.pids[what] = [r.get("pid", r.get("actor_pid")) for r in records]
