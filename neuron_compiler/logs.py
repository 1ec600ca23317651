"""The ``neuron_compiler`` logger and its tlparse artifacts, wired into ``torch._logging``.

    TORCH_LOGS="neuron_compiler"    INFO: decisions
    TORCH_LOGS="+neuron_compiler"   DEBUG: decisions and details
    TORCH_TRACE=/some/dir           structured artifacts for tlparse

What is logged, at which level
- INFO: per compiled ATen graph, the partitioning summary (device partitions, device / fallback
  node counts) and every fallback op with its count and reason; per partition specialisation,
  its compile time and instruction count, or that its program came from the process-wide
  program cache; a partition whose lowering was refused (it runs eagerly) with its op and reason.
- WARNING: internal compile errors (a lowering bug), with the graph, partition and op(s), just
  before the ``NeuronInternalError`` is raised.
- DEBUG: the ops of every device partition, each fallback node with its reason, the input
  signature of each partition compile.
- Artifacts (``trace_structured("artifact", ...)``): ``neuron_compiler_graph`` once per compiled
  ATen graph (JSON: partition table and fallback table); ``neuron_compiler_partition`` once per
  partition specialisation (JSON: compile time, instructions per queue, cache hit).
- Each artifact carries the compile id (``[frame/compile]`` in tlparse) of the Dynamo compile
  its graph came from. The graph artifact is emitted inside that compile, where
  ``torch._guards.CompileContext`` holds the id. A partition is compiled lazily at its first
  call, after Dynamo's compile has returned (no context then, and tlparse would file it under
  ``[-/-]``): its owner takes ``current_compile_id()`` when the graph is compiled and passes it
  as ``artifact(..., compile_id=...)``. A compile context active at emission wins over it.

Invariants
- Registering is idempotent (``register_log`` only when the alias is unknown) and tolerant of
  torch versions without ``torch._logging`` internals: then the logger is a plain logger.
- Without ``TORCH_LOGS`` naming it the logger has no handler and no level of its own, so nothing
  below WARNING is printed. Artifacts cost nothing unless a trace handler is installed
  (``payload_fn`` is only called then).
"""
from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable

LOG_NAME = "neuron_compiler"
log = logging.getLogger(LOG_NAME)


def _register() -> bool:
    """Make ``TORCH_LOGS`` / ``torch._logging.set_logs`` know ``neuron_compiler``; True if so."""
    try:
        from torch._logging import _internal
    except ImportError:  # pragma: no cover - torch without torch._logging
        return False
    registry = getattr(_internal, "log_registry", None)
    register = getattr(_internal, "register_log", None)
    if registry is None or register is None:  # pragma: no cover - unknown torch layout
        return False
    known = registry.is_log(LOG_NAME) or LOG_NAME in getattr(registry, "child_log_qnames", ())
    if not known:
        register(LOG_NAME, LOG_NAME)
        # TORCH_LOGS was read when torch was imported; if it names us and torch did not set us
        # up then (older torch resolving module names differently), apply it again now.
        if LOG_NAME in os.environ.get("TORCH_LOGS", "") and not log.handlers:
            init = getattr(_internal, "_init_logs", None)
            if init is not None:
                init()
    return True


REGISTERED = _register()


def current_compile_id() -> object | None:
    """The ``torch._guards.CompileId`` of the Dynamo compile running now (None outside one).
    Take it while a graph is compiled and hand it to ``artifact`` for what is emitted later."""
    try:
        from torch._guards import CompileContext
    except ImportError:  # pragma: no cover - torch without torch._guards
        return None
    return CompileContext.current_compile_id()


def artifact(name: str, payload: Callable[[], object], compile_id: object | None = None) -> None:
    """Emit a JSON tlparse artifact ``name``; ``payload`` is called only when tracing is on.
    ``compile_id`` (a ``CompileId`` from ``current_compile_id()``) files it under that compile
    when no compile context is active (a lazily compiled partition)."""
    try:
        from torch._logging import trace_structured
    except ImportError:  # pragma: no cover
        return
    trace_structured(
        "artifact",
        metadata_fn=lambda: {"name": name, "encoding": "json"},
        payload_fn=lambda: json.dumps(payload(), sort_keys=True),
        expect_trace_id=False,
        compile_id=compile_id,  # type: ignore[arg-type]
    )
