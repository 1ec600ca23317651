"""``neuron_compiler.profile()``: what ran where, and how long it took (simulated or measured).

Usage::

    with neuron_compiler.profile() as prof:
        y = compiled_model(x)
    print(prof.summary()); json.dump(prof.to_dict(), f); prof.export_chrome_trace("t.json")

Invariants
- Module state: the stack of open profiles and the graph call being executed, each in one
  ``ContextVar``. Profiles nest: every record goes to every open profile, so an outer profile
  sees everything an inner one sees.
- Compile-time facts (node counts, the fallback table) live on the compiled graph
  (``GraphRecord``) and are added to each open profile whenever that graph is *called*,
  de-duplicated per compiled graph. So a profile opened after compilation still sees the node
  counts and fallbacks of every graph that runs inside it; a graph that is compiled but never
  called inside the block is not counted.
- ``device_nodes`` / ``fallback_nodes`` count ATen compute nodes (see ``partition.py``) of the
  distinct graphs that ran; a device partition whose lowering raised ``Unsupported`` at its
  first call moves its nodes from device to fallback (once per partition).
- Times: ``simulated_time_us`` is the sum over device-partition calls of the simulated program
  time; ``transfer_time_us`` the sum of the host<->device copies the runtime charged (see
  ``runtime.py``: only where host data enters the device or a host consumer reads device data;
  resident tensors cost nothing); ``call_overhead_time_us`` the runtime's per-call launch
  overhead, charged once per device-partition call; ``fallback_time_us`` the measured host wall
  time of eager fallback ops; ``collective_time_us`` the modelled time of the collectives
  (``neuron_compiler.collectives``: values from torch.distributed, time from
  ``runtime_sim.collectives``), listed per op in ``collectives``. The five are disjoint; none
  includes compile time.
- ``assumptions`` lists, per distinct compiled-graph setting that ran, the host-link bandwidth
  and the per-call overhead in force, each with its source (``neuron_compiler.assumptions``:
  ``"option"`` or the default's reason); ``summary()`` prints them.
- Warm-up vs steady state: the first call of a compiled graph in the process is its warm-up
  (its programs are compiled, its parameters sent); every later call is steady state. Every
  record is filed under the phase of the graph call during which it happened (a collective
  issued between graph calls, by a DDP / FSDP2 comm hook, under that of the last graph call:
  the step it belongs to). ``warmup`` sums
  the warm-up calls made inside the profile; ``steady_state`` is per call: for each graph its
  steady-state totals divided by its steady-state calls, summed over graphs (one call of every
  graph: one inference, or one forward + backward step).
- ``compiles`` counts partition specialisations prepared inside the profile (a new input
  signature of a partition), ``program_cache`` splits them into process-wide program-cache
  hits (an identical partition was already lowered) and misses (not in memory: lowered now, or
  read from disk, counted again as ``disk_hits``). ``cache`` counts
  the on-disk compile cache (``cache_dir``), asked only after a program-cache miss: hits
  (read from disk) and misses (lowered, then stored; a corrupt entry is a miss). Without a
  ``cache_dir`` both stay 0.
- Copies the user asks for between the host and the ``neuron`` device (``.to("neuron")``,
  ``.cpu()``, ``.item()``, printing; see ``neuron_compiler.device``) are counted apart in
  ``user_copies`` (``to_device`` / ``to_host``: count, bytes, time) and are part of
  ``transfer_time_us``; a compiled call over device tensors charges none.
- A partition compiled for LNC > 1 (option ``lnc``, ``lowering.lnc``) is timed as its logical
  core (the last physical core's completion; busy fractions the mean over the cores); its row in
  ``partitions`` also has ``lnc``, ``lnc_note`` and ``cores`` (per physical core), the summary a
  table per physical core, and its trace process a track per physical core and queue.
- ``to_dict()`` is JSON-ready: only str/int/float/bool/None/list/dict.
"""
from __future__ import annotations

import contextlib
import contextvars
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from runtime_sim.stats import SimResult, SimStats


@dataclass(frozen=True)
class FallbackEntry:
    """``count`` ATen compute nodes of op ``op`` run in eager PyTorch, for ``reason``."""

    op: str
    count: int
    reason: str


