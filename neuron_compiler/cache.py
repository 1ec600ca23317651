"""On-disk compile cache: lowered partition programs shared between processes.

    torch.compile(model, backend="neuron", options={"cache_dir": "~/.cache/neuron"})
    NEURON_CACHE_DIR=~/.cache/neuron python train.py

The in-process ``runtime.PROGRAM_CACHE`` is asked first; on a miss, this cache; on a miss
here too, the partition is lowered and the result stored here.

Layout: ``CACHE_DIR/<first 2 hex digits of the key>/<key>.neuron``, one file per entry::

    neuron-compile-cache 1\\n                           the magic line (format version)
    {"key": ..., "bytes": N, "sha256": ..., ...}\\n     the header: one JSON line
    <N bytes of pickle>                               the payload

Invariants
- Key: sha256 over the structural hash of the specialised partition graph (see
  ``runtime.program_key``: ops, arguments, shapes, strides, dtypes, constant tensor bytes), the
  input specs, every compile-relevant option, the target description (every field of its
  ``Target``), the package version, the torch version and a fingerprint of this package's source
  (``lowering``, ``runtime_sim``, ``neuron_compiler``), as Inductor keys its cache on its own
  source: an edited compiler never reads a program an older one wrote.
- Writes are atomic: the entry is written to a temporary file in the same directory, flushed,
  fsynced, then ``os.replace``d onto its name. A reader sees a whole entry or none, so two
  processes compiling the same partition at once both write complete entries (the last one
  wins; they are equal) and never corrupt each other.
- Reads verify the magic line, the header, the payload length and its sha256, and that the
  header names the key asked for, before unpickling. A corrupted or truncated entry is
  reported in a ``NeuronCacheWarning`` naming the file and what was wrong, removed, and counted
  as a miss: the partition is compiled again and the entry rewritten.
- An entry is checked against the request after loading: it carries the request it was
  written for (``request(...)``: graph hash, input specs, options, target description,
  versions, code fingerprint; the key is the sha256 of exactly that), which must hash to the
  key asked for, and its program's input specs must be the requested ones. Another graph's
  valid entry copied under this key (header rewritten or not) is reported, removed and
  recompiled like a corrupt one. (The sha256 sits in the same file: it catches corruption,
  not tampering; these checks catch a misplaced entry.)
- Loading executes nothing from the directory: the payload is read by a restricted unpickler
  (``_EntryUnpickler``) that resolves only the classes of the modules that hold a program's
  data (``_DATA_MODULES``: ``CacheEntry``, ``lowering.compiled``, ``runtime_sim``'s ISA, loops
  and statistics), torch dtypes, numpy arrays/dtypes, ``ml_dtypes`` scalar types and a few
  builtin containers; any other global (``os.system``, ``builtins.eval``, a function of the
  project, ...) makes the entry unreadable: reported, removed, recompiled, never called. An
  entry is only stored when it reads back under the same rules.
- What an entry holds, and why reusing it is safe: the lowered program (``CompiledGraph``) of one
  partition specialisation, or its ``Unsupported`` reason, plus its dump stage files; and, once
  the program has been timed, its timing statistics (``SimStats``: a timing result depends only
  on the program, ``lowering.compiled``), so a warm process's timing-mode first call does not
  simulate again. Values computed by a functional run are never stored. Everything in it is a
  pure function of the key's request.
- A cache directory that cannot be written (read-only, disk full) costs a warning, never a
  failed compile.
- Nothing here evicts entries; delete the directory to clear it.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import io
import json
import os
import pickle
import tempfile
import warnings
from dataclasses import dataclass

from neuron_compiler.logs import log

CACHE_DIR_ENV = "NEURON_CACHE_DIR"
MAGIC = b"neuron-compile-cache 1\n"
SUFFIX = ".neuron"
_PACKAGES = ("neuron_compiler", "lowering", "runtime_sim")


class NeuronCacheWarning(UserWarning):
    """A compile-cache entry could not be read (corrupt, truncated) or written."""


@dataclass
class CacheEntry:
    """What one entry holds: the lowering result of one partition specialisation."""

    origin: str                                   # "<graph>/<partition> <signature>"
    compiled: object | None                       # lowering CompiledGraph, or None
    unsupported: tuple | None                     # (op, reason, nodes) of an Unsupported, or None
    stage_files: list[tuple[str, str]] | None     # dump stage files, when it was dumped
    request: dict | None = None                   # what it was lowered for: ``request(...)``
    timing: object | None = None                  # the program's timing SimStats, once timed


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """sha256 of every ``.py`` file of the three packages (relative path and bytes)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    h = hashlib.sha256()
    for pkg in _PACKAGES:
        for dirpath, dirnames, files in os.walk(os.path.join(root, pkg)):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for f in sorted(files):
                if f.endswith(".py"):
                    path = os.path.join(dirpath, f)
                    h.update(os.path.relpath(path, root).encode() + b"\0")
                    with open(path, "rb") as fh:
                        h.update(fh.read())
                    h.update(b"\0")
    return h.hexdigest()


