"""One Chrome trace of many ranks: per-rank traces merged, a process per rank and partition.

Three ways in:

- ``export_distributed_chrome_trace(prof, path, group=None)`` (or
  ``prof.export_chrome_trace(path, all_ranks=True)``), called on every rank of an initialised
  torch.distributed process group: each rank builds ``prof.chrome_trace()``, the traces are
  gathered to the group's first rank with ``torch.distributed.gather_object``, and that rank
  writes the merged file;
- ``merge_chrome_traces(traces, labels=None)``: trace dicts (or paths of trace files) merged in
  memory;
- ``python -m neuron_compiler.trace_merge rank0.json rank1.json -o all.json``: files written
  separately per rank (``prof.export_chrome_trace(f"rank{rank}.json")``).

Invariants
- Input ``k`` (rank ``k`` unless ``labels`` says otherwise) is named ``labels[k]``, by default
  ``"rank k"``. Its processes get new pids, numbered from 1 across the inputs in input order,
  then in the order of their original pids (numeric pids ascending, then the others in order of
  first appearance), so two ranks' processes never share a pid; thread ids stay as they are (a
  thread belongs to its process).
- Every input event appears exactly once in the output, a shallow copy with every field kept
  except: ``pid`` renumbered; a ``process_name`` metadata event's name becomes
  ``"<label> / <original name>"``; a ``process_sort_index`` metadata event's index becomes the
  new pid. A process without a ``process_name`` gets one (``"<label> / pid <original pid>"``),
  one without a ``process_sort_index`` gets one (the new pid), so processes sort rank 0's
  first, then rank 1's, each rank's in its own order. An event without a pid is a process of
  its own (original pid shown as ``-``).
- Collective events (``cat == "collective"``, this project's collectives process) carry the
  rank in ``args["rank"]``: the rank that recorded it when gathered by
  ``export_distributed_chrome_trace`` (its global rank), the input's index when merged from
  files, unless the event already has one. Times are left alone: every rank's trace starts at
  0 (one call of each partition, the collectives laid end to end in each rank's collectives
  process, each lasting its own modelled time), so the ranks' collectives line up as the ranks'
  programs do.
- Async / flow event ids are not renumbered (the traces this project writes have none).
- The output is ``{"traceEvents": [...], "displayTimeUnit": <first input's, or "ns">,
  "otherData": {"ranks": "<label>, <label>, ...", "<label>/<key>": <value>, ...}}``, i.e. each
  input's ``otherData`` kept under its label. Inputs are never modified.
- An input that is not a trace (no ``traceEvents`` list, an event that is not an object, a file
  that is missing or not JSON) raises ``ValueError`` naming the file (or ``trace k`` for a dict)
  before anything is written.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

__all__ = ["merge_chrome_traces", "export_distributed_chrome_trace", "main"]

TracesIn = Sequence["dict | list | str | os.PathLike"]


def _load(trace: object, index: int) -> tuple[list, dict, str]:
    """(events, the trace object without its events, a name for errors) of input ``index``."""
    if isinstance(trace, (str, os.PathLike)):
        where = os.fspath(trace)
        try:
            with open(where) as f:
                trace = json.load(f)
        except OSError as e:
            raise ValueError(f"{where}: cannot read the trace file: {e.strerror or e}") from e
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not JSON ({e})") from e
    else:
        where = f"trace {index}"
    if isinstance(trace, list):                  # the JSON Array Format: the events alone
        trace = {"traceEvents": trace}
    if not isinstance(trace, dict):
        raise ValueError(f"{where}: expected a Chrome trace object with 'traceEvents', got "
                         f"{type(trace).__name__}")
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        got = "nothing" if events is None else type(events).__name__
        raise ValueError(f"{where}: expected a Chrome trace with a 'traceEvents' list, got "
                         f"{got} under 'traceEvents' (keys: {sorted(trace)})")
    for k, e in enumerate(events):
        if not isinstance(e, dict):
            raise ValueError(f"{where}: traceEvents[{k}] is {type(e).__name__}, expected an "
                             f"event object")
    return events, trace, where


def _pid_order(events: list[dict]) -> list[object]:
    """The distinct original pids of one input, in the order their processes are numbered."""
    seen: dict[object, None] = {}
    for e in events:
        seen.setdefault(_pid_key(e.get("pid")), None)
    numeric = sorted(p for p in seen if isinstance(p, int) and not isinstance(p, bool))
    return numeric + [p for p in seen if not (isinstance(p, int) and not isinstance(p, bool))]


def _pid_key(pid: object) -> object:
    """A hashable key for an original pid (JSON gives ints and strings; anything else by repr)."""
    return pid if isinstance(pid, (int, str)) or pid is None else repr(pid)


def _is_meta(e: dict, name: str) -> bool:
    return e.get("ph") == "M" and e.get("name") == name


def merge_chrome_traces(traces: TracesIn, labels: Sequence[str] | None = None) -> dict:
    """Merge per-rank Chrome trace-event JSON objects (dicts, event lists, or paths of trace
    files) into one trace: a process per input process, named ``"<label> / <name>"``, with
    pids that never collide between inputs (module docstring). ``labels`` default to
    ``"rank 0"``, ``"rank 1"``, ... in input order."""
    traces = list(traces)
    if not traces:
        raise ValueError("merge_chrome_traces: expected at least one trace, got none")
    if labels is None:
        labels = [f"rank {k}" for k in range(len(traces))]
    labels = [str(label) for label in labels]
    if len(labels) != len(traces):
        raise ValueError(f"merge_chrome_traces: expected one label per trace ({len(traces)}), "
                         f"got {len(labels)}: {labels}")
    loaded = [_load(t, k) for k, t in enumerate(traces)]
    out: list[dict] = []
    other: dict[str, object] = {"ranks": ", ".join(labels)}
    next_pid = 1
    for rank, ((events, trace, _), label) in enumerate(zip(loaded, labels)):
        order = _pid_order(events)
        new_pid = {p: next_pid + k for k, p in enumerate(order)}
        next_pid += len(order)
        named = {_pid_key(e.get("pid")) for e in events if _is_meta(e, "process_name")}
        sorted_ = {_pid_key(e.get("pid")) for e in events if _is_meta(e, "process_sort_index")}
        for p in order:                          # a name and a place for every process
            shown = "-" if p is None else p
            if p not in named:
                out.append({"name": "process_name", "ph": "M", "pid": new_pid[p], "tid": 0,
                            "args": {"name": f"{label} / pid {shown}"}})
            if p not in sorted_:
                out.append({"name": "process_sort_index", "ph": "M", "pid": new_pid[p],
                            "tid": 0, "args": {"sort_index": new_pid[p]}})
        for e in events:
            out.append(_renumbered(e, new_pid[_pid_key(e.get("pid"))], label, rank))
        for key, value in (trace.get("otherData") or {}).items():
            other[f"{label}/{key}"] = value
    unit = next((t.get("displayTimeUnit") for _, t, _ in loaded if t.get("displayTimeUnit")),
                "ns")
    return {"traceEvents": out, "displayTimeUnit": unit, "otherData": other}


def _renumbered(e: dict, pid: int, label: str, rank: int) -> dict:
    """A copy of event ``e`` in process ``pid`` of input ``label`` (module docstring)."""
    e = dict(e, pid=pid)
    args = e.get("args")
    if _is_meta(e, "process_name"):
        name = args.get("name", "") if isinstance(args, dict) else ""
        e["args"] = dict(args if isinstance(args, dict) else {}, name=f"{label} / {name}")
    elif _is_meta(e, "process_sort_index"):
        e["args"] = dict(args if isinstance(args, dict) else {}, sort_index=pid)
    elif e.get("cat") == "collective":
        args = dict(args) if isinstance(args, dict) else {}
        args.setdefault("rank", rank)
        e["args"] = args
    return e


def export_distributed_chrome_trace(prof: object, path: str, group: object = None) -> str | None:
    """Write one Chrome trace of every rank's profile ``prof`` (a ``neuron_compiler.Profile``)
    to ``path``: call it on every rank of ``group`` (default: the world) of an initialised
    torch.distributed process group. The traces are gathered with ``gather_object`` (gloo, or
    any backend that can gather Python objects) to the group's first rank, which writes the
    merged file (``merge_chrome_traces``, labels ``"rank <global rank>"``) and returns
    ``path``; the other ranks write nothing and return None. A rank whose trace could not be
    built still takes part in the gather (so no rank waits forever), then raises; the first
    rank then writes nothing and raises too, naming every rank that failed."""
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("export_distributed_chrome_trace: torch.distributed is not "
                           "initialised; call it on every rank after init_process_group (for "
                           "one process, use prof.export_chrome_trace(path))")
    rank = dist.get_rank()
    size = dist.get_world_size(group)
    ranks = [dist.get_global_rank(group, k) if group is not None else k for k in range(size)]
    try:
        mine: object = prof.chrome_trace()  # type: ignore[attr-defined]
        for e in mine["traceEvents"]:  # type: ignore[index]
            if e.get("cat") == "collective":
                e["args"] = dict(e.get("args") or {}, rank=rank)
    except Exception as exc:                     # still gather: the others are waiting
        mine = {"error": f"{type(exc).__name__}: {exc}"}
    gathered: list[object] | None = [None] * size if rank == ranks[0] else None
    dist.gather_object(mine, gathered, dst=ranks[0], group=group)
    if isinstance(mine, dict) and "error" in mine:
        raise RuntimeError(f"export_distributed_chrome_trace: rank {rank} could not build its "
                           f"trace: {mine['error']}")
    if gathered is None:
        return None
    failed = [f"rank {r}: {t['error']}" for r, t in zip(ranks, gathered)
              if isinstance(t, dict) and "error" in t]
    if failed:
        raise RuntimeError("export_distributed_chrome_trace: nothing written to "
                           f"{path}; traces that could not be built: " + "; ".join(failed))
    merged = merge_chrome_traces(gathered, labels=[f"rank {r}" for r in ranks])  # type: ignore[arg-type]
    with open(path, "w") as f:
        json.dump(merged, f)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m neuron_compiler.trace_merge TRACE... -o OUT [--labels A,B,...]``; exit 0 when
    written, 2 on a usage error (bad arguments, an input that is not a readable trace)."""
    parser = argparse.ArgumentParser(
        prog="python -m neuron_compiler.trace_merge",
        description="Merge per-rank Chrome traces (prof.export_chrome_trace on each rank) into "
                    "one Perfetto trace: a process per rank and partition.")
    parser.add_argument("traces", nargs="+", help="trace files, rank 0 first")
    parser.add_argument("-o", "--output", required=True, help="the merged trace file to write")
    parser.add_argument("--labels", help="comma-separated names of the inputs (default: "
                                         "'rank 0', 'rank 1', ... in input order)")
    args = parser.parse_args(argv)
    labels = args.labels.split(",") if args.labels is not None else None
    try:
        merged = merge_chrome_traces(args.traces, labels=labels)
    except ValueError as e:
        parser.error(str(e))
    with open(args.output, "w") as f:
        json.dump(merged, f)
    processes = sum(1 for e in merged["traceEvents"] if _is_meta(e, "process_name"))
    print(f"wrote {args.output}: {len(args.traces)} ranks, {processes} processes, "
          f"{len(merged['traceEvents'])} events")
    return 0


if __name__ == "__main__":
    sys.exit(main())
