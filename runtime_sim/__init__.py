"""runtime_sim: the machine. A cycle-approximate NeuronCore (Trainium) simulator that also
computes values.

- ``isa``: the program grammar (buffers, access patterns, instructions, queues, semaphores);
  ``loops``: streams as loop nests (``Stream``, ``Loop``, ``Looped``, ``LWait``, ``Index``).
- ``targets``: trn1 / trn2 / trn3 hardware descriptions (every number with its source).
- ``semantics``: one table Op -> numpy function (what an instruction computes).
- ``costs``: one table Op -> cost function (how long it takes), plus the DMA model.
- ``checks``: the error hierarchy and the static program rules; ``races``: happens-before race
  detection; ``memory``: HBM/SBUF/PSUM as bytes.
- ``simulator.simulate``: the discrete-event loop -> ``SimResult`` (stats, outputs, trace).
- ``trace``: Chrome trace-event JSON export.

Invariant: this package imports numpy and ml_dtypes only -- never torch, ``lowering`` or
``neuron_compiler``. A program for it can be written by hand, by a test or by the compiler.
"""
from .isa import (AP, ATTRS_OF_OP, ENGINES_OF_OP, GPSIMD, SCALAR, TENSOR, VECTOR, ActFunc,
                  ActivationAttrs, AluOp, BnAggrAttrs, BnStatsAttrs, Buffer, DmaAttrs,
                  DmaGatherAttrs, DmaScatterAttrs, DType, EngineKind, ExponentialAttrs, Instr, IotaAttrs,
                  MatmulAttrs, MatmulMxAttrs, MatmulPerfMode, Memory, MemsetAttrs, Op, OpAttrs,
                  Program, QuantizeMxAttrs, Queue, SelectAttrs, SemAttrs, TensorCopyAttrs, TensorReduceAttrs,
                  TensorScalarAttrs, TensorTensorAttrs, TensorTensorScanAttrs, TransposeAttrs, ap,
                  dma_queue, tile_ap)
from .loops import Index, Loop, Looped, LWait, Stream
from .targets import DEFAULT_TARGET, TARGETS, TRN1, TRN2, TRN3, Target, get_target
from .stats import SimResult, SimStats, TraceEvent
from .checks import (AccessPatternError, AlignmentError, BoundsError, CapacityError,
                     DeadlockError, EngineError, InputError, MachineError, OperandError,
                     ProgramError, PsumAccumulateError, RaceError, UninitializedReadError)
from .checks_program import check_program
from .costs import COSTS, Cost, instr_cost
from .semantics import SEMANTICS
from .simulator import simulate
from .trace import to_chrome_trace, write_chrome_trace

__all__ = [
    "AP", "ATTRS_OF_OP", "ENGINES_OF_OP", "GPSIMD", "SCALAR", "TENSOR", "VECTOR", "ActFunc",
    "ActivationAttrs", "AluOp", "BnAggrAttrs", "BnStatsAttrs", "Buffer", "DmaAttrs",
    "DmaGatherAttrs", "DmaScatterAttrs", "DType",
    "EngineKind", "ExponentialAttrs", "Instr", "IotaAttrs", "MatmulAttrs", "MatmulMxAttrs",
    "MatmulPerfMode", "Memory", "MemsetAttrs", "Op", "OpAttrs",
    "Program", "QuantizeMxAttrs", "Queue", "SelectAttrs", "SemAttrs", "TensorCopyAttrs", "TensorReduceAttrs",
    "TensorScalarAttrs", "TensorTensorAttrs", "TensorTensorScanAttrs", "TransposeAttrs", "ap",
    "dma_queue", "tile_ap", "Index", "Loop", "Looped", "LWait", "Stream",
    "DEFAULT_TARGET", "TARGETS", "TRN1", "TRN2", "TRN3", "Target", "get_target",
    "SimResult", "SimStats", "TraceEvent",
    "AccessPatternError", "AlignmentError", "BoundsError", "CapacityError", "DeadlockError",
    "EngineError", "InputError", "MachineError", "OperandError", "ProgramError",
    "PsumAccumulateError", "RaceError", "UninitializedReadError", "check_program",
    "COSTS", "Cost", "instr_cost", "SEMANTICS", "simulate", "to_chrome_trace",
    "write_chrome_trace",
]
