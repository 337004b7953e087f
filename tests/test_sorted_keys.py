"""SortedKeys (infermax/schedulers/sorted_keys.py) behaves as a sorted Python list under random additions,
removals, prefix removals and bulk (sorted) additions and removals, with pieces small enough that splits and
emptied pieces occur."""

from __future__ import annotations

from bisect import bisect_left, insort

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infermax.schedulers.sorted_keys import SortedKeys

KEYS = st.tuples(st.integers(0, 30), st.integers(0, 3))


@settings(max_examples=300, deadline=None)
@given(st.lists(KEYS, max_size=20), st.integers(1, 4),
       st.lists(st.tuples(st.sampled_from(["add", "add", "remove", "first", "bulk+", "bulk+top", "bulk-"]), KEYS,
                          st.integers(0, 6)), max_size=120))
def test_sorted_keys_match_a_sorted_list(initial, load, ops):
    keys, model = SortedKeys(initial, load=load), sorted(initial)
    for op, key, k in ops:
        if op in ("bulk+", "bulk+top"):  # k keys from ``key`` on; "top": above every key (the one-step path)
            base = (model[-1][0] + 1 if model else 0) if op == "bulk+top" else key[0]
            batch = sorted((base + i // 2, i % 4) for i in range(k))
            keys.add_sorted(batch)
            model = sorted(model + batch)
        elif op == "bulk-":  # up to k present keys from ``key`` on, every other one
            batch = model[bisect_left(model, key):][::2][:k]
            keys.remove_sorted(batch)
            for x in batch:
                del model[bisect_left(model, x)]
            with pytest.raises(KeyError):
                keys.remove_sorted([(99, 9)])
        elif op == "add":
            keys.add(key)
            insort(model, key)
        elif op == "remove":
            if key in model:
                keys.remove(key)
                del model[bisect_left(model, key)]
            else:
                with pytest.raises(KeyError):
                    keys.remove(key)
        else:
            k = min(k, len(model))
            assert keys.first(k) == model[:k]
            keys.remove_first(k)
            del model[:k]
        assert list(keys) == model and list(reversed(keys)) == model[::-1] and len(keys) == len(model)
        assert all(len(piece) for piece in keys._pieces) and keys._maxes == [p[-1] for p in keys._pieces]
