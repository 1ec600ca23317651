"""Machine loops: a queue's stream as a loop nest whose instructions vary with the counters.

A queue's stream (``Program.streams[q]``) is either a tuple of ``Instr`` (straight-line) or a
``Stream``: a loop nest that the simulator steps through without re-deriving it, so the program's
size does not grow with the trip counts. A ``Stream`` is a ``Sequence[Instr]`` of its
*instances*: ``len(stream)`` counts them, ``stream[i]`` and iteration give them as concrete
``Instr`` values, exactly as if the stream had been written out straight-line.

Grammar
```
Stream = (body: Item*)
Item   = Instr | Loop | Looped
Loop   = (var, count >= 1, body: Item*)            # runs body for var = 0 .. count-1
Looped = (ins: Instr, offsets: (Index | None)*, waits: LWait*, start_when: Index*,
          fields: (name, Index)*)
LWait  = (sem, count: Index, guard: Index | None, bound)
Index  = const + sum(coef * var) + ((rconst + sum(rcoef * var)) mod modulus) * scale
```

Semantics
- Instances come in program order (depth first): a ``Loop`` repeats its body ``count`` times with
  its counter ``var`` = 0, 1, ...; an ``Instr`` inside loops is the same instruction every time.
- A ``Looped`` instance at counters ``env``: ``ins`` with
  * operand ``k`` of ``(dst, accum, *srcs)`` at byte offset ``ap.byte_offset + offsets[k](env)``
    (``offsets`` is empty or has one entry per operand slot; None: fixed);
  * waits ``ins.waits`` followed by ``(sem, count(env))`` for every ``LWait`` that is active:
    ``count(env) >= 1`` and, when it has a guard, ``guard(env) < bound`` (a count <= 0 is no wait;
    the guard limits a wait to a slot's first occupancies);
  * ``accumulate=False`` (matmul only) where every ``start_when`` expression is 0;
  * each ``fields`` entry's integer attribute set to its expression (only the fields of
    ``VARYING_FIELDS``, which no cost or static rule reads).
- ``Index`` is integer arithmetic; ``mod`` is floor modulo (non-negative for a positive modulus):
  the slot of a rotating buffer is ``allocation mod slots``.

Invariants
- Every variable an ``Index`` uses is the counter of an enclosing loop; a loop does not reuse the
  variable of a loop around it (checks.py enforces both).
- The position of an instance in its stream is affine in its counters, ``base + sum(v *
  stride_v)`` with ``stride_v`` the instances per iteration of ``v``'s loop: ``Expansion`` uses
  this to evaluate an instruction's instances at once (numpy), and ``Stream.locate`` to find
  any instance without walking the stream.
- ``units`` cuts a stream into consecutive units of at most ``UNIT`` instances; whoever needs
  per-instance values (the simulator, the PSUM checks) evaluates one unit at a time, so the
  memory it needs does not grow with the trip counts, and equal units share one expansion.
"""
from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Iterator, Union

import numpy as np

from .isa import AP, Instr, Op

Terms = tuple[tuple[str, int], ...]

# The attribute fields a Looped may vary per iteration: read by the semantics only.
VARYING_FIELDS: dict[Op, frozenset[str]] = {Op.IOTA: frozenset({"base"})}


def _terms_str(const: int, terms: Terms) -> str:
    parts = [(f"{k}*{v}" if k != 1 else v) for v, k in terms]
    if const or not parts:
        parts.append(str(const))
    return " + ".join(parts).replace("+ -", "- ")


def _affine_bounds(const: int, terms: Terms, counts: dict[str, int]) -> tuple[int, int]:
    lo = hi = const
    for v, k in terms:
        span = k * (counts[v] - 1)
        if span >= 0:
            hi += span
        else:
            lo += span
    return lo, hi


