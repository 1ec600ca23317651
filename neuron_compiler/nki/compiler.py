"""``nki.compiler``: NKI's direct-allocation API. Placements are honoured (placement.py):
``sbuf.mod_alloc(base_addr=..., num_free_tiles=...)``, ``psum.mod_alloc(base_bank=...,
num_bank_tiles=...)`` and ``sbuf/psum.alloc(fn)`` (``fn(idx, pdim_size, fdim_size)``) put each
block of the tensor where the kernel says, checked against the machine; ``auto_alloc()`` leaves
it to the front end's allocator (tracer.py). ``skip_middle_end_transformations`` and the other
compiler directives are no-ops."""
from __future__ import annotations

from .placement import psum_mod_alloc, sbuf_mod_alloc
from .tensor import BufferKind, PlacedKind, psum as _psum, sbuf as _sbuf


class _Space:
    def __init__(self, kind: BufferKind) -> None:
        self._kind = kind

    def auto_alloc(self, *args, **kwargs) -> BufferKind:
        return self._kind

    def mod_alloc(self, *args, **kwargs) -> PlacedKind:
        """NKI's modulo allocation (placement.py), e.g. ``mod_alloc(base_addr=0,
        num_free_tiles=(2,))`` or, in PSUM, ``mod_alloc(base_bank=0, num_bank_tiles=(2,))``."""
        fn = (psum_mod_alloc if self._kind is _psum else sbuf_mod_alloc)(*args, **kwargs)
        shown = ", ".join([repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()])
        return PlacedKind(self._kind, fn, f"ncc.{self._kind.name}.mod_alloc({shown})")

    def alloc(self, fn) -> PlacedKind:
        """A placement by the function ``fn(idx, pdim_size, fdim_size)`` (placement.py)."""
        return PlacedKind(self._kind, fn, f"ncc.{self._kind.name}.alloc({getattr(fn, '__name__', fn)})")


sbuf = _Space(_sbuf)
psum = _Space(_psum)


def skip_middle_end_transformations(fn):
    return fn


def enable_stack_allocator(*args, **kwargs):
    return args[0] if args and callable(args[0]) else (lambda f: f)


force_auto_alloc = enable_stack_allocator


class no_reorder:
    """``nki.compiler.no_reorder()`` (a loop directive, or ``with`` block): this front end
    emits instructions in program order anyway."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