def target_description(name: str) -> dict:
    """Every field of target ``name``'s ``Target`` description (JSON-ready)."""
    from runtime_sim.targets import get_target
    return dataclasses.asdict(get_target(name))


def target_hash(name: str) -> str:
    """sha256 (first 16 hex digits) of a target description's fields, as sorted JSON."""
    text = json.dumps(target_description(name), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_key(graph_hash: str, specs: tuple, options: tuple, target: str) -> str:
    """The entry key (module docstring): hex sha256 of everything a lowering depends on."""
    return request_key(request(graph_hash, specs, options, target))


def request_key(parts: dict) -> str:
    """The key of request ``parts``: sha256 of its canonical JSON."""
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def request(graph_hash: str, specs: tuple, options: tuple, target: str) -> dict:
    """Everything a lowering depends on, JSON-ready: the graph's structural hash, the input
    specs (shape, dtype, resident, mutated), the options, the target description and the versions."""
    import torch

    from neuron_compiler.version import __version__
    parts = {
        "format": MAGIC.decode().strip(),
        "graph": graph_hash,
        "specs": [[list(shape), str(dtype), *rest] for shape, dtype, *rest in specs],
        "options": [list(o) for o in options],
        "target": target_description(target),
        "version": __version__,
        "torch": torch.__version__,
        "code": code_fingerprint(),
    }
    return json.loads(json.dumps(parts, sort_keys=True, default=str))   # plain JSON values


class DiskCache:
    """One cache directory (see the module docstring)."""

    def __init__(self, root: str):
        if not isinstance(root, (str, os.PathLike)) or not os.fspath(root):
            raise ValueError(f"cache_dir must be a directory path, got {root!r}")
        self.root = os.path.abspath(os.path.expanduser(os.fspath(root)))
        if os.path.exists(self.root) and not os.path.isdir(self.root):
            raise NotADirectoryError(f"cache_dir {self.root!r} exists and is not a directory")
        self._write_warned = False

    def path(self, key: str) -> str:
        if len(key) < 3 or not all(c in "0123456789abcdef" for c in key):
            raise ValueError(f"a cache key is a hex digest, got {key!r}")
        return os.path.join(self.root, key[:2], key + SUFFIX)

    def load(self, key: str) -> CacheEntry | None:
        """The entry stored under ``key``; None when there is none or it is corrupt (then it
        is reported in a warning and removed)."""
        path = self.path(key)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            self._corrupt(path, f"cannot be read ({exc})")
            return None
        problem, entry = _decode(data, key)
        if problem is None:
            problem = _mismatch(entry, key)  # type: ignore[arg-type]
        if problem is not None:
            self._corrupt(path, problem)
            return None
        return entry

    def store(self, key: str, entry: CacheEntry) -> str | None:
        """Write ``entry`` under ``key`` atomically; its path, or None when writing failed."""
        path = self.path(key)
        compiled = entry.compiled
        if compiled is not None and getattr(compiled, "_timing", None) is not None:
            compiled = dataclasses.replace(compiled, _timing=None)  # a run's values: not stored
        try:
            payload = pickle.dumps(dataclasses.replace(entry, compiled=compiled),
                                   protocol=pickle.HIGHEST_PROTOCOL)
            _EntryUnpickler(io.BytesIO(payload)).load()   # it must read back under the rules
        except (pickle.PicklingError, pickle.UnpicklingError, TypeError,
                AttributeError) as exc:
            log.warning("compile cache: %s cannot be stored: %s", entry.origin, exc)
            return None
        header = json.dumps({"key": key, "bytes": len(payload),
                             "sha256": hashlib.sha256(payload).hexdigest(),
                             "origin": entry.origin}, sort_keys=True).encode() + b"\n"
        tmp = None
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=SUFFIX, dir=os.path.dirname(path))
            with os.fdopen(fd, "wb") as f:
                f.write(MAGIC + header + payload)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            tmp = None
        except OSError as exc:
            if not self._write_warned:
                self._write_warned = True
                warnings.warn(f"neuron compile cache: cannot write to {self.root} ({exc}); "
                              f"compiling without storing", NeuronCacheWarning, stacklevel=2)
            return None
        finally:
            if tmp is not None:
                try:
                    os.remove(tmp)
                except OSError:
                    pass
        log.debug("compile cache: stored %s as %s", entry.origin, path)
        return path

    def _corrupt(self, path: str, problem: str) -> None:
        msg = (f"neuron compile cache: entry {path} is corrupt or misplaced ({problem}); it is "
               f"removed and the partition compiled again")
        warnings.warn(msg, NeuronCacheWarning, stacklevel=3)
        log.info("%s", msg)      # the warning is what the user sees; this is for TORCH_LOGS
        try:
            os.remove(path)
        except OSError:
            pass