@dataclass(frozen=True, slots=True)
class Index:
    """``const + sum(coef * var) + ((rot[0] + sum(rot[1])) mod rot[2]) * rot[3]``."""

    const: int = 0
    terms: Terms = ()
    rot: tuple[int, Terms, int, int] | None = None   # (const, terms, modulus >= 1, scale)

    @property
    def vars(self) -> tuple[str, ...]:
        vs = [v for v, _ in self.terms]
        if self.rot is not None:
            vs += [v for v, _ in self.rot[1] if v not in vs]
        return tuple(vs)

    @property
    def is_const(self) -> bool:
        return not self.terms and (self.rot is None or not self.rot[1])

    def eval(self, env: dict[str, int]) -> int:
        x = self.const
        for v, k in self.terms:
            x += k * env[v]
        r = self.rot
        if r is not None:
            g = r[0]
            for v, k in r[1]:
                g += k * env[v]
            x += (g % r[2]) * r[3]
        return x

    def vector(self, env: dict[str, np.ndarray], n: int) -> np.ndarray:
        """Values at ``n`` instances whose counters are the arrays ``env[var]`` (int64)."""
        x = np.full(n, self.const, dtype=np.int64)
        for v, k in self.terms:
            x += k * env[v]
        r = self.rot
        if r is not None:
            g = np.full(n, r[0], dtype=np.int64)
            for v, k in r[1]:
                g += k * env[v]
            x += np.mod(g, r[2]) * r[3]
        return x

    def bounds(self, counts: dict[str, int]) -> tuple[int, int]:
        """Sound (min, max) over every counter ``v`` in ``0 .. counts[v]-1`` (exact without a
        ``rot`` term; with one, the rotation's full residue range unless it provably stays in a
        smaller one)."""
        lo, hi = _affine_bounds(self.const, self.terms, counts)
        r = self.rot
        if r is not None:
            glo, ghi = _affine_bounds(r[0], r[1], counts)
            m = r[2]
            if ghi - glo + 1 >= m or glo % m > ghi % m:
                rlo, rhi = 0, m - 1
            else:
                rlo, rhi = glo % m, ghi % m
            a, b = rlo * r[3], rhi * r[3]
            lo += min(a, b)
            hi += max(a, b)
        return lo, hi

    def __str__(self) -> str:
        s = _terms_str(self.const, self.terms) if (self.terms or self.const or self.rot is None) else ""
        r = self.rot
        if r is not None:
            inner = _terms_str(r[0], r[1])
            rs = f"({inner} % {r[2]})" if len(r[1]) == 1 and not r[0] else f"(({inner}) % {r[2]})"
            rs = rs if r[3] == 1 else f"{r[3]}*{rs}"
            s = f"{s} + {rs}" if s else rs
        return s


@dataclass(frozen=True, slots=True)
class LWait:
    """A wait ``(sem, count)`` whose count follows the counters; active where ``count >= 1``
    and (with a guard) ``guard < bound``."""

    sem: str
    count: Index
    guard: Index | None = None
    bound: int = 0

    def at(self, env: dict[str, int]) -> int:
        """The count at ``env``, or 0 where the wait is not active."""
        n = self.count.eval(env)
        if n < 1 or (self.guard is not None and self.guard.eval(env) >= self.bound):
            return 0
        return n

    def __str__(self) -> str:
        g = f" if {self.guard}<{self.bound}" if self.guard is not None else ""
        return f"{self.sem}>={self.count}{g}"


def base_of(it: "Instr | Looped") -> Instr:
    """The static instruction of a template (a Looped's fixed parts)."""
    return it.ins if isinstance(it, Looped) else it


def operands(ins: Instr) -> tuple[AP | None, ...]:
    """The operand slots of an instruction, in the order of ``Looped.offsets``."""
    return (ins.dst, ins.accum) + ins.srcs


