"""Built-in trace profilers (torch.profiler operators, dispatch-mode collectives, memory).

Reached only by class path through the plugin loader, e.g.
``NRL_POLICY_PROFILER_CLASS=harness.profiler.trace.TracePolicyProfiler``.
"""
