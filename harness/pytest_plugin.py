"""pytest plugin (pytest11 entry point ``golden``): golden tests and refresh.

Filled in by the golden-gate work; registering it early keeps the entry point
stable for other repositories.
"""
