"""The process-wide program cache: one lowering per structurally identical partition.

Invariants
- Key: a structural hash of the specialised partition graph (node order, ops, arguments with
  node references as positions, every node's shape/stride/dtype, the bytes of ``get_attr``
  tensors; not node names), the input specs, the target, every option except the run-time-only
  ``dump_dir``/``sim_mode``/``fallback``/``cache_dir`` and the host-side assumptions
  ``host_link_gbps``/``call_overhead_us`` (they time copies and launches, not the program),
  and the lowering entry point itself. Equal keys lower
  to the same program, so identical partitions (BERT's 12 layers) are lowered once; an
  ``Unsupported`` result is cached the same way.
- Entries live as long as some partition uses them (weak values): no program outlives the
  models that use it. A dumped compile replays the cached stage files into its own dump
  directory (plus ``cache_hit.txt``); an entry lowered without a dump is lowered again when a
  dump is asked for (so dumps are complete).
- On a miss, the on-disk compile cache (``cache_dir``, ``neuron_compiler.cache``) is asked
  next, keyed on the same structure plus the target description and the compiler's versions;
  a graph whose key holds object ids (``call_module``, non-tensor ``get_attr``) never uses
  it. A program lowered here is stored there; its stage files travel with it, so a dump of a
  disk hit is complete too (an entry stored without them is lowered again when a dump asks).
- What a disk entry holds, and what is checked when it is loaded: ``neuron_compiler.cache``.
"""
from __future__ import annotations

import hashlib
import operator
import weakref
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.fx import GraphModule, Node

from neuron_compiler.cache import CacheEntry
from neuron_compiler.options import NeuronOptions
from runtime_sim.stats import SimResult


def tensor_data(t: torch.Tensor) -> bytes:
    """The bytes of ``t``'s elements, C-contiguous (any dtype, 0-d included)."""
    flat = t.detach().resolve_conj().resolve_neg().cpu().contiguous().reshape(-1)
    return np.from_dlpack(flat.view(torch.uint8)).tobytes()   # not .numpy(): runtime.to_numpy


_RUNTIME_ONLY_OPTIONS = frozenset({"dump_dir", "sim_mode", "fallback", "cache_dir",
                                   "host_link_gbps", "call_overhead_us"})


@dataclass(eq=False)
class CachedProgram:
    """One lowering result, shared by every identical partition specialisation."""

    origin: str                                   # "<graph>/<partition> <signature>"
    stage_files: list[tuple[str, str]] | None     # dump files of that lowering (None: no dump)
    compiled: object | None = None                # lowering CompiledGraph
    unsupported: Exception | None = None          # or the Unsupported it raised
    on_disk: set[str] = field(default_factory=set)  # cache directories that hold it
    request: dict | None = None                   # its on-disk request (``cache.request``)
    timed_on_disk: set[str] = field(default_factory=set)  # directories holding its timing


class ProgramCache:
    """Structural key -> ``CachedProgram``, held weakly (see the module docstring)."""

    def __init__(self) -> None:
        self._entries: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self.hits = 0
        self.misses = 0
        self.disk_hits = 0        # misses served by the on-disk compile cache (not lowered)

    def get(self, key: tuple, need_stage_files: bool = False) -> CachedProgram | None:
        prog = self._entries.get(key)
        if prog is None or (need_stage_files and prog.stage_files is None):
            self.misses += 1
            return None
        self.hits += 1
        return prog

    def put(self, key: tuple, prog: CachedProgram) -> None:
        self._entries[key] = prog

    def info(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses, "disk_hits": self.disk_hits,
                "entries": len(self._entries)}

    def clear(self) -> None:
        self._entries.clear()
        self.hits = self.misses = self.disk_hits = 0


PROGRAM_CACHE = ProgramCache()


def program_cache_info() -> dict[str, int]:
    """Process-wide program-cache counts: ``hits``, ``misses`` (of which ``disk_hits`` were read
    from the on-disk compile cache, the rest lowered) and live ``entries``."""
    return PROGRAM_CACHE.info()


