"""Dict-of-sets indexes, as every calc node keeps them (policy -> endpoints, node -> routes).

Role: one helper for the remove half of such an index. `discard_member(index, key, member)`
takes `member` out of `index[key]` and drops the key once its set is empty.

Invariant it keeps: no key of an index maps to an empty set, so `key in index` (and the
index's size) says whether anything is still recorded for the key. Adding stays inline
(`index.setdefault(key, set()).add(member)`); every add has this as its matching remove.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TypeVar

K = TypeVar("K", bound=Hashable)
M = TypeVar("M", bound=Hashable)


def discard_member(index: dict[K, set[M]], key: K, member: M) -> None:
    """Remove `member` from `index[key]` (absent key or member: nothing to do); delete
    the key when its set becomes empty."""
    bucket = index.get(key)
    if bucket is not None:
        bucket.discard(member)
        if not bucket:
            del index[key]