@dataclass(frozen=True, slots=True)
class Looped:
    """An instruction inside loops whose offsets, wait counts and some attributes vary."""

    ins: Instr
    offsets: tuple[Index | None, ...] = ()
    waits: tuple[LWait, ...] = ()
    start_when: tuple[Index, ...] = ()
    fields: tuple[tuple[str, Index], ...] = ()

    @property
    def vars(self) -> tuple[str, ...]:
        seen: list[str] = []
        exprs = [o for o in self.offsets if o is not None] + list(self.start_when) + \
            [e for _, e in self.fields]
        for w in self.waits:
            exprs.append(w.count)
            if w.guard is not None:
                exprs.append(w.guard)
        for e in exprs:
            seen += [v for v in e.vars if v not in seen]
        return tuple(seen)

    def first_attrs(self):
        """The attributes of the instances that start an accumulation group."""
        return replace(self.ins.attrs, accumulate=False)  # type: ignore[call-arg]

    def at(self, env: dict[str, int], aps: dict | None = None) -> Instr:
        """The instance at counters ``env``; ``aps`` (optional) shares equal AP objects."""
        ins = self.ins
        ops = list(operands(ins))
        for k, o in enumerate(self.offsets):
            if o is not None:
                a = ops[k]
                assert a is not None
                off = a.byte_offset + o.eval(env)
                if aps is None:
                    ops[k] = replace(a, byte_offset=off)
                else:
                    key = (id(a), off)
                    b = aps.get(key)
                    if b is None:
                        b = aps[key] = (a, replace(a, byte_offset=off))
                    ops[k] = b[1]
        waits = ins.waits
        if self.waits:
            extra = []
            for w in self.waits:
                n = w.at(env)
                if n:
                    extra.append((w.sem, n))
            waits = waits + tuple(extra)
        attrs = ins.attrs
        first = bool(self.start_when) and all(e.eval(env) == 0 for e in self.start_when)
        if first or self.fields:
            vals = tuple((f, e.eval(env)) for f, e in self.fields)
            key = (id(self), first, vals)
            got = None if aps is None else aps.get(key)
            if got is None:
                if first:
                    attrs = self.first_attrs()
                if vals:
                    attrs = replace(attrs, **dict(vals))
                if aps is not None:
                    aps[key] = (self, attrs)
            else:
                attrs = got[1]
        return Instr(ins.op, ops[0], tuple(ops[2:]), attrs, waits, ins.signals, ins.tag,  # type: ignore[arg-type]
                     ops[1])

    def __str__(self) -> str:
        ins = self.ins
        a = ins.attrs
        dyn = dict(self.fields)
        fs = []
        for k in a.__dataclass_fields__:  # type: ignore[union-attr]
            v = dyn.get(k, getattr(a, k))
            fs.append(f"{k}={v.value if isinstance(v, enum.Enum) else v}")
        texts = []
        for k, o in enumerate(operands(ins)):
            off = self.offsets[k] if k < len(self.offsets) else None
            texts.append(None if o is None else _ap_str(o, off))
        s = f"{ins.op.value}({', '.join(fs)}) {texts[0]} <- {', '.join(t for t in texts[2:] if t)}"
        if texts[1] is not None:
            s += f" accum {texts[1]}"
        if self.start_when:
            s += " start_when " + ",".join(f"{e}==0" for e in self.start_when)
        ws = [f"{n}>={c}" for n, c in ins.waits] + [str(w) for w in self.waits]
        if ws:
            s += " waits " + ",".join(ws)
        if ins.signals:
            s += " signals " + ",".join(ins.signals)
        if ins.tag:
            s += f"  # {ins.tag}"
        return s


def _ap_str(a: AP, off: Index | None) -> str:
    dims = ",".join(f"[{st},{sz}]" for st, sz in a.dims)
    o = str(a.byte_offset) if off is None else str(Index(off.const + a.byte_offset, off.terms, off.rot))
    return (f"{a.memory.value}:{a.buffer}[p{a.partition_start}:+{a.partitions} @{o} {dims} "
            f"{a.dtype.value}]")


Item = Union[Instr, "Loop", Looped]


def body_size(body: tuple[Item, ...]) -> int:
    n = 0
    for it in body:
        n += it.size if isinstance(it, Loop) else 1
    return n


@dataclass(frozen=True, slots=True)
class Loop:
    var: str
    count: int
    body: tuple[Item, ...]
    size: int = field(init=False, compare=False, repr=False)   # instances of the whole loop
    inner: int = field(init=False, compare=False, repr=False)  # instances per iteration

    def __post_init__(self) -> None:
        inner = body_size(self.body)
        object.__setattr__(self, "inner", inner)
        object.__setattr__(self, "size", inner * self.count)