@dataclass(eq=False)
class GraphRecord:
    """Compile-time facts about one compiled ATen graph (forward, backward or inference)."""

    name: str                     # "<kind>_<hash of the graph code>", for display
    kind: str                     # "forward" | "backward" | "inference"
    target: str
    device_nodes: int
    fallback_nodes: int
    fallbacks: tuple[FallbackEntry, ...]
    partitions: tuple[str, ...]   # device partition submodule names
    dump_dir: str | None = None
    calls_started: int = 0        # calls of this graph in the process (the first is warm-up)
    assumptions: object | None = None   # neuron_compiler.assumptions.HostAssumptions
    lnc: int | None = None        # the compile's option lnc: its collectives place ranks by it


@dataclass(frozen=True)
class PartitionFailure:
    """A device partition whose lowering raised ``Unsupported`` for some input signature: all
    its compute nodes run in eager PyTorch, each with the reason in ``entries``."""

    graph: GraphRecord
    partition: str
    entries: tuple[FallbackEntry, ...]

    @property
    def nodes(self) -> int:
        return sum(e.count for e in self.entries)


@dataclass
class _PartitionStats:
    graph: GraphRecord
    partition: str
    input_shapes: list[list[int]]
    ops: list[str]
    compiled: object                  # lowering CompiledGraph (re-run in timing mode for traces)
    stats: SimStats
    calls: int = 0
    transfer_ns: float = 0.0          # total over calls: inputs sent in, outputs read by the host
    transfer_bytes: int = 0
    transfers: int = 0                # tensors copied
    overhead_ns: float = 0.0          # runtime launch overhead, total over calls
    # LNC > 1 (lowering.lnc): each physical core's statistics, and why it runs on one core
    cores: list[SimStats] = field(default_factory=list)

    def total_ns(self) -> float:
        return self.stats.total_ns * self.calls


_PHASE_KEYS = ("simulated_ns", "transfer_ns", "transfer_bytes", "transfers", "fallback_ns",
               "compile_s", "overhead_ns", "collective_ns")


@dataclass
class _CollectiveStats:
    """The calls of one collective op of one compiled graph with one size and group."""

    graph: GraphRecord
    op: str
    cost: object                      # runtime_sim.collectives.CollectiveCost (the same per call)
    calls: int = 0
    host_ns: int = 0                  # measured wall time of torch.distributed's calls

    def to_dict(self, graph_name: str) -> dict:
        c = self.cost
        return {"name": f"{graph_name}/{self.op}", "graph": graph_name, "op": self.op,
                "kind": c.kind, "target": c.target, "ranks": c.ranks,  # type: ignore[attr-defined]
                "lnc": c.placement.lnc, "chips": c.placement.chips,  # type: ignore[attr-defined]
                "instances": c.placement.instances,  # type: ignore[attr-defined]
                "bytes": int(c.nbytes), "algorithm": c.algorithm,  # type: ignore[attr-defined]
                "bound": c.bound, "calls": self.calls,  # type: ignore[attr-defined]
                "time_per_call_us": c.total_ns / 1e3,  # type: ignore[attr-defined]
                "latency_per_call_us": c.latency_ns / 1e3,  # type: ignore[attr-defined]
                "transfer_per_call_us": c.transfer_ns / 1e3,  # type: ignore[attr-defined]
                "time_us": c.total_ns * self.calls / 1e3,  # type: ignore[attr-defined]
                "host_time_us": self.host_ns / 1e3}


