"""Profiler plugin contracts, the class-path loader and the lifecycle drivers.

``protocols`` (the two contracts), ``loader`` (``NRL_*_PROFILER_CLASS`` ->
instance), ``policy_hooks`` / ``rollout_hooks`` (what workers call),
``environments`` + ``probe`` (``golden doctor``). No torch, no ray here:
loading with the variables unset imports nothing. See docs/plugins.md.
"""