class _Ref:
    __slots__ = ("i",)

    def __init__(self, i: int) -> None:
        self.i = i

    def __repr__(self) -> str:
        return f"%{self.i}"


def _val_key(v: object) -> object:
    if isinstance(v, torch.Tensor):
        return ("T", tuple(str(s) for s in v.shape), tuple(str(s) for s in v.stride()),
                str(v.dtype))
    if isinstance(v, (tuple, list)):
        return tuple(_val_key(x) for x in v)
    return repr(v)


def _target_key(gm: GraphModule, n: Node) -> object:
    if n.op == "call_function":
        t = n.target
        if isinstance(t, torch._ops.OpOverload):
            return str(t)
        return f"{getattr(t, '__module__', '')}.{getattr(t, '__qualname__', repr(t))}"
    if n.op == "get_attr":
        value = operator.attrgetter(str(n.target))(gm)
        if isinstance(value, torch.Tensor):
            digest = hashlib.sha256(tensor_data(value)).hexdigest()
            return ("tensor", tuple(value.shape), str(value.dtype), digest)
        return ("object", id(gm), str(n.target))   # never shared across graph modules
    if n.op in ("call_module", "call_method"):
        return (n.op, id(gm), str(n.target))
    return None                                     # placeholder/output: position is enough


def process_local(gm: GraphModule) -> bool:
    """True when ``program_key`` keys ``gm`` by object ids (see ``_target_key``)."""
    for n in gm.graph.nodes:
        if n.op in ("call_module", "call_method"):
            return True
        if n.op == "get_attr" and not isinstance(operator.attrgetter(str(n.target))(gm),
                                                 torch.Tensor):
            return True
    return False


def to_disk_entry(prog: CachedProgram) -> CacheEntry:
    """The disk entry of ``prog``: its program, or its Unsupported reason, its stage files,
    its request and, once it was timed, its timing statistics (values never)."""
    exc = prog.unsupported
    timing = getattr(prog.compiled, "_timing", None)
    return CacheEntry(prog.origin, prog.compiled,
                      None if exc is None else (str(getattr(exc, "op", "?")),
                                                str(getattr(exc, "reason", exc)),
                                                tuple(getattr(exc, "nodes", ()))),
                      prog.stage_files, prog.request,
                      None if timing is None else timing.stats)


def from_disk_entry(entry: CacheEntry | None, api: object,
                    need_stage_files: bool) -> CachedProgram | None:
    """The ``CachedProgram`` of a disk entry (None: no entry, or no stage files when a dump needs
    them: then it is lowered again, and stored again with them)."""
    if entry is None or (need_stage_files and entry.stage_files is None):
        return None
    prog = CachedProgram(entry.origin, entry.stage_files, entry.compiled, request=entry.request)
    if entry.timing is not None and entry.compiled is not None:
        entry.compiled._timing = SimResult(entry.timing)  # type: ignore[attr-defined]
    if entry.unsupported is not None:
        prog.unsupported = api.Unsupported(*entry.unsupported)  # type: ignore[attr-defined]
    return prog


def program_key(gm: GraphModule, specs: list, options: NeuronOptions,
                compiler: object) -> tuple:
    """The structural key of a specialised partition (see the module docstring)."""
    h = hashlib.sha256()
    index: dict[Node, int] = {}
    for n in gm.graph.nodes:
        index[n] = len(index)
        args = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: _Ref(index[a]))
        h.update(repr((n.op, _target_key(gm, n), args, _val_key(n.meta.get("val")))).encode())
        h.update(b"\n")
    opts = tuple(sorted((k, repr(v)) for k, v in options.to_dict().items()
                        if k not in _RUNTIME_ONLY_OPTIONS))
    return (h.hexdigest(), tuple((tuple(s.shape), str(s.dtype), s.resident, s.mutated) for s in specs), opts,
            compiler)


