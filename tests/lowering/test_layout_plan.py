"""layout.plan_2d: which axis goes on the partitions."""
from lowering.tiling.layout import plan_2d


def _cover(shape, regions):
    n = 0
    for r in regions:
        outer = 1
        for s, _ in r.outer:
            outer *= s
        n += outer * r.rows * r.cols
    return n == shape[0] * shape[1] * shape[2]


def test_few_long_rows_split_onto_all_partitions():
    # [2, 128, 768] + a [128, 768] table broadcast over the batch: the contiguous operands
    # merge to [2, 98304]; the long axis goes on 128 partitions, the batch becomes a loop
    shape = (2, 128, 768)
    (r,) = plan_2d(shape, [(98304, 768, 1), (98304, 768, 1), (0, 768, 1)], [0, 0, 0])
    assert r.rows == 128 and r.cols == 768
    assert r.outer == ((2, (98304, 98304, 0)),)
    assert r.row_strides == (768, 768, 768)
    assert _cover(shape, [r])


def test_many_rows_keep_their_axis():
    shape = (256, 4, 768)
    (r,) = plan_2d(shape, [(3072, 768, 1), (0, 768, 1)], [0, 0])
    assert r.rows == 256 and r.cols == 3072 and _cover(shape, [r])
