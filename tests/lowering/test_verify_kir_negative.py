"""Negative tests of ``lowering.verify.verify_kir``: for every error site of the verifier, a
minimal ill-formed kernel program that triggers exactly that site (issue 26, item 4).

Each program is a well-formed base (``x @ w`` then ``+ b``, built directly so every field is
visible; ``test_real_graph_kir_passes_and_a_corruption_fails`` shows the same on a traced graph)
corrupted in one place with ``dataclasses.replace``. A test asserts the message with
``pytest.raises(match=...)`` built from the site's template and that no other site's template
matches it. ``test_every_site_has_a_negative_test`` compares the covered templates with the
sites read from the verifier's source (``verifier_sites.py``): a new check without a test here
fails the suite. ``verify_program`` delegates to ``runtime_sim.checks`` (tested in tests/machine)
and has no site of its own.
"""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

import lowering.verify as kir_verify
from lowering.api import TensorSpec
from lowering.errors import LoweringError
from lowering.frontend import build_kir
from lowering.kir import (EOp, Expr, HbmTensor, KKind, KOp, KProgram, MatmulKAttrs, PointwiseAttrs,
                          Role, TensorRef, contiguous_strides, load)
from lowering.verify import verify_kir
from lowering_helpers import rand, trace
from runtime_sim.isa import DType
from verifier_sites import assert_covered, error_sites, regex, sites_matching

F32 = DType.FP32
SITES = error_sites(kir_verify)


def ref(buf: str, *shape: int, offset: int = 0) -> TensorRef:
    return TensorRef(buf, F32, shape, contiguous_strides(shape), offset)


def base() -> KProgram:
    """``y = (x[1,4,8] @ w[1,8,6]) + b[1,4,6]`` through a temp ``t``: a matmul, then a pointwise."""
    kp = KProgram()
    for name, n, role in (("x", 32, Role.INPUT), ("w", 48, Role.INPUT), ("b", 24, Role.INPUT),
                          ("t", 24, Role.TEMP), ("y", 24, Role.OUTPUT)):
        kp.buffers[name] = HbmTensor(name, n, F32, role)
    kp.inputs = ["x", "w", "b"]
    kp.kernels = [
        KOp(KKind.MATMUL, (ref("t", 1, 4, 6),), (ref("x", 1, 4, 8), ref("w", 1, 8, 6)),
            MatmulKAttrs(), ("mm",)),
        KOp(KKind.POINTWISE, (ref("y", 1, 4, 6),), (ref("t", 1, 4, 6), ref("b", 1, 4, 6)),
            PointwiseAttrs(Expr(EOp.ADD, (load(0, F32), load(1, F32)), F32)), ("add",)),
    ]
    kp.outputs = [ref("y", 1, 4, 6)]
    return kp


def with_kernel(kp: KProgram, i: int, **changes) -> KProgram:
    kp.kernels[i] = replace(kp.kernels[i], **changes)
    return kp


# template -> builder of a program that triggers exactly that site
CASES = {
    "{}: unknown buffer %{}":
        lambda: with_kernel(base(), 1, ins=(ref("t", 1, 4, 6), ref("nope", 1, 4, 6))),
    "{}: view {} reaches element {} of %{} which has {} elements":
        # b has 24 elements; the view starts at 4 and reaches element 27
        lambda: with_kernel(base(), 1, ins=(ref("t", 1, 4, 6), ref("b", 1, 4, 6, offset=4))),
    "{}: reads %{} before any kernel writes it":
        lambda: KProgram(base().buffers, base().kernels[1:], base().inputs, base().outputs),
    "{}: expected at least {} inputs and 1 output, got {} and {}":
        # a matmul without its B operand (the verifier used to fail with an IndexError)
        lambda: with_kernel(base(), 0, ins=(ref("x", 1, 4, 8),)),
    "assert isinstance(k.attrs, PointwiseAttrs)":
        lambda: with_kernel(base(), 1, attrs=MatmulKAttrs()),
    "{}: pointwise input {} does not have the output shape {}":
        lambda: with_kernel(base(), 1, ins=(ref("t", 1, 4, 6), ref("b", 1, 6, 4))),
    "{}: expression loads a missing input":
        lambda: with_kernel(base(), 1, attrs=PointwiseAttrs(
            Expr(EOp.ADD, (load(0, F32), load(2, F32)), F32))),
    "{}: expected [*B,M,K] @ [*B,K,N] -> [*B,M,N], got {} @ {} -> {}":
        # K mismatch: A is [1,4,8], B [1,6,8] (elements fit w, so only the shape rule fires)
        lambda: with_kernel(base(), 0, ins=(ref("x", 1, 4, 8), ref("w", 1, 6, 8))),
    "{}: a_scale / a_shift must name [K] inputs beyond A and B":
        # a_scale names input 2, a [1,4,6] tensor instead of a [K] = [8] vector
        lambda: with_kernel(base(), 0, ins=(ref("x", 1, 4, 8), ref("w", 1, 8, 6), ref("b", 1, 4, 6)),
                            attrs=MatmulKAttrs(a_scale=2)),
    "output {} is never written":
        lambda: KProgram(base().buffers, base().kernels[:1], base().inputs, base().outputs),
}


