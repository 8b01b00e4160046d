"""Built-in trace profilers (C++ RecordFunction op counts or torch.profiler, dispatcher-level collectives, memory).

Reached only by class path through the plugin loader, e.g.
``NRL_POLICY_PROFILER_CLASS=harness.profiler.trace.TracePolicyProfiler``.
See docs/plugins.md section 5.
"""
