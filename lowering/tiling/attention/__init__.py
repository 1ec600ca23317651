"""Tiling of ATTENTION kernels (``kernel.tile_attention``, the tiler the registry calls).

Modules, each importing only those after it in this list (and ``matmul``'s operand sides):
- ``kernel``: the dispatch by shape and the flash form (online softmax over key blocks): groups
  of query blocks, their key-block pipeline, batch items one step each;
- ``decode``: one or a few query rows against a cache (a decode step);
- ``rows``: whole score rows in PSUM, a two-phase softmax per query block;
- ``bias``: a score bias shared by every head, evaluated once;
- ``plan``: choices scored by the cost model (where exps run, DMA transposes of P^T, engines);
- ``steps``: the steps on one key block (products, row max, exp, P^T, second products) and the
  tile helpers the others share.
The software pipelines are the tile IR's construct (``lowering/tir/pipelined.py``).
"""
