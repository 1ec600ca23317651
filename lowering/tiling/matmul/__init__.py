"""Tiling of MATMUL kernels on TensorE (``kernel.tile_matmul``, the tiler the registry calls).

Modules:
- ``kernel``: the operand sides (``_Side``: direct, DMA- or TensorE-transposed, resident) and the
  blocked loop nests;
- ``plan``: the blocking, chosen by scoring candidates with the cost model (``choose_blocking``);
- ``cells``: the output cells' evacuation (bias, residual, epilogue);
- ``once``: the streamed side transposed once, up front;
- ``outres``: the output block resident in SBUF, both operands streamed in K chunks;
- ``transposed``: results computed transposed (weights stationary);
- ``prologue``: work folded into an operand as it is loaded (a norm's scale, a power-of-two
  factor);
- ``fp8``: fp8 operands packed two K rows per partition.
"""
