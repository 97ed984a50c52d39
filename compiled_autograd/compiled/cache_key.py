"""The cache key of a compiled backward: the tuple of the key items
``compiled_args`` collected (``CompiledNodeArgs.freeze``), interned, with its hash
folded once over theirs."""
from __future__ import annotations


class Key(tuple):
    """A cache key: the tuple of key items, equal to that plain tuple. Its items
    are interned (one object per distinct item, so that comparing two equal keys
    compares pointers) and its hash is folded over the items' (``intern_fold``).
    Like any dict key, it assumes its items' hashes never change (types, dtypes,
    numbers, strings and tuples of them)."""

    def __new__(cls, items):
        items = list(items)
        folded = intern_fold(items, 0, KEY_SEED)
        key = tuple.__new__(cls, items)
        key._hash = folded
        return key

    def __hash__(self):
        return self._hash


KEY_SEED = 0x345678
_P, _M = 1000003, (1 << 61) - 1
_INTERNED: dict = {}      # key item -> (the one such item, its hash)


def intern_fold(items, start, h):
    """Intern ``items[start:]`` in place (one object per distinct item, so that
    equal keys compare by identity) and return ``h`` folded over them
    (a polynomial in the items' hashes). The table is emptied when it has grown
    past a bound (only identity is lost)."""
    if len(_INTERNED) > 200_000:
        _INTERNED.clear()
    get = _INTERNED.get
    for k in range(start, len(items)):
        item = items[k]
        entry = get(item)
        if entry is None:
            entry = _INTERNED[item] = (item, hash(item))
        items[k] = entry[0]
        h = (h * _P + entry[1]) % _M      # (its hash kept: a nested tuple's is not)
    return h
