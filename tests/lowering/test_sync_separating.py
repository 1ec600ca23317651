"""The sync pass's ``_separating`` against brute force over every pair of iterations.

``diff = c*(yv - xv) + rest`` is the byte distance between an access of ``X`` (loop variable
``xv``) and one of ``Y`` (``yv``), overlapping when it falls in ``win``. ``None`` claims no pair
overlaps (no wait at all), ``True`` that only ``yv == xv`` does (wait for the same iteration).
A false ``None`` is a missing wait: a race in the generated program (a copy loop that wrote
rows 3..4 of what a product loop read as rows 0..4 with the same stride went unordered).
"""
from __future__ import annotations

import itertools
import random

from lowering.tir.affine import Affine
from lowering.tir.sync import _separating


def _overlapping_pairs(diff: Affine, dom: dict[str, int], win) -> set[tuple[int, int]]:
    out = set()
    names = sorted(dom)
    for vals in itertools.product(*(range(dom[n]) for n in names)):
        env = dict(zip(names, vals))
        if win[0] <= diff.eval(env) <= win[1]:
            out.add((env["y:i"], env["i"]))
    return out


def test_same_stride_another_start_still_waits():
    # writer rows at +3 (of 10 bytes), reader rows from 0: yv == xv never meets, yv == xv - 3 does
    diff = Affine.var("y:i") * 10 - Affine.var("i") * 10 + 30
    assert _separating(diff, "y:i", "i", (-9, 9), {"y:i": 5, "i": 5}) is not None


def test_separating_agrees_with_brute_force():
    rng = random.Random(0)
    for _ in range(3000):
        c = rng.choice([1, 2, 4, 10, -10, 64])
        k = rng.randint(-80, 80)
        extra = rng.choice([0, 0, 1, 3, 16])
        diff = Affine.var("y:i") * c - Affine.var("i") * c + Affine.var("j") * extra + k
        dom = {"y:i": rng.randint(1, 6), "i": rng.randint(1, 6), "j": rng.randint(1, 3)}
        w = rng.randint(0, 12)
        win = (-w, w)
        pairs = _overlapping_pairs(diff, dom, win)
        got = _separating(diff, "y:i", "i", win, dom)
        if got is None:
            assert not pairs, (diff, dom, win, pairs)
        elif got:
            assert all(y == x for y, x in pairs), (diff, dom, win, pairs)
