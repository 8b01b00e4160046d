"""Prefix splicing: keep the model's exact earlier tokens in a re-rendered prompt.

`replace_prefix_tokens` follows NeMo RL's algorithm: the splice
boundary is found by *counting* EOS tokens, not by position, because chat
templates may rewrite earlier turns (Qwen3 strips earlier `<think>` blocks),
which shifts positions but keeps one EOS per finished message.

`PrefixCache` resolves a staging chain (the staged keys of a call and its
ancestors, root first) into cumulative token ids, caching by the chain's last
key and fetching only the rows after the deepest cached key.

Pure leaf module: no torch, no ray.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any


def replace_prefix_tokens(
    tokenizer: Any,
    model_prefix_token_ids: Sequence[int],
    template_prefix_token_ids: Sequence[int],
    template_token_ids: Sequence[int],
    *,
    eos_token_id: int | None = None,
) -> list[int]:
    """Return `model_prefix (minus one trailing EOS) + template[pos_k:]`.

    Invariants (property-tested in suites/property/test_splice_props.py):
      1. empty model prefix -> `template_token_ids` unchanged (no EOS needed);
      2. otherwise k = EOS count of the template prefix, pos_k = index of the
         k-th EOS in the template; the output is the model prefix without at
         most one trailing EOS followed by the template from pos_k;
      3. EOS count of the output = EOS in the cut model prefix + EOS in the suffix;
      4. consistent tokenisation (model prefix == template prefix, a prefix of
         the template ending in EOS) -> output == template;
      5. k == 0, fewer than k EOS in the template, or no EOS id -> AssertionError;
      6. the template prefix matters only through its EOS count;
      7. len(out) = len(model_prefix) - ends_with_eos + len(template) - pos_k.

    `eos_token_id` overrides `tokenizer.eos_token_id`; with it, `tokenizer` may
    be None (callers that hold only ids), and the failure message then carries
    no detokenised text.
    """
    template = list(template_token_ids)
    if not model_prefix_token_ids:
        return template
    eos = eos_token_id if eos_token_id is not None else getattr(tokenizer, "eos_token_id", None)
    assert eos is not None, (
        "replace_prefix_tokens: no EOS token id (tokenizer.eos_token_id is None and no eos_token_id given)"
    )
    model_prefix = list(model_prefix_token_ids)
    model_cut_end = len(model_prefix) - 1 if model_prefix[-1] == eos else len(model_prefix)

    needed = sum(1 for t in template_prefix_token_ids if t == eos)
    seen = 0
    cut_start = -1
    for pos, tok in enumerate(template):
        if tok == eos:
            seen += 1
            if seen == needed:
                cut_start = pos
                break
    if cut_start < 0:
        detail = ""
        decode = getattr(tokenizer, "decode", None) if eos_token_id is None else None
        if callable(decode):
            detail = (
                f"; template prefix text {decode(list(template_prefix_token_ids))!r}"
                f"; template text {decode(template)!r}"
            )
        raise AssertionError(
            f"replace_prefix_tokens: could not find EOS number {needed} (eos id {eos}) in the template "
            f"(it holds {seen} EOS); the template prefix must contain at least one EOS and the template "
            f"at least as many. template_prefix_token_ids={list(template_prefix_token_ids)} "
            f"template_token_ids={template}{detail}"
        )
    return model_prefix[:model_cut_end] + template[cut_start:]


FetchRows = Callable[[list[str]], list[dict[str, Any]]]


class PrefixCache:
    """LRU of cumulative token ids keyed by a chain's last staging key.

    `resolve(chain, fetch_rows)` returns the concatenated `token_ids_delta` of
    the chain's rows. On a miss it looks for the deepest key of the chain that
    is cached and calls `fetch_rows` only for the keys after it. Rows are
    assumed verified by the store (it checks digests on read); the cache stores
    tuples so a caller cannot mutate a cached prefix.
    """

    def __init__(self, maxsize: int = 256):
        if maxsize < 1:
            raise ValueError(f"PrefixCache maxsize must be >= 1, got {maxsize}")
        self.maxsize = maxsize
        self._entries: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.rows_fetched = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def get(self, key: str) -> tuple[int, ...] | None:
        got = self._entries.get(key)
        if got is not None:
            self._entries.move_to_end(key)
        return got

    def put(self, key: str, token_ids: Sequence[int]) -> None:
        self._entries[key] = tuple(token_ids)
        self._entries.move_to_end(key)
        while len(self._entries) > self.maxsize:
            self._entries.popitem(last=False)

    def missing_keys(self, chain: Sequence[str]) -> list[str]:
        """The keys `resolve(chain, ...)` would fetch now (no counters, no LRU change)."""
        if not chain or chain[-1] in self._entries:
            return []
        for depth in range(len(chain) - 2, -1, -1):
            if chain[depth] in self._entries:
                return list(chain[depth + 1:])
        return list(chain)

    def resolve(self, chain: Sequence[str], fetch_rows: FetchRows) -> list[int]:
        if not chain:
            return []
        last = chain[-1]
        cached = self.get(last)
        if cached is not None:
            self.hits += 1
            return list(cached)
        self.misses += 1
        start = 0
        prefix: list[int] = []
        for depth in range(len(chain) - 2, -1, -1):
            hit = self.get(chain[depth])
            if hit is not None:
                prefix = list(hit)
                start = depth + 1
                break
        suffix_keys = list(chain[start:])
        rows = fetch_rows(suffix_keys)
        if len(rows) != len(suffix_keys):
            raise ValueError(f"PrefixCache: fetched {len(rows)} rows for {len(suffix_keys)} keys")
        self.rows_fetched += len(rows)
        for row in rows:
            prefix.extend(row["token_ids_delta"])
        self.put(last, prefix)
        return prefix
