"""``python -m harness.cli``: the ``golden`` command without its console script."""

from harness.cli import main

raise SystemExit(main())