class Stream(Sequence):
    """A queue's stream as a loop nest; a ``Sequence[Instr]`` of its instances (module
    docstring)."""

    __slots__ = ("body", "_n")

    def __init__(self, body: tuple[Item, ...] | list[Item]) -> None:
        self.body = tuple(body)
        self._n = body_size(self.body)

    def __len__(self) -> int:
        return self._n

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other.body == self.body

    def __hash__(self) -> int:
        return hash(self.body)

    def __repr__(self) -> str:
        return f"Stream({len(self.body)} items, {self._n} instances)"

    def locate(self, i: int) -> tuple[Instr | Looped, dict[str, int]]:
        """The static instruction of instance ``i`` and its counters."""
        if not 0 <= i < self._n:
            raise IndexError(f"instance {i} of a stream of {self._n}")
        env: dict[str, int] = {}
        body = self.body
        while True:
            for it in body:
                if isinstance(it, Loop):
                    if i < it.size:
                        env[it.var], i = divmod(i, it.inner)
                        body = it.body
                        break
                    i -= it.size
                elif i == 0:
                    return it, env
                else:
                    i -= 1

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._n))]
        if i < 0:
            i += self._n
        it, env = self.locate(i)
        return it.at(env) if isinstance(it, Looped) else it

    def __iter__(self) -> Iterator[Instr]:
        aps: dict = {}
        for it, env in self.walk():
            yield it.at(env, aps) if isinstance(it, Looped) else it

    def walk(self) -> Iterator[tuple[Instr | Looped, dict[str, int]]]:
        """Every instance as (static instruction, counters), in order (``env`` is reused)."""
        env: dict[str, int] = {}

        def run(body: tuple[Item, ...]) -> Iterator[tuple[Instr | Looped, dict[str, int]]]:
            for it in body:
                if isinstance(it, Loop):
                    for v in range(it.count):
                        env[it.var] = v
                        yield from run(it.body)
                    del env[it.var]
                else:
                    yield it, env
        return run(self.body)

    def written_out(self, aps: dict | None = None) -> tuple[Instr, ...]:
        """The instances as a straight-line tuple (equal APs shared through ``aps``)."""
        aps = {} if aps is None else aps
        return tuple(it.at(env, aps) if isinstance(it, Looped) else it for it, env in self.walk())

    def statics(self) -> Iterator[tuple[Instr | Looped, tuple[Loop, ...]]]:
        """Every static instruction with its enclosing loops (outermost first), in order."""
        def run(body: tuple[Item, ...], loops: tuple[Loop, ...]):
            for it in body:
                if isinstance(it, Loop):
                    yield from run(it.body, loops + (it,))
                else:
                    yield it, loops
        return run(self.body, ())

    def lines(self, pad: str = "    ") -> list[str]:
        out: list[str] = []
        n = [0]

        def run(body: tuple[Item, ...], depth: int) -> None:
            p = pad + "  " * depth
            for it in body:
                if isinstance(it, Loop):
                    out.append(f"{p}for {it.var} in 0..{it.count}:   # {it.size} instructions")
                    start = n[0]
                    run(it.body, depth + 1)
                    n[0] = start + it.size
                else:
                    out.append(f"{p}{n[0]:4d}: {it}")
                    n[0] += 1
        run(self.body, 0)
        return out


def materialize(stream: Sequence[Instr], aps: dict | None = None) -> tuple[Instr, ...]:
    """The instances of a stream as a straight-line tuple (equal APs shared)."""
    if not isinstance(stream, Stream):
        return tuple(stream)
    return stream.written_out(aps)


