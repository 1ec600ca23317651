"""Op families. Importing this package registers every lowering rule (one module per family)."""
from lowering.ops import views, elementwise, constants, matmul, reduction, normalization, shape, indexing  # noqa: F401
from lowering.ops import convolution  # noqa: F401
from lowering.ops import random, scan, selection  # noqa: F401
from lowering.ops import pooling, padding, upsample, conv_backward  # noqa: F401
from lowering.ops import bags, distance, fp8  # noqa: F401
from lowering.ops import attention  # noqa: F401
