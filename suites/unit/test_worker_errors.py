"""A dead or failing policy world: the first rank that failed, with its own error text.

The Ray exception objects are real ``ray.exceptions`` classes, built directly as Ray
builds them when a task raises or an actor dies (no cluster needed for that);
suites/faults/test_worker_death.py kills a real worker.
"""

from __future__ import annotations

import ray.exceptions as rex

from harness.policy.group import first_failure, own_error_text

GLOO = "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:5555"
DIED = ("The actor died unexpectedly before finishing this task.\n\tclass_name: PolicyWorker\n\tpid: 999999999\n"
        "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit "
        "detail: Worker unexpectedly exits with a connection error code 2. End of file. There are some potential "
        "root causes. (1) The process is killed by SIGKILL by OOM killer due to high memory usage.")


def _raised(exc: BaseException) -> rex.RayTaskError:
    tb = ("\x1b[36mray::PolicyWorker.train()\x1b[39m (pid=4242, ip=127.0.0.1)\nTraceback (most recent call last):\n"
          f'  File "/abs/site-packages/x.py", line 3, in train\n{type(exc).__name__}: {exc}')
    return rex.RayTaskError("train", tb, exc)


def test_own_text_is_the_raised_exception_without_ray_boilerplate():
    text = own_error_text(_raised(RuntimeError(GLOO)))
    assert text == f"RuntimeError: {GLOO}"
    assert "ray::" not in text and "Traceback" not in text and "\x1b" not in text


def test_a_dead_worker_says_how_its_process_exited():
    text = own_error_text(rex.RayActorError(error_msg=DIED))
    assert text == ("worker process exited (SYSTEM_ERROR: Worker unexpectedly exits with a connection error "
                    "code 2.)")


def test_first_failure_prefers_the_dead_worker_then_an_error_that_is_not_a_peer_symptom():
    gloo, own = _raised(RuntimeError(GLOO)), _raised(ValueError("shape mismatch in rank 2's batch"))
    died = rex.RayActorError(error_msg=DIED)
    # the driver saw rank 0's gloo error first, then rank 2's own error: rank 2 failed first
    errors = {0: ("failed", gloo), 2: ("failed", own), 1: ("failed", gloo)}
    texts = {r: own_error_text(e) for r, (_, e) in errors.items()}
    assert first_failure(errors, texts) == 2
    # a dead worker is the root cause over every error it provokes
    errors = {0: ("failed", gloo), 3: ("died", died), 1: ("died", died)}
    assert first_failure(errors, {r: own_error_text(e) for r, (_, e) in errors.items()}) == 3
    # only peer symptoms: the first one seen
    errors = {1: ("failed", gloo), 0: ("failed", gloo)}
    assert first_failure(errors, {r: own_error_text(e) for r, (_, e) in errors.items()}) == 1
