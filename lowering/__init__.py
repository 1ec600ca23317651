"""ATen graph -> tiled Trainium IR -> machine program.

Public face: ``lowering.api`` (why_unsupported, compile_graph, CompiledGraph) and
``lowering.memory.pack_offsets``. This package may import torch and ``runtime_sim``, never
``neuron_compiler``. The stages and their order are in ``lowering.pipeline``.
"""