@dataclass
class Profile:
    """Everything recorded while this profile was open. Build reports with ``summary()``,
    ``to_dict()``, ``chrome_trace()`` and ``export_chrome_trace(path)``."""

    _graphs: dict[int, GraphRecord] = field(default_factory=dict)
    _graph_calls: Counter = field(default_factory=Counter)
    _failures: dict[tuple[int, str], PartitionFailure] = field(default_factory=dict)
    _parts: dict[tuple[int, str, tuple], _PartitionStats] = field(default_factory=dict)
    _fallback_ns: Counter = field(default_factory=Counter)  # (graph id, op, reason) -> ns
    _loose_transfer: Counter = field(default_factory=Counter)  # producer not seen in the profile
    _phase: dict[tuple[int, str], Counter] = field(default_factory=dict)  # (graph id, phase)
    _user_copies: dict[str, Counter] = field(default_factory=dict)  # direction -> count, bytes, ns
    _collectives: dict[tuple, _CollectiveStats] = field(default_factory=dict)
    _last_call: tuple[GraphRecord, bool] | None = None   # the last graph call and its phase
    compiles: int = 0
    compile_time_s: float = 0.0
    cache_hits: int = 0
    cache_misses: int = 0
    disk_hits: int = 0
    disk_misses: int = 0

    # ---- recording (called by the runtime) ---------------------------------------------------
    def _bump(self, _between: bool = False, **values: float) -> None:
        """Add ``values`` to the phase counters of the graph call being executed (if any);
        with ``_between``, outside a call to those of the last graph call (a step's collective
        that a DDP / FSDP2 hook issues between compiled graph calls belongs to that step)."""
        call = _CALL.get() or (self._last_call if _between else None)
        if call is None:
            return
        graph, first = call
        c = self._phase.setdefault((id(graph), "warmup" if first else "steady"), Counter())
        c.update(values)

    def note_graph_call(self, graph: GraphRecord, first: bool = False) -> None:
        self._last_call = (graph, first)
        self._graphs[id(graph)] = graph
        self._graph_calls[id(graph)] += 1
        c = self._phase.setdefault((id(graph), "warmup" if first else "steady"), Counter())
        c["calls"] += 1

    def note_compile(self, seconds: float, cache_hit: bool = False,
                     disk_hit: bool | None = None) -> None:
        """One partition specialisation prepared: from the program cache (``cache_hit``), or
        the on-disk cache was asked (``disk_hit`` True/False; None: it was not)."""
        self.compiles += 1
        self.compile_time_s += seconds
        if cache_hit:
            self.cache_hits += 1
        else:
            self.cache_misses += 1
        if disk_hit is not None:
            if disk_hit:
                self.disk_hits += 1
            else:
                self.disk_misses += 1
        self._bump(compile_s=seconds)

    def note_failure(self, failure: PartitionFailure) -> None:
        self._failures.setdefault((id(failure.graph), failure.partition), failure)

    def note_fallback_time(self, graph: GraphRecord, op: str, reason: str, ns: int) -> None:
        self._fallback_ns[(id(graph), op, reason)] += ns
        self._bump(fallback_ns=ns)

    def note_partition_call(self, graph: GraphRecord, partition: str, signature: tuple,
                            input_shapes: list[list[int]], compiled: object,
                            result: SimResult, transfer_ns: float = 0.0,
                            transfer_bytes: int = 0, transfers: int = 0,
                            overhead_ns: float = 0.0) -> None:
        """One call of a device partition; ``transfer_*``: the inputs sent to the device;
        ``overhead_ns``: the runtime's launch overhead of the call."""
        key = (id(graph), partition, signature)
        rec = self._parts.get(key)
        if rec is None:
            rec = _PartitionStats(graph, partition, input_shapes,
                                  list(getattr(compiled, "ops", ())), compiled, result.stats,
                                  cores=[c.stats for c in getattr(result, "cores", ())])
            self._parts[key] = rec
        rec.calls += 1
        rec.transfer_ns += transfer_ns
        rec.transfer_bytes += transfer_bytes
        rec.transfers += transfers
        rec.overhead_ns += overhead_ns
        self._bump(simulated_ns=result.stats.total_ns, transfer_ns=transfer_ns,
                   transfer_bytes=transfer_bytes, transfers=transfers, overhead_ns=overhead_ns)

    def note_transfer_out(self, producer: tuple | None, ns: float, nbytes: int,
                          transfers: int = 1) -> None:
        """Device data read by the host; ``producer`` = (GraphRecord, partition, signature)."""
        rec = (self._parts.get((id(producer[0]), producer[1], producer[2]))
               if producer is not None else None)
        if rec is not None:
            rec.transfer_ns += ns
            rec.transfer_bytes += nbytes
            rec.transfers += transfers
        else:
            self._loose_transfer.update(ns=ns, bytes=nbytes, transfers=transfers)
        self._bump(transfer_ns=ns, transfer_bytes=nbytes, transfers=transfers)

    def note_collective(self, graph: GraphRecord, op: str, cost: object, host_ns: int) -> None:
        """One collective call: its modelled ``cost`` (``runtime_sim.collectives``) and the
        wall time torch.distributed took (``host_ns``, for reference only)."""
        key = (id(graph), op, cost.kind, cost.nbytes, cost.ranks)  # type: ignore[attr-defined]
        rec = self._collectives.setdefault(key, _CollectiveStats(graph, op, cost))
        rec.calls += 1
        rec.host_ns += host_ns
        self._graphs.setdefault(id(graph), graph)
        self._bump(_between=True, collective_ns=cost.total_ns)  # type: ignore[attr-defined]

    def note_user_copy(self, direction: str, nbytes: int, ns: float) -> None:
        """The user copied one tensor between the host and the ``neuron`` device
        (``direction``: ``"to_device"`` or ``"to_host"``), ``nbytes`` in ``ns`` on the link."""
        c = self._user_copies.setdefault(direction, Counter())
        c.update(count=1, bytes=nbytes, ns=ns)
        self._bump(transfer_ns=ns, transfer_bytes=nbytes, transfers=1)

    def _user_copies_dict(self) -> dict:
        return {d: {"count": int(c["count"]), "bytes": int(c["bytes"]),
                    "time_us": c["ns"] / 1e3}
                for d in ("to_device", "to_host")
                for c in (self._user_copies.get(d, Counter()),)}

    # ---- reports -----------------------------------------------------------------------------
    def _graph_names(self) -> dict[int, str]:
        seen: Counter = Counter()
        names: dict[int, str] = {}
        for gid, g in self._graphs.items():
            seen[g.name] += 1
            names[gid] = g.name if seen[g.name] == 1 else f"{g.name}#{seen[g.name]}"
        return names

    def _fallback_rows(self) -> list[dict]:
        rows: dict[tuple[str, str], dict] = {}

        def add(gid: int, op: str, count: int, reason: str) -> None:
            row = rows.setdefault((op, reason), {"op": op, "count": 0, "reason": reason,
                                                 "time_us": 0.0})
            row["count"] += count
            row["time_us"] += self._fallback_ns.get((gid, op, reason), 0) / 1e3

        for gid, g in self._graphs.items():
            for e in g.fallbacks:
                add(gid, e.op, e.count, e.reason)
        for (gid, _), f in self._failures.items():
            for e in f.entries:
                add(gid, e.op, e.count, e.reason)
        return sorted(rows.values(), key=lambda r: (-r["count"], r["op"]))

    def to_dict(self) -> dict:
        names = self._graph_names()
        failed_nodes = sum(f.nodes for f in self._failures.values())
        device_nodes = sum(g.device_nodes for g in self._graphs.values()) - failed_nodes
        fallback_nodes = sum(g.fallback_nodes for g in self._graphs.values()) + failed_nodes
        parts = []
        for rec in self._parts.values():
            s = rec.stats
            parts.append({
                "name": f"{names.get(id(rec.graph), rec.graph.name)}/{rec.partition}",
                "graph": names.get(id(rec.graph), rec.graph.name),
                "partition": rec.partition,
                "input_shapes": rec.input_shapes,
                "ops": rec.ops,
                "calls": rec.calls,
                "simulated_time_us": rec.total_ns() / 1e3,
                "simulated_time_per_call_us": s.total_ns / 1e3,
                "roofline_time_us": s.roofline_ns * rec.calls / 1e3,
                "roofline_time_per_call_us": s.roofline_ns / 1e3,
                "transfer_time_us": rec.transfer_ns / 1e3,
                "transfer_bytes": int(rec.transfer_bytes),
                "transfers": int(rec.transfers),
                "call_overhead_time_us": rec.overhead_ns / 1e3,
                "instructions": int(s.instructions),
                "flops": int(s.flops),
                "hbm_bytes": int(s.hbm_bytes),
                "compulsory_hbm_bytes": int(s.min_hbm_bytes),
                "traffic_ratio": s.traffic_ratio(),
                "roofline_bound": s.roofline_bound(),
                "dma_bytes": int(s.dma_bytes),
                "spill_bytes": int(s.spill_bytes),
                "sbuf_peak_bytes": int(s.sbuf_peak_bytes),
                "psum_peak_bytes": int(s.psum_peak_bytes),
                "engine_busy": {k: float(v) for k, v in sorted(s.busy_fraction().items())},
                **_lnc_dict(rec),
            })
        targets = sorted({g.target for g in self._graphs.values()})
        fallback_ns = sum(self._fallback_ns.values())
        user = self._user_copies_dict()
        colls = [c.to_dict(names.get(id(c.graph), c.graph.name))
                 for c in self._collectives.values()]
        return {
            "target": ", ".join(targets) if targets else None,
            "simulated_time_us": sum(p["simulated_time_us"] for p in parts),
            "roofline_time_us": sum(p["roofline_time_us"] for p in parts),
            "fallback_time_us": fallback_ns / 1e3,
            "transfer_time_us": (sum(p["transfer_time_us"] for p in parts)
                                 + self._loose_transfer["ns"] / 1e3
                                 + sum(u["time_us"] for u in user.values())),
            "transfer_bytes": int(sum(p["transfer_bytes"] for p in parts)
                                  + self._loose_transfer["bytes"]
                                  + sum(u["bytes"] for u in user.values())),
            "transfers": int(sum(p["transfers"] for p in parts)
                             + self._loose_transfer["transfers"]
                             + sum(u["count"] for u in user.values())),
            "user_copies": user,
            "call_overhead_time_us": sum(p["call_overhead_time_us"] for p in parts),
            "collective_time_us": sum(c["time_us"] for c in colls),
            "collectives": colls,
            "assumptions": self._assumptions(),
            "warmup": self._phase_dict("warmup"),
            "steady_state": self._phase_dict("steady"),
            "device_nodes": device_nodes,
            "fallback_nodes": fallback_nodes,
            "device_fraction": (device_nodes / (device_nodes + fallback_nodes)
                                if device_nodes + fallback_nodes else None),
            "compiles": self.compiles,
            "compile_time_s": self.compile_time_s,
            "program_cache": {"hits": self.cache_hits, "misses": self.cache_misses,
                              "disk_hits": self.disk_hits},
            "cache": {"hits": self.disk_hits, "misses": self.disk_misses},
            "graphs": [{"name": names[gid], "kind": g.kind, "target": g.target,
                        "calls": self._graph_calls[gid],
                        "warmup_calls": int(self._phase.get((gid, "warmup"), {}).get("calls", 0)),
                        "steady_calls": int(self._phase.get((gid, "steady"), {}).get("calls", 0)),
                        "device_nodes": g.device_nodes,
                        "fallback_nodes": g.fallback_nodes, "partitions": list(g.partitions),
                        "dump_dir": g.dump_dir}
                       for gid, g in self._graphs.items()],
            "fallbacks": self._fallback_rows(),
            "partitions": parts,
        }

    def _assumptions(self) -> list[dict]:
        """The distinct host assumptions of the graphs that ran (module docstring)."""
        from neuron_compiler.assumptions import assumptions_of
        out: list[dict] = []
        for g in self._graphs.values():
            d = assumptions_of(g).to_dict()
            if d not in out:
                out.append(d)
        return out

    def _phase_dict(self, phase: str) -> dict:
        """``warmup``: totals over the warm-up calls; ``steady``: per call (module docstring)."""
        out = dict.fromkeys(_PHASE_KEYS, 0.0)
        calls = 0
        for (gid, ph), c in self._phase.items():
            if ph != phase or not c.get("calls"):
                continue
            calls += int(c["calls"])
            div = 1 if phase == "warmup" else c["calls"]
            for k in _PHASE_KEYS:
                out[k] += c.get(k, 0) / div
        return {
            "graph_calls": calls,
            "simulated_time_us": out["simulated_ns"] / 1e3,
            "transfer_time_us": out["transfer_ns"] / 1e3,
            "transfer_bytes": int(round(out["transfer_bytes"])),
            "transfers": int(round(out["transfers"])),
            "call_overhead_time_us": out["overhead_ns"] / 1e3,
            "fallback_time_us": out["fallback_ns"] / 1e3,
            "collective_time_us": out["collective_ns"] / 1e3,
            "compile_time_s": out["compile_s"],
        }

    def summary(self) -> str:
        d = self.to_dict()
        user = d["user_copies"]
        total = d["device_nodes"] + d["fallback_nodes"]
        lines = [
            f"neuron profile  target: {d['target'] or '-'}",
            f"  simulated device time : {d['simulated_time_us']:12.2f} us"
            f"   (roofline {d['roofline_time_us']:.2f} us)",
            f"  host<->device transfer: {d['transfer_time_us']:12.2f} us   (host link: "
            f"{_link_text(d['assumptions'])}, see Assumptions)",
            *([f"    of which user copies: {sum(u['time_us'] for u in user.values()):10.2f} us   "
               f"({user['to_device']['count']} to the device, {user['to_host']['count']} to "
               f"the host: .to('neuron'), .cpu(), .item(), printing)"]
              if any(u["count"] for u in user.values()) else []),
            f"  runtime call overhead : {d['call_overhead_time_us']:12.2f} us   "
            f"({_overhead_text(d['assumptions'])} per device-partition call)",
            f"  eager fallback (wall) : {d['fallback_time_us']:12.2f} us",
            *([f"  collectives (modelled): {d['collective_time_us']:12.2f} us   "
               f"({sum(c['calls'] for c in d['collectives'])} calls; values from "
               f"torch.distributed)"] if d["collectives"] else []),
            f"  ATen compute nodes    : {d['device_nodes']} on device, {d['fallback_nodes']} "
            f"fallback" + (f" ({100.0 * d['device_nodes'] / total:.1f}% on device)" if total
                           else ""),
            f"  graphs: {len(d['graphs'])}   compiles: {d['compiles']} "
            f"({d['compile_time_s']:.2f} s; program cache {d['program_cache']['hits']} hits, "
            f"{d['program_cache']['misses']} misses, {d['program_cache']['disk_hits']} of "
            f"them read from disk)",
        ]
        if d["cache"]["hits"] or d["cache"]["misses"]:
            lines.append(f"  on-disk compile cache : {d['cache']['hits']} hits, "
                         f"{d['cache']['misses']} misses")
        for label, ph in (("warm-up (first calls)", d["warmup"]),
                          ("steady state, per call", d["steady_state"])):
            if ph["graph_calls"]:
                lines.append(
                    f"  {label:22s}: simulated {ph['simulated_time_us']:.2f} us, transfer "
                    f"{ph['transfer_time_us']:.2f} us ({_bytes(ph['transfer_bytes'])}), call "
                    f"overhead {ph['call_overhead_time_us']:.2f} us, fallback "
                    f"{ph['fallback_time_us']:.2f} us"
                    + (f", collectives {ph['collective_time_us']:.2f} us" if d["collectives"]
                       else "") + f"  [{ph['graph_calls']} graph calls]")
        if d["fallbacks"]:
            lines += ["", "Fallbacks (run in eager PyTorch):"]
            rows = [("op", "count", "time us", "reason")]
            rows += [(f["op"], str(f["count"]), f"{f['time_us']:.1f}", f["reason"])
                     for f in d["fallbacks"]]
            lines += _table(rows, left={0, 3})
        if d["partitions"]:
            lines += ["", "Device partitions (simulated):"]
            engines = sorted({e for p in d["partitions"] for e in p["engine_busy"]})
            rows = [("partition", "calls", "us/call", "roofline", "bound", "traffic/comp",
                     "instrs", "MFLOP", "xfer us") + tuple(f"{e} %" for e in engines)]
            for p in d["partitions"]:
                ratio = p["traffic_ratio"]
                rows.append((p["name"], str(p["calls"]), f"{p['simulated_time_per_call_us']:.2f}",
                             f"{p['roofline_time_per_call_us']:.2f}", p["roofline_bound"],
                             "-" if ratio is None else f"{ratio:.2f}x", str(p["instructions"]),
                             f"{p['flops'] / 1e6:.2f}", f"{p['transfer_time_us']:.2f}")
                            + tuple(f"{100.0 * p['engine_busy'].get(e, 0.0):.0f}"
                                    for e in engines))
            lines += _table(rows, left={0})
        lines += _lnc_lines(d["partitions"])
        if d["collectives"]:
            lines += ["", "Collectives (device operations; time from runtime_sim.collectives):"]
            rows = [("collective", "ranks", "bytes", "algorithm", "bound", "calls", "us/call")]
            rows += [(c["name"], str(c["ranks"]), str(c["bytes"]), c["algorithm"], c["bound"],
                      str(c["calls"]), f"{c['time_per_call_us']:.2f}") for c in d["collectives"]]
            lines += _table(rows, left={0, 3, 4})
        if d["assumptions"]:
            from neuron_compiler.assumptions import describe
            lines += ["", "Assumptions (values in force, and where they come from):"]
            for a in d["assumptions"]:
                lines += [f"  {a['target']}: {line}" for line in describe(a)]
        return "\n".join(lines)

    def chrome_trace(self) -> dict:
        """This process's Chrome trace-event JSON object (``{"traceEvents": [...],
        "displayTimeUnit": "ns"}``): one process per device partition and input signature, one
        track per engine / DMA queue (named as AWS's profiler names them: ``pe (TensorE)``, ...,
        ``dma3 (DMA queue 3)``; with LNC > 1 ``core0/pe (TensorE)``, ..., ``core1/dma3 (DMA
        queue 3)``), times in simulated microseconds from the start of one call of that
        partition (the program's timing does not depend on the data, so every call looks the
        same); then, when collectives ran, one process of the collectives."""
        from runtime_sim.trace import to_chrome_trace
        events: list[dict] = []
        names = self._graph_names()
        for pid, rec in enumerate(self._parts.values(), start=1):
            _, result = rec.compiled.run(None, mode="timing", trace=True)  # type: ignore[attr-defined]
            pname = (f"{names.get(id(rec.graph), rec.graph.name)}/{rec.partition} "
                     f"{rec.input_shapes} x{rec.calls}")
            events += to_chrome_trace(result, process_name=pname, pid=pid,
                                      engine_labels=True)["traceEvents"]
        events += self._collective_trace(pid=len(self._parts) + 1)
        return {"traceEvents": events, "displayTimeUnit": "ns"}

    def export_chrome_trace(self, path: str, all_ranks: bool = False) -> str | None:
        """Write ``chrome_trace()`` to ``path`` (open it in Perfetto / chrome://tracing).

        With ``all_ranks=True``, call it on every rank of an initialised torch.distributed
        process group: rank 0 writes one trace of all ranks, a process per rank and partition
        (``neuron_compiler.trace_merge.export_distributed_chrome_trace``) and gets ``path``
        back; the other ranks write nothing and get None. Without it: this process's trace,
        returning None."""
        if all_ranks:
            from neuron_compiler.trace_merge import export_distributed_chrome_trace
            return export_distributed_chrome_trace(self, path)
        trace = self.chrome_trace()
        with open(path, "w") as f:
            json.dump(trace, f)
        return None

    def _collective_trace(self, pid: int) -> list[dict]:
        """One process of the collectives: one complete event per distinct collective (op,
        size, group), laid end to end, each lasting one call's modelled time."""
        if not self._collectives:
            return []
        events: list[dict] = [
            {"ph": "M", "pid": pid, "name": "process_name",
             "args": {"name": "collectives (modelled: runtime_sim.collectives)"}},
            {"ph": "M", "pid": pid, "tid": 0, "name": "thread_name", "args": {"name": "cc (CC-Core)"}}]
        names = self._graph_names()
        ts = 0.0
        for c in self._collectives.values():
            d = c.to_dict(names.get(id(c.graph), c.graph.name))
            events.append({"ph": "X", "pid": pid, "tid": 0, "ts": ts,
                           "dur": d["time_per_call_us"], "name": f"{d['kind']} ({d['algorithm']})",
                           "cat": "collective", "args": d})
            ts += d["time_per_call_us"]
        return events


