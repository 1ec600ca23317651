"""Op families. Importing this package registers every lowering rule (one module per family)
into ``registry_table.REGISTRY``.

This is the one place that loads every family; ``registry._ensure_loaded`` imports it before any
lookup. The families import only the leaves below them (``common.py``, ``conv_common.py``,
``registry_table``, ``lower_ctx``) and each other, never this package or ``registry``.
"""
from lowering.ops import views, elementwise, constants, matmul, reduction, normalization, shape, indexing  # noqa: F401
from lowering.ops import convolution  # noqa: F401
from lowering.ops import random, scan, selection  # noqa: F401
from lowering.ops import pooling, padding, upsample, conv_backward  # noqa: F401
from lowering.ops import bags, distance, fp8  # noqa: F401
from lowering.ops import attention  # noqa: F401
