"""pow of a float base by an integer exponent tensor (BLOOM's ALiBi slopes:
``torch.pow(base, torch.arange(1, 1 + n, dtype=torch.int32))``) runs on the device, the exponent
promoted to the float result type as eager's type promotion does; an integer base falls back
with the reason. Checked against eager on shapes crossing partition and free-axis tile edges."""
from __future__ import annotations

import pytest
import torch

from lowering_helpers import assert_close, check, trace, unsupported_nodes


@pytest.mark.parametrize("rows,cols,edt", [(3, 130, torch.int32), (129, 600, torch.int64)])
def test_float_base_integer_exponent_matches_eager(rows, cols, edt):
    g = torch.Generator().manual_seed(rows + cols)
    base = torch.rand(rows, generator=g) * 0.9 + 0.05
    powers = torch.randint(-6, 12, (cols,), generator=g, dtype=edt)
    fn = lambda b, p: torch.pow(b[:, None], p[None, :])  # noqa: E731
    low = check(fn, base, powers)
    with pytest.raises(AssertionError):      # an exponent off by one is seen
        assert_close(low.outputs[0], fn(base, powers + 1))


def test_bloom_alibi_slopes():
    n = 12
    base = torch.tensor(2.0 ** -(2.0 ** -(4 - 3)), dtype=torch.float32)   # 16 heads: 2**-0.5
    fn = lambda b, p: torch.pow(b, p)  # noqa: E731
    check(fn, base.reshape(1), torch.arange(1, 1 + n, dtype=torch.int32))


def test_an_integer_base_falls_back_with_the_reason():
    x = torch.randint(1, 4, (8,), dtype=torch.int32)
    bad = unsupported_nodes(trace(lambda a, b: torch.pow(a, b), x, x))
    assert bad and "integer pow" in bad[0]