def _link_text(assumptions: list[dict]) -> str:
    return ", ".join(f"{a['host_link_gbps']['value']:g} GB/s" for a in assumptions) or "-"


def _overhead_text(assumptions: list[dict]) -> str:
    return ", ".join(f"{a['call_overhead_us']['value']:g} us" for a in assumptions) or "-"


def _bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def _table(rows: list[tuple[str, ...]], left: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for n, r in enumerate(rows):
        cells = [c.ljust(w) if i in left else c.rjust(w)
                 for i, (c, w) in enumerate(zip(r, widths))]
        out.append("  " + "  ".join(cells).rstrip())
        if n == 0:
            out.append("  " + "  ".join("-" * w for w in widths))
    return out


_ACTIVE: contextvars.ContextVar[tuple[Profile, ...]] = contextvars.ContextVar(
    "neuron_compiler_profiles", default=())


# The graph call being executed: (its GraphRecord, whether it is that graph's first call).
_CALL: contextvars.ContextVar[tuple[GraphRecord, bool] | None] = contextvars.ContextVar(
    "neuron_compiler_graph_call", default=None)


def active_profiles() -> tuple[Profile, ...]:
    """The open profiles, outermost first (empty when none is open)."""
    return _ACTIVE.get()


@contextlib.contextmanager
def graph_call(graph: GraphRecord) -> Iterator[bool]:
    """Run one call of compiled graph ``graph``: counts it, tells the open profiles, and files
    every record made inside under its phase. Yields True for the graph's first call."""
    graph.calls_started += 1
    first = graph.calls_started == 1
    for p in _ACTIVE.get():
        p.note_graph_call(graph, first)
    token = _CALL.set((graph, first))
    try:
        yield first
    finally:
        _CALL.reset(token)


@contextlib.contextmanager
def profile() -> Iterator[Profile]:
    """Open a profile for the calls of neuron-compiled code made inside the ``with`` block."""
    prof = Profile()
    token = _ACTIVE.set(_ACTIVE.get() + (prof,))
    try:
        yield prof
    finally:
        _ACTIVE.reset(token)


def _lnc_dict(rec: _PartitionStats) -> dict:
    """A partition compiled for LNC > 1 (``lowering.lnc``): ``lnc``, ``lnc_note`` (why it runs
    on one physical core, or "") and ``cores`` (per physical core: its time, instructions,
    FLOPs, HBM bytes and engine busy fractions). Other partitions: nothing."""
    if not rec.cores:
        return {}
    return {"lnc": int(getattr(rec.compiled, "lnc", len(rec.cores))),
            "lnc_note": str(getattr(rec.compiled, "note", "")),
            "cores": [{"core": k, "simulated_time_per_call_us": c.total_ns / 1e3,
                       "instructions": int(c.instructions), "flops": int(c.flops),
                       "hbm_bytes": int(c.hbm_bytes),
                       "engine_busy": {e: float(v) for e, v in sorted(c.busy_fraction().items())}}
                      for k, c in enumerate(rec.cores)]}


def _lnc_lines(parts: list[dict]) -> list[str]:
    """The summary's per-physical-core table of the LNC > 1 partitions."""
    lnc = [p for p in parts if p.get("cores")]
    if not lnc:
        return []
    engines = sorted({e for p in lnc for c in p["cores"] for e in c["engine_busy"]})
    rows = [("partition", "LNC", "core", "us/call", "instrs", "MFLOP")
            + tuple(f"{e} %" for e in engines)]
    for p in lnc:
        for c in p["cores"]:
            rows.append((p["name"], str(p["lnc"]), str(c["core"]),
                         f"{c['simulated_time_per_call_us']:.2f}", str(c["instructions"]),
                         f"{c['flops'] / 1e6:.2f}")
                        + tuple(f"{100.0 * c['engine_busy'].get(e, 0.0):.0f}" for e in engines))
    notes = [f"  {p['name']}: {p['lnc_note']}" for p in lnc if p["lnc_note"]]
    return ["", "Physical cores of the logical cores (LNC > 1):"] + _table(rows, left={0}) + notes
