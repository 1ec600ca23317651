"""Block placement of on-chip tensors: NKI's direct allocation (``ncc.sbuf.mod_alloc``,
``ncc.psum.mod_alloc``, ``alloc(fn)``) honoured, and the front end's own modulo placement of a
PSUM tensor whose blocks do not all fit.

A tensor declared with block dimensions before its partition dimension
(``nl.ndarray((n, m, nl.par_dim(128), 512), buffer=...)``) is a grid of blocks; its index
``(i, j)`` picks one. An allocation function maps a block index to where the block lives:
SBUF ``fn(idx, pdim_size, fdim_size) -> (partition, byte address)``, PSUM ``-> (bank,
partition, byte address in the bank)``; ``mod_alloc(base_addr, base_bank, num_*_tiles)`` is
the function NKI documents (``modulo_allocate_func``: each block index taken modulo
``num_*_tiles`` and linearised). ``pdim_size`` is the block's partitions, ``fdim_size`` its
bytes per partition.

Invariants
- A ``Placement`` knows the physical slot (partition offset, byte offset from its buffer's
  start) of every block; an access pattern addresses ONE block (its block indices are
  integers, or axes of size 1); a view spanning several blocks is refused (``ValueError``
  naming the tensor), since modulo addresses are not affine in the block index.
- Explicit placements are checked (partitions <= the target's, bytes within SBUF / within one
  PSUM bank, bank < the target's banks; errors name the tile, the rule and the value), are
  never freed to the front end's allocator, and must not overlap a live tile that allocator
  placed. All explicit tiles of one memory share one synchronisation space (the tracer orders
  their accesses by physical bytes, so deliberate aliasing, two tensors on the same banks,
  is synchronised).
- Several blocks may share a slot. With an explicit placement (the kernel's own
  ``mod_alloc``/``alloc``), reading a block whose slot another block of the same tensor wrote
  since it was last written is an error (``StaleBlockError``): modulo placement never makes a
  kernel silently wrong. With the front end's own placement (``paged``), the slots are a cache
  over a backing store: the tracer copies a written block out (spill) before another block
  takes its slot and copies it back before it is used again (``Tracer._page_in``), so the
  kernel runs as written, paying those copies. Only a block evicted before its first read is
  spilled (the front end cannot see a kernel's future; a block already read is taken to be
  done with), so reading a block again after its slot was reused is the same error.
"""
from __future__ import annotations

import itertools
from functools import reduce
from operator import mul

from runtime_sim.errors import CapacityError


class StaleBlockError(CapacityError):
    """A block of a modulo-placed tensor was read after another block overwrote its slot."""


def _num_elems(shape) -> int:
    return reduce(mul, shape, 1)


def _linearize(shape, indices) -> int:
    return sum(i * _num_elems(shape[d + 1:]) for d, i in enumerate(indices))


def _modulo(base: int, allocate_shape, scale: int):
    """NKI's ``modulo_allocate_func``: ``base + linearize(idx mod allocate_shape) * scale``."""
    def f(indices):
        shape = tuple(allocate_shape) or (1,) * len(indices)
        return _linearize(shape, tuple(i % s for i, s in zip(indices, shape))) * scale + base
    return f


def sbuf_mod_alloc(base_addr: int, base_partition: int = 0, num_par_tiles=(), num_free_tiles=()):
    """``ncc.sbuf.mod_alloc`` as an allocation function (module docstring)."""
    def f(idx, pdim_size, fdim_size):
        return (_modulo(base_partition, num_par_tiles, pdim_size)(idx),
                _modulo(base_addr, num_free_tiles, fdim_size)(idx))
    return f


def psum_mod_alloc(base_addr: int = 0, base_bank: int = 0, num_bank_tiles=(), base_partition: int = 0,
                   num_par_tiles=(), num_free_tiles=()):
    """``ncc.psum.mod_alloc`` as an allocation function (module docstring)."""
    def f(idx, pdim_size, fdim_size):
        return (_modulo(base_bank, num_bank_tiles, 1)(idx),
                _modulo(base_partition, num_par_tiles, pdim_size)(idx),
                _modulo(base_addr, num_free_tiles, fdim_size)(idx))
    return f


class Placement:
    """Where each block of one tensor lives (module docstring). ``slots``: block index ->
    (partition offset, byte offset from the buffer's start); ``bstride``: elements of one block
    in the tensor's (virtual, row-major) layout; ``space``: the tracer's synchronisation key."""

    def __init__(self, what: str, block_shape: tuple[int, ...], bstride: int,
                 slots: dict, space: str, how: str) -> None:
        self.what, self.block_shape, self.bstride = what, block_shape, bstride
        self.slots, self.space, self.how = slots, space, how
        self.last: dict = {}               # slot -> block index that last wrote it
        self.written: set = set()          # block indices some instruction wrote
        self.paged = False                 # front end's placement: spill/refill, never stale
        self.backing: dict = {}            # block index -> its spilled copy (SBUF or HBM view)
        self.dirty: set = set()            # resident blocks written since last spilled/filled
        self.unread: set = set()           # blocks written and not read since
        self.store = None                  # the backing Storage (tracer._copy_block)
        self.spills = self.fills = 0

    def block_of(self, view) -> tuple[int, ...]:
        return self.locate(view)[0]

    def locate(self, view) -> tuple[tuple[int, ...], int, int, tuple]:
        """(block index, partition offset, byte offset, free axes without the block axes)."""
        blin, inner = divmod(view.offset, self.bstride) if self.block_shape else (0, view.offset)
        idx, rem = [], blin
        for n in reversed(self.block_shape):
            idx.append(rem % n)
            rem //= n
        idx = tuple(reversed(idx))
        free = []
        for s, n, isp, ids in view.axes:
            if isp:
                continue
            if self.block_shape and s >= self.bstride:
                if n > 1:
                    raise ValueError(f"{view!r}: spans {n} blocks of {self.what}, which is placed "
                                     f"block by block ({self.how}); index its blocks one at a time")
                continue
            free.append((s, n, isp, ids))
        p, b = self.slots[idx]
        return idx, p, b + inner * view.storage.dtype.itemsize, tuple(free)

    def touch(self, view, write: bool) -> None:
        """Record a write of ``view``'s block; refuse a read of a block whose slot another block
        wrote since (``StaleBlockError``)."""
        idx, p, b, _ = self.locate(view)
        slot = self.slots[idx]
        if write:
            self.last[slot] = idx
            self.written.add(idx)
            self.dirty.add(idx)
            self.unread.add(idx)
        elif self.last.get(slot, idx) != idx:
            raise StaleBlockError(
                f"{self.what}: block {list(idx)} read after block "
                f"{list(self.last[slot])} overwrote its memory (partition {slot[0]}, byte "
                f"{slot[1]} of the tensor's region; {self.how})")
        else:
            self.unread.discard(idx)


def blocks(shape: tuple[int, ...], pdim: int):
    """Every block index of a tensor (the dimensions before ``pdim``)."""
    return itertools.product(*[range(n) for n in shape[:pdim]])
