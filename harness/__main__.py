"""``python -m harness`` is the ``golden`` command."""

from harness.cli import main

raise SystemExit(main())
