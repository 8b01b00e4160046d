"""GRPO golden regression harness.

Two halves, one rule: the gate half (``spec``, ``manifest``, ``surfaces``,
``parity``, ``store``, ``artifacts``, ``postflight``, most of ``cli``) never
imports torch or ray; the workload half (``model``, ``parallel``, ``policy``,
``rollout``, ``refit``, ``capture``, ``dataplane``, ``plugins``, ``profiler``,
``envs``, ``grpo``, ``runner``) produces artifacts only through the plugin
contracts. See docs/design.md.
"""

__version__ = "0.1.0"
