"""Tile-edge loops shared by the test kernels: ``edges(n, size)`` yields ``(start, length)`` of
each tile of ``size`` along ``n`` (the last one shorter when ``size`` does not divide ``n``)."""
import neuron_compiler.nki.language as nl


def edges(n: int, size: int):
    for t in nl.affine_range((n + size - 1) // size):
        yield t * size, min(size, n - t * size)