def _decode(data: bytes, key: str) -> tuple[str | None, CacheEntry | None]:
    """(problem, None) for a bad entry, else (None, entry)."""
    if not data.startswith(MAGIC):
        return (f"expected the magic line {MAGIC!r}, got {data[:len(MAGIC)]!r}"
                f"{' (empty file)' if not data else ''}"), None
    end = data.find(b"\n", len(MAGIC))
    if end < 0:
        return f"the header line is truncated ({len(data)} bytes in the file)", None
    try:
        header = json.loads(data[len(MAGIC):end])
        want_len, want_sha = int(header["bytes"]), str(header["sha256"])
    except (ValueError, KeyError, TypeError) as exc:
        return f"unreadable header: {exc}", None
    if header.get("key") != key:
        return f"the header names key {header.get('key')!r}, expected {key!r}", None
    payload = data[end + 1:]
    if len(payload) != want_len:
        return f"expected a {want_len}-byte payload, got {len(payload)} bytes (truncated?)", None
    got_sha = hashlib.sha256(payload).hexdigest()
    if got_sha != want_sha:
        return f"payload sha256 {got_sha[:16]}..., expected {want_sha[:16]}...", None
    try:
        entry = _EntryUnpickler(io.BytesIO(payload)).load()
    except Exception as exc:   # a forbidden global, or the code changed
        return f"the payload does not unpickle: {type(exc).__name__}: {exc}", None
    if not isinstance(entry, CacheEntry):
        return f"the payload is a {type(entry).__name__}, expected a CacheEntry", None
    return None, entry


def _mismatch(entry: CacheEntry, key: str) -> str | None:
    """Why ``entry`` was not written for ``key`` (None: it was)."""
    if not isinstance(entry.request, dict):
        return "it records no request"
    if request_key(entry.request) != key:
        graph = str(entry.request.get("graph", "?"))[:16]
        return (f"it was written for another request (graph {graph}..., "
                f"{entry.request.get('specs')}): its request hashes to "
                f"{request_key(entry.request)[:16]}..., not to this key")
    specs = getattr(entry.compiled, "input_specs", None)
    if specs is not None:
        got = [[list(s.shape), str(s.dtype)] for s in specs]
        want = [spec[:2] for spec in entry.request.get("specs", [])]
        if got != want:
            return f"its program takes inputs {got}, the request has {want}"
    return None


# modules whose classes hold a program's data (no behaviour at construction)
_DATA_MODULES = frozenset({"neuron_compiler.cache", "lowering.compiled", "runtime_sim.isa",
                           "runtime_sim.loops", "runtime_sim.stats"})
_NUMPY = {("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "_reconstruct"),
          ("numpy._core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "scalar"),
          ("numpy._core.multiarray", "scalar")}
_BUILTINS = frozenset({"set", "frozenset", "slice", "complex", "range", "bytearray"})


class _EntryUnpickler(pickle.Unpickler):
    """Resolves only the globals a cache entry may hold (module docstring); anything else is
    an ``UnpicklingError`` naming it, raised before the object is ever called."""

    def find_class(self, module: str, name: str) -> object:
        import numpy as np
        import torch
        if module in _DATA_MODULES and "." not in name:
            obj = getattr(importlib.import_module(module), name, None)
            if isinstance(obj, type) and obj.__module__ == module:
                return obj
        elif module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        elif (module, name) in _NUMPY or (module.startswith("numpy") and name == "dtype"):
            return super().find_class(module, name)
        elif module.startswith("numpy.dtypes") and "." not in name:
            obj = getattr(np.dtypes, name, None)
            if isinstance(obj, type) and issubclass(obj, np.dtype):
                return obj
        elif module == "ml_dtypes" and "." not in name:
            import ml_dtypes
            obj = getattr(ml_dtypes, name, None)
            if isinstance(obj, type) and issubclass(obj, np.generic):
                return obj
        elif module == "builtins" and name in _BUILTINS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"the entry references {module}.{name}, which a cache "
                                     f"entry may not load")


@functools.lru_cache(maxsize=16)
def disk_cache(root: str) -> DiskCache:
    """The ``DiskCache`` of directory ``root`` (one object per directory in a process)."""
    return DiskCache(root)
