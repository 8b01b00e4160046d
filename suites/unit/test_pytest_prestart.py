"""Which sessions start the warm runtime while pytest collects (harness.pytest_prestart)."""

from __future__ import annotations

import pytest

from harness.pytest_prestart import golden_only


@pytest.mark.parametrize("markexpr, expected", [
    ("golden", True),
    ("  golden ", True),
    ("golden and not vllm", True),
    ("golden and not megatron and not vllm", True),
    ("(golden)", True),
    ("", False),
    ("not golden", False),
    ("slow", False),
    ("golden or slow", False),      # selects slow tests without the golden mark
    ("not vllm", False),            # selects unmarked tests
    ("golden or not slow", False),
    ("golden and slow", True),
    ("(golden or slow) and not slow", True),
    ("golden or (slow and not slow)", True),
    ("slow and not slow", False),       # selects nothing at all
    ("golden and", False),          # not an expression pytest accepts
])
def test_only_an_expression_that_selects_golden_tests_alone_prestarts(markexpr, expected):
    assert golden_only(markexpr) is expected
