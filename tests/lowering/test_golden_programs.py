"""Golden text of three more graphs, down to the synchronisation and the machine program.

The kernel IR before/after fusion, the tile IR, the semaphore waits of each tile instruction
(``sync.txt``) and the emitted machine program (``program.txt``) that ``compile_graph(...,
dump=...)`` writes are compared with ``tests/golden/lowering/<case>/``:
- ``attention_sdpa``: ``scaled_dot_product_attention`` on [1, 2, 128, 32] fp32, one fused
  ATTENTION kernel on the device;
- ``matmul_loop``: [256, 256] @ [256, 512] fp32, whose tile IR and program keep loops (over
  row groups and K groups);
- ``conv2d``: 3x3 convolution with padding and bias, [1, 8, 10, 10] -> [1, 16, 10, 10].
Regenerate after an intended change exactly as test_golden.py says (``UPDATE_GOLDEN=1`` or
``--update-golden``) and review the diff like code. Each graph is also checked against eager.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lowering_helpers import check, rand
from test_golden import IR_FILES, assert_golden

FILES = IR_FILES + ("sync.txt", "program.txt")


def _sdpa_inputs():
    g = torch.Generator().manual_seed(11)
    return tuple(torch.randn(1, 2, 128, 32, generator=g) for _ in range(3))


CASES = {
    # name: (fn, inputs, scale)
    "attention_sdpa": (F.scaled_dot_product_attention, _sdpa_inputs, 1.0),
    "matmul_loop": (lambda a, b: a @ b, lambda: (rand(256, 256, seed=12), rand(256, 512, seed=13) * 0.1),
                    10.0),
    "conv2d": (lambda x, w, b: F.conv2d(x, w, b, padding=1),
               lambda: (rand(1, 8, 10, 10, seed=14), rand(16, 8, 3, 3, seed=15) * 0.2,
                        rand(16, seed=16)), 1.0),
}

_lowered: dict[str, object] = {}


def _lower(name):
    if name not in _lowered:          # one lowering per case for all the tests of this module
        fn, make_inputs, scale = CASES[name]
        _lowered[name] = check(fn, *make_inputs(), scale=scale)
    return _lowered[name]


def _kernels(low) -> list[str]:
    return [ln.split("= ", 1)[1].split("[", 1)[0]
            for ln in low.dumps["ir_post_fusion.txt"].splitlines() if " = " in ln]


@pytest.mark.parametrize("name", list(CASES))
def test_golden_programs(name, request):
    assert_golden(name, _lower(name).dumps, FILES, request.config)


def test_golden_cases_are_what_they_claim():
    """Independent of the golden text: SDPA is one ATTENTION kernel, the matmul's tile IR and
    machine program keep loops, the convolution is one CONV kernel; every file stays small."""
    assert _kernels(_lower("attention_sdpa")) == ["attention"]
    mm = _lower("matmul_loop")
    assert _kernels(mm) == ["matmul"]
    assert "\n  for " in mm.dumps["tir.txt"] and "    for " in mm.dumps["program.txt"]
    assert _kernels(_lower("conv2d")) == ["conv"]
    for name in CASES:
        for f in FILES:
            n = len(_lower(name).dumps[f].splitlines())
            assert n < 300, f"{name}/{f} has {n} lines: pick a smaller shape for its golden"