class Expansion:
    """The instances of a body of items per static instruction ("template", ``templates[t]`` in
    program order), evaluated on demand as numpy arrays: ``pos(t)`` are the positions of its
    instances relative to the body's start (increasing), ``env(t)[var]`` the counters of the
    body's own loops there, ``tid[i]`` the template of position ``i``. ``first[t]`` and
    ``size[t]`` (first position, instance count) need no arrays. ``outer`` arguments give the
    counters of loops around the body (a unit of ``units``)."""

    def __init__(self, body: tuple[Item, ...]) -> None:
        self.n = body_size(body)
        self.templates: list[Instr | Looped] = []
        self.loops: list[tuple[Loop, ...]] = []
        self.first: list[int] = []
        self.size: list[int] = []
        self._pos: dict[int, np.ndarray] = {}
        self._env: dict[int, dict[str, np.ndarray]] = {}
        self._tid: np.ndarray | None = None
        self._visit(body, 0, ())

    def _visit(self, body: tuple[Item, ...], base: int, loops: tuple[Loop, ...]) -> None:
        off = base
        for it in body:
            if isinstance(it, Loop):
                self._visit(it.body, off, loops + (it,))
                off += it.size
                continue
            self.templates.append(it)
            self.loops.append(loops)
            self.first.append(off)
            n = 1
            for lp in loops:
                n *= lp.count
            self.size.append(n)
            off += 1

    def env(self, t: int, outer: dict[str, int] | None = None) -> dict:
        """Counters of template ``t``'s instances (arrays; with ``outer``, plus its scalars)."""
        e = self._env.get(t)
        if e is None:
            loops = self.loops[t]
            e = {}
            if loops:
                grid = np.indices(tuple(lp.count for lp in loops), dtype=np.int64)
                e = {lp.var: grid[k].ravel() for k, lp in enumerate(loops)}
            self._env[t] = e
        if not outer:
            return e
        out = dict(outer)
        for v, a in e.items():
            out[v] = a + outer[v] if v in outer else a     # a block of a cut loop: + its start
        return out

    def pos(self, t: int) -> np.ndarray:
        p = self._pos.get(t)
        if p is None:
            p = np.full(self.size[t], self.first[t], dtype=np.int64)
            env = self.env(t)
            for lp in self.loops[t]:
                p += env[lp.var] * lp.inner
            self._pos[t] = p
        return p

    @property
    def tid(self) -> np.ndarray:
        if self._tid is None:
            tid = np.empty(self.n, dtype=np.int64)
            for t in range(len(self.templates)):
                tid[self.pos(t)] = t
            self._tid = tid
        return self._tid

    def counts(self, t: int) -> dict[str, int]:
        return {lp.var: lp.count for lp in self.loops[t]}

    def env_at(self, t: int, k: int, outer: dict[str, int] | None = None) -> dict[str, int]:
        """All counters of template ``t``'s ``k``-th instance."""
        return {v: int(a if isinstance(a, int) else a[k]) for v, a in self.env(t, outer).items()}

    def offsets(self, t: int, slot: int, outer: dict[str, int] | None = None) -> np.ndarray:
        """Byte offsets of operand ``slot`` over template ``t``'s instances."""
        it = self.templates[t]
        a = operands(base_of(it))[slot]
        assert a is not None
        n = self.size[t]
        o = it.offsets[slot] if isinstance(it, Looped) and slot < len(it.offsets) else None
        if o is None:
            return np.full(n, a.byte_offset, dtype=np.int64)
        return o.vector(self.env(t, outer), n) + a.byte_offset

    def accumulate(self, t: int, outer: dict[str, int] | None = None) -> np.ndarray | None:
        """Matmul: the accumulate flag over template ``t``'s instances (None: not a matmul)."""
        it = self.templates[t]
        ins = base_of(it)
        if ins.op is not Op.MATMUL:
            return None
        n = self.size[t]
        acc = np.full(n, bool(ins.attrs.accumulate))  # type: ignore[union-attr]
        if isinstance(it, Looped) and it.start_when:
            first = np.ones(n, dtype=bool)
            env = self.env(t, outer)
            for e in it.start_when:
                first &= e.vector(env, n) == 0
            acc &= ~first
        return acc


UNIT = 1 << 13   # instances per unit of ``units`` (bounds the arrays evaluated at once)


def units(body: tuple[Item, ...], limit: int | None = None) -> Iterator[tuple[Expansion, dict[str, int], int]]:
    """The body in consecutive units of at most ``limit`` instances where it can be cut, in
    order: ``(expansion of the unit's items, outer counters, position of its first
    instance)``. A loop larger than the limit is cut into blocks of whole iterations (the unit's
    items are then a copy of the loop with the block's count, and ``outer[var]`` is the block's
    first value, added to the copy's counter), or, when one iteration is larger than the limit,
    into its iterations, each cut recursively. Equal units (the same items: every full block of
    a cut loop) share one ``Expansion``."""
    cache: dict[tuple[int, ...], Expansion] = {}
    blocks: dict[tuple[int, int], Loop] = {}
    limit = UNIT if limit is None else limit

    def run(body: tuple[Item, ...], outer: dict[str, int], base: int):
        group: list[Item] = []
        start = pos = base
        size = 0
        for it in body:
            n = it.size if isinstance(it, Loop) else 1
            if group and (size + n > limit or (isinstance(it, Loop) and n > limit)):
                yield unit(group), outer, start
                group, size, start = [], 0, pos
            if isinstance(it, Loop) and n > limit:
                per = limit // max(1, it.inner)
                for v0 in range(0, it.count, max(1, per)):
                    at = pos + v0 * it.inner
                    if per <= 1:
                        yield from run(it.body, {**outer, it.var: v0}, at)
                    else:
                        k = min(per, it.count - v0)
                        blk = blocks.get((id(it), k))
                        if blk is None:
                            blk = blocks[(id(it), k)] = Loop(it.var, k, it.body)
                        yield unit([blk]), {**outer, it.var: v0}, at
                pos += n
                start = pos
                continue
            group.append(it)
            size += n
            pos += n
        if group:
            yield unit(group), outer, start

    def unit(group: list[Item]) -> Expansion:
        key = tuple(map(id, group))
        e = cache.get(key)
        if e is None:
            e = cache[key] = Expansion(tuple(group))
        return e

    return run(body, {}, 0)
