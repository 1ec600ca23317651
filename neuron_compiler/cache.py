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
- A cache directory that cannot be written (read-only, disk full) costs a warning, never a
  failed compile.
- Entries are pickles: point ``cache_dir`` only at a directory you trust (as with Inductor's
  cache). Nothing here evicts entries; delete the directory to clear it.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
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
    unsupported: tuple[str, str] | None           # (op, reason) of an Unsupported, or None
    stage_files: list[tuple[str, str]] | None     # dump stage files, when it was dumped


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
    import torch

    import neuron_compiler
    parts = {
        "format": MAGIC.decode().strip(),
        "graph": graph_hash,
        "specs": [[list(shape), str(dtype), *rest] for shape, dtype, *rest in specs],
        "options": [list(o) for o in options],
        "target": target_description(target),
        "version": neuron_compiler.__version__,
        "torch": torch.__version__,
        "code": code_fingerprint(),
    }
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


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
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
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
        msg = (f"neuron compile cache: entry {path} is corrupt ({problem}); it is removed "
               f"and the partition compiled again")
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
        entry = pickle.loads(payload)
    except Exception as exc:   # a checksummed payload that does not unpickle: code changed
        return f"the payload does not unpickle: {type(exc).__name__}: {exc}", None
    if not isinstance(entry, CacheEntry):
        return f"the payload is a {type(entry).__name__}, expected a CacheEntry", None
    return None, entry


@functools.lru_cache(maxsize=16)
def disk_cache(root: str) -> DiskCache:
    """The ``DiskCache`` of directory ``root`` (one object per directory in a process)."""
    return DiskCache(root)
