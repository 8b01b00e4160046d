"""The rendezvous server: a torch ``TCPStore`` bound before its port is handed out.

(torch calls it a store; the harness says *rendezvous server* for it, so that "store"
alone keeps meaning the golden store: the glossary in docs/design.md.)

Picking a free port (bind to 0, read it, close) and letting a rank bind it later
races with every other process on the host: a parallel run can take the port in
between, and the rank then fails to bind or, worse, joins the wrong store. Here
the process that starts the ranks serves the ``TCPStore`` itself on an
OS-assigned port, so the port is bound before anyone learns it and stays bound
while the :class:`RendezvousServer` lives; every rank joins as a client
(:func:`join_rendezvous`). Keep the ``RendezvousServer`` for as long as groups may still be
created on it; note that a gloo group also keeps its connection to the store
until the group is destroyed (measured), so the store's connections drop only
when the members close their groups.
"""

from __future__ import annotations

import datetime

import torch.distributed as dist

DEFAULT_HOST = "127.0.0.1"


class RendezvousServer:
    """A ``TCPStore`` served by this process; ``host``/``port`` are what ranks join."""

    def __init__(self, host: str = DEFAULT_HOST) -> None:
        self.host = host
        self._store: dist.TCPStore | None = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False)
        self.port = int(self._store.port)

    def close(self) -> None:
        """Stop serving (idempotent); ranks must not create groups on it afterwards."""
        self._store = None


def join_rendezvous(host: str, port: int, timeout_s: float) -> dist.TCPStore:
    """Connect to a :class:`RendezvousServer` (or any served store) as a client."""
    return dist.TCPStore(host, int(port), is_master=False, timeout=datetime.timedelta(seconds=timeout_s))
