"""``golden locate``: name the aten op inside the first diverging module (docs/locator.md).

* ``harness.locate.hook``: op-level hashing inside one module call, loaded by path into each
  process of a replay (stdlib, numpy, torch and that tree's ``harness.taps`` only);
* ``harness.locate.replay``: the replay of a run's step in one tree (a ``golden run`` of the
  spec with the hook installed) and the temporary worktree of the golden's commit;
* ``harness.locate.ops``: the comparison of two op streams (pure: no torch).
"""