def test_base_program_is_well_formed():
    verify_kir(base())


@pytest.mark.parametrize("template", list(CASES))
def test_each_site(template):
    kp = CASES[template]()
    exc = AssertionError if template.startswith("assert ") else LoweringError
    with pytest.raises(exc, match=None if exc is AssertionError else regex(template)) as info:
        verify_kir(kp)
    if exc is LoweringError:
        msg = str(info.value)
        assert sites_matching(msg, SITES) == [template], (msg, sites_matching(msg, SITES))
    else:   # the bare assert: raised from that line of the verifier
        assert info.traceback[-1].statement.lines[0].strip() == template, info.traceback[-1]


def _flipped_b(offset: int) -> KProgram:
    """Kernel 1 reads ``b`` (24 elements) through a view with a negative stride, as
    ``aten.flip`` makes: rows walk down from ``offset`` while columns walk up."""
    view = TensorRef("b", F32, (1, 4, 6), (24, -6, 1), offset)
    return with_kernel(base(), 1, ins=(ref("t", 1, 4, 6), view))


def test_pointwise_without_output():
    """The arity site for the other kind it covers (also an IndexError before)."""
    with pytest.raises(LoweringError, match=r"expected at least 0 inputs and 1 output, got 2 and 0"):
        verify_kir(with_kernel(base(), 1, outs=()))


def test_views_with_negative_strides():
    """A flipped view is bounded by its lowest and highest element, each named in the error.
    (Bug fixed with this test: the highest element used to add the negative strides too, so a
    flipped view running past the end of its buffer passed.)"""
    verify_kir(_flipped_b(18))                       # elements 0 .. 23: exactly the buffer
    with pytest.raises(LoweringError, match=r"reaches element 24 of %b which has 24 elements"):
        verify_kir(_flipped_b(19))                   # elements 1 .. 24
    with pytest.raises(LoweringError, match=r"reaches element -1 of %b which has 24 elements"):
        verify_kir(_flipped_b(17))                   # elements -1 .. 22


def test_every_site_has_a_negative_test():
    """The covered templates are exactly the verifier's raise/assert sites (read with ast)."""
    assert_covered(CASES, SITES)


def test_real_graph_kir_passes_and_a_corruption_fails():
    """The same route from a traced graph: its kernel IR verifies, and a kernel reading a
    buffer that does not exist is refused."""
    def f(x, w, b):
        return F.relu(F.linear(x, w, b))
    inputs = (rand(8, 16, seed=1), rand(12, 16, seed=2), rand(12, seed=3))
    kp = build_kir(trace(f, *inputs), [TensorSpec(tuple(x.shape), torch.float32) for x in inputs])
    verify_kir(kp)
    k = kp.kernels[-1]
    kp.kernels[-1] = replace(k, ins=(replace(k.ins[0], buffer="ghost"),) + k.ins[1:])
    with pytest.raises(LoweringError, match=regex("{}: unknown buffer %{}")):
        verify_kir(kp)
