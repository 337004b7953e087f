"""AppendKeys (infermax/schedulers/append_keys.py) behaves as a sorted list of one key per member under random
additions (at the end, as BROS files them, and out of order), bulk additions, removals in any order and prefix
removals: the blanks that removals leave are never read, positions stay right across trims and rebuilds, and the
blanks never outnumber the keys by more than the rebuild rule allows."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infermax.schedulers.append_keys import AppendKeys

MEMBERS = st.integers(0, 15)
KEYS = st.tuples(st.integers(0, 20), st.integers(0, 3), MEMBERS)  # (reference time, arrival, member)


def _check(order: AppendKeys, model: dict) -> None:
    want = sorted(model.values())
    assert list(order) == want and list(reversed(order)) == want[::-1] and len(order) == len(want)
    assert all((m in order) == (m in model) for m in range(16))
    if want:
        assert order.first() == want[0] and order.last() == want[-1]
    slots = order._keys
    assert len(slots) <= 2 * len(want) and (not slots or (slots[0] is not None and slots[-1] is not None))


@settings(max_examples=400, deadline=None)
@given(st.lists(KEYS, max_size=12, unique_by=lambda k: k[2]),
       st.lists(st.tuples(st.sampled_from(["add", "add", "top", "bulk", "bulk top", "remove", "remove", "pop",
                                           "wrong"]), KEYS, st.integers(0, 6), st.randoms(use_true_random=False)),
                max_size=80))
def test_append_keys_match_a_sorted_list(initial, ops):
    order, model = AppendKeys(initial), {k[2]: k for k in initial}
    _check(order, model)
    for op, key, k, rnd in ops:
        top = max(model.values(), default=(0,))[0] + 1  # a reference time above every key: the append path
        if op in ("add", "top"):
            key = (top, *key[1:]) if op == "top" else key
            if key[2] in model:
                with pytest.raises(KeyError):
                    order.add(key)
            else:
                order.add(key)
                model[key[2]] = key
        elif op in ("bulk", "bulk top"):  # k keys, ascending; a member drawn twice or one with a key: refused
            keys = sorted((top + i // 2 if op == "bulk top" else rnd.randrange(21), rnd.randrange(4),
                           rnd.randrange(16)) for i in range(k))
            if any(m in model for _, _, m in keys) or len({m for _, _, m in keys}) < len(keys):
                with pytest.raises(KeyError):
                    order.add_sorted(keys)
            else:
                order.add_sorted(keys)
                model.update((kk[2], kk) for kk in keys)
        elif op == "remove":  # up to k filed keys, in any order
            gone = rnd.sample(sorted(model.values()), min(k, len(model)))
            order.remove_all(gone)
            for kk in gone:
                del model[kk[2]]
        elif op == "pop":
            k = min(k, len(model))
            assert order.pop_first(k) == sorted(model.values())[:k]
            for kk in sorted(model.values())[:k]:
                del model[kk[2]]
        elif model:  # "wrong": a member's key with another reference time, or a member without a key
            member = rnd.choice(sorted(model))
            with pytest.raises(KeyError):
                order.remove_all([(model[member][0] + 100, 0, member)])
            absent = next((m for m in range(16) if m not in model), None)
            if absent is not None:
                with pytest.raises(KeyError):
                    order.remove_all([(0, 0, absent)])
        _check(order, model)


def test_a_removed_key_filed_again_is_read_once():
    """The hazard of lazy removal: a key removed and filed again (the same tuple) must not be read twice."""
    order = AppendKeys([(1, 0, 1), (2, 0, 2), (3, 0, 3)])
    order.remove_all([(2, 0, 2)])
    order.add((2, 0, 2))  # in place, below the last key
    order.remove_all([(3, 0, 3)])
    order.add((3, 0, 3))  # at the end
    want = [(1, 0, 1), (2, 0, 2), (3, 0, 3)]
    assert list(order) == want and list(reversed(order)) == want[::-1]
