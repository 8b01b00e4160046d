"""Harness names for megatron-core's process groups.

megatron-core creates its groups with descriptions such as
``TENSOR_MODEL_PARALLEL_GROUP``; the collectives recorder
(`harness.profiler.collectives`) reports a collective's group by its
``group_desc``. `harness_group_names` makes megatron create them with the
harness's group kinds instead (the names `golden plan` prints: tp, pp, dp,
dp_cp, ep, edp, ...), so the collectives surface of a megatron run names
groups the way a native run does. Descriptions without a harness counterpart
become ``megatron_<description in lower case>``; gloo side groups get a
``_gloo`` suffix. Naming only: ranks, backends and options are megatron's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

# megatron-core group_desc -> harness group kind
GROUP_KINDS: dict[str, str] = {
    "TENSOR_MODEL_PARALLEL_GROUP": "tp",
    "PIPELINE_MODEL_PARALLEL_GROUP": "pp",
    "CONTEXT_PARALLEL_GROUP": "cp",
    "DATA_PARALLEL_GROUP": "dp",
    "DATA_PARALLEL_GROUP_WITH_CP": "dp_cp",
    "DATA_PARALLEL_GROUP_WITH_CP_AG": "dp_cp_ag",
    "MODEL_PARALLEL_GROUP": "mp",
    "EMBEDDING_GROUP": "embd",
    "POSITION_EMBEDDING_GROUP": "pos_embd",
    "TENSOR_AND_DATA_PARALLEL_GROUP": "tp_dp",
    "TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP": "tp_dp_cp",
    "TENSOR_AND_CONTEXT_PARALLEL_GROUP": "tp_cp",
    "EXPERT_MODEL_PARALLEL_GROUP": "ep",
    "EXPERT_TENSOR_PARALLEL_GROUP": "etp",
    "EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP": "tp_ep",
    "EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP": "tp_ep_pp",
    "EXPERT_DATA_PARALLEL_GROUP": "edp",
}


def harness_group_desc(desc: str | None) -> str | None:
    """The harness kind for a megatron group description (None stays None)."""
    if desc is None:
        return None
    if desc in GROUP_KINDS:
        return GROUP_KINDS[desc]
    if desc.endswith("_GLOO") and desc[: -len("_GLOO")] in GROUP_KINDS:
        return GROUP_KINDS[desc[: -len("_GLOO")]] + "_gloo"
    return "megatron_" + desc.lower()


@contextlib.contextmanager
def harness_group_names(parallel_state: Any) -> Iterator[None]:
    """While active, `parallel_state.create_group` (which every group of
    `initialize_model_parallel` goes through) passes the harness kind as
    ``group_desc``."""
    orig = parallel_state.create_group

    def create_group(*args: Any, group_desc: str | None = None, **kwargs: Any) -> Any:
        return orig(*args, group_desc=harness_group_desc(group_desc), **kwargs)

    parallel_state.create_group = create_group
    try:
        yield
    finally:
        parallel_state.create_group = orig
