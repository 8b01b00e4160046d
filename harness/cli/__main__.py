"""``python -m harness.cli``: the ``golden`` command without its console script."""

from harness.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
