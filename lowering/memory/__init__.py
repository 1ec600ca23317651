"""Static memory planning.

``pack_offsets(buffers, capacity=None)`` assigns offsets to buffers given as
``(id, lower, upper, size)`` with half-open lifetimes ``[lower, upper)``.

Invariants of the result:

* every id gets an integer offset ``>= 0`` (a multiple of ``alignment``);
  zero-size buffers get offset 0;
* two non-empty buffers alive at the same time occupy disjoint address ranges
  ``[offset, offset + size)`` (``validate`` checks this);
* ``lower_bound(buffers) <= peak(buffers, offsets)``, and when ``capacity`` is
  given the peak is at most ``capacity`` or ``PackingError`` is raised.
"""

from lowering.memory.packing import PackingError, lower_bound, pack_offsets, peak, validate

__all__ = ["PackingError", "lower_bound", "pack_offsets", "peak", "validate"]
