"""One Perfetto trace of all ranks (``neuron_compiler.trace_merge``).

In-process: two hand-made traces whose pids collide are merged (pids apart, names prefixed with
the rank, every event kept), bad inputs raise naming the input, the CLI. Two gloo ranks (one
spawn, module fixture): a tensor-parallel MLP with a functional all_reduce runs on each rank, and
``export_distributed_chrome_trace`` / ``export_chrome_trace(path, all_ranks=True)`` write one
file on rank 0 holding both ranks' engine tracks and collectives. ``_check_merged`` is the
checker of that file; it is shown to fail on a trace of one rank.
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
import torch

from neuron_compiler.profile import Profile
from neuron_compiler.trace_merge import export_distributed_chrome_trace, main, merge_chrome_traces
from ranks import run_ranks

WORLD = 2
D_IN, HIDDEN, ROWS = 64, 128, 8


# ---- in-process merging --------------------------------------------------------------------
def _trace(tag: str) -> dict:
    """A small trace as Profile.chrome_trace writes it: a partition (pid 1: two engine tracks)
    and the collectives (pid 2)."""
    return {"displayTimeUnit": "ns", "otherData": {"target": "trn2", "tag": tag},
            "traceEvents": [
                {"name": "process_name", "ph": "M", "pid": 1, "tid": 0,
                 "args": {"name": f"inference_{tag}/partition_0 (trn2)"}},
                {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1,
                 "args": {"name": "pe (TensorE)"}},
                {"name": "thread_name", "ph": "M", "pid": 1, "tid": 2,
                 "args": {"name": "dma0 (DMA queue 0)"}},
                {"name": "matmul", "cat": "pe", "ph": "X", "pid": 1, "tid": 1, "ts": 0.5,
                 "dur": 1.25, "args": {"dst": f"psum_{tag}"}},
                {"name": "dma_copy", "cat": "dma0", "ph": "X", "pid": 1, "tid": 2, "ts": 0.0,
                 "dur": 0.5, "args": {"src": "x"}},
                {"name": "process_name", "ph": "M", "pid": 2,
                 "args": {"name": "collectives (modelled: runtime_sim.collectives)"}},
                {"name": "thread_name", "ph": "M", "pid": 2, "tid": 0,
                 "args": {"name": "cc (CC-Core)"}},
                {"name": "all_reduce (mesh)", "cat": "collective", "ph": "X", "pid": 2, "tid": 0,
                 "ts": 0.0, "dur": 3.0, "args": {"kind": "all_reduce", "bytes": 2048}}]}


def _names(trace: dict) -> dict[int, str]:
    return {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
            if e["ph"] == "M" and e["name"] == "process_name"}


def _sort_index(trace: dict) -> dict[int, int]:
    return {e["pid"]: e["args"]["sort_index"] for e in trace["traceEvents"]
            if e["ph"] == "M" and e["name"] == "process_sort_index"}


def test_merge_renumbers_pids_and_prefixes_process_names():
    a, b = _trace("a"), _trace("b")
    before = copy.deepcopy([a, b])
    merged = merge_chrome_traces([a, b])
    assert [a, b] == before                                     # inputs untouched
    assert _names(merged) == {1: "rank 0 / inference_a/partition_0 (trn2)",
                              2: "rank 0 / collectives (modelled: runtime_sim.collectives)",
                              3: "rank 1 / inference_b/partition_0 (trn2)",
                              4: "rank 1 / collectives (modelled: runtime_sim.collectives)"}
    assert _sort_index(merged) == {1: 1, 2: 2, 3: 3, 4: 4}      # rank 0's processes first
    # every input event once, only pid (and the collective's rank) changed; plus one sort index
    # per process
    added = [e for e in merged["traceEvents"] if e["name"] == "process_sort_index"]
    kept = [e for e in merged["traceEvents"] if e["name"] != "process_sort_index"]
    assert len(added) == 4 and len(kept) == len(a["traceEvents"]) + len(b["traceEvents"])
    shift = {(0, 1): 1, (0, 2): 2, (1, 1): 3, (1, 2): 4}
    want = []
    for rank, t in enumerate((a, b)):
        for e in t["traceEvents"]:
            e = dict(e, pid=shift[rank, e["pid"]])
            if e["name"] == "process_name":
                e["args"] = {"name": f"rank {rank} / {e['args']['name']}"}
            if e.get("cat") == "collective":
                e["args"] = dict(e["args"], rank=rank)
            want.append(e)
    assert kept == want
    assert merged["displayTimeUnit"] == "ns"
    assert merged["otherData"] == {"ranks": "rank 0, rank 1", "rank 0/target": "trn2",
                                   "rank 0/tag": "a", "rank 1/target": "trn2", "rank 1/tag": "b"}


def test_merge_names_every_process_and_keeps_odd_pids():
    bare = [{"name": "x", "ph": "X", "pid": 7, "tid": 1, "ts": 0, "dur": 1},
            {"name": "y", "ph": "X", "pid": 3, "tid": 1, "ts": 0, "dur": 1},
            {"name": "z", "ph": "i", "ts": 2, "s": "g"}]            # no pid
    strings = {"traceEvents": [{"name": "w", "ph": "X", "pid": "host", "tid": 1, "ts": 0,
                                "dur": 1},
                               {"name": "process_sort_index", "ph": "M", "pid": "host",
                                "args": {"sort_index": -5}}]}
    merged = merge_chrome_traces([bare, strings], labels=["left", "right"])
    # the Array Format input: pids 3 then 7 (ascending), then the pid-less event's own process
    assert _names(merged) == {1: "left / pid 3", 2: "left / pid 7", 3: "left / pid -",
                              4: "right / pid host"}
    assert _sort_index(merged) == {1: 1, 2: 2, 3: 3, 4: 4}     # the input's -5 replaced
    by_name = {e["name"]: e for e in merged["traceEvents"] if e["ph"] != "M"}
    assert {n: e["pid"] for n, e in by_name.items()} == {"x": 2, "y": 1, "z": 3, "w": 4}
    assert by_name["z"] == {"name": "z", "ph": "i", "ts": 2, "s": "g", "pid": 3}


def test_merge_rejects_what_is_not_a_trace(tmp_path):
    good = _trace("a")
    with pytest.raises(ValueError, match=r"trace 1: expected a Chrome trace with a "
                                         r"'traceEvents' list, got nothing"):
        merge_chrome_traces([good, {"events": []}])
    with pytest.raises(ValueError, match=r"trace 0: .*got dict under 'traceEvents'"):
        merge_chrome_traces([{"traceEvents": {}}])
    with pytest.raises(ValueError, match=r"trace 0: traceEvents\[1\] is int"):
        merge_chrome_traces([{"traceEvents": [{"ph": "X"}, 3]}])
    with pytest.raises(ValueError, match="trace 0: expected a Chrome trace object"):
        merge_chrome_traces([42])                            # type: ignore[list-item]
    no_events = tmp_path / "rank1.json"
    no_events.write_text(json.dumps({"displayTimeUnit": "ns"}))
    with pytest.raises(ValueError, match=f"{no_events}: expected a Chrome trace with"):
        merge_chrome_traces([good, str(no_events)])
    broken = tmp_path / "broken.json"
    broken.write_text('{"traceEvents": [')
    with pytest.raises(ValueError, match=f"{broken}: not JSON"):
        merge_chrome_traces([broken])
    with pytest.raises(ValueError, match=f"{tmp_path / 'missing.json'}: cannot read"):
        merge_chrome_traces([str(tmp_path / "missing.json")])
    with pytest.raises(ValueError, match=r"one label per trace \(2\), got 1"):
        merge_chrome_traces([good, good], labels=["only"])
    with pytest.raises(ValueError, match="at least one trace"):
        merge_chrome_traces([])


def test_cli_merges_files_and_exits_2_on_usage_errors(tmp_path, capsys):
    paths = []
    for tag in ("a", "b"):
        paths.append(str(tmp_path / f"rank_{tag}.json"))
        with open(paths[-1], "w") as f:
            json.dump(_trace(tag), f)
    out = tmp_path / "all.json"
    assert main([*paths, "-o", str(out)]) == 0
    assert json.loads(out.read_text()) == merge_chrome_traces(paths)
    assert f"wrote {out}: 2 ranks, 4 processes, 20 events" in capsys.readouterr().out
    assert main([*paths, "-o", str(out), "--labels", "tp0,tp1"]) == 0
    assert set(_names(json.loads(out.read_text())).values()) >= {
        "tp0 / inference_a/partition_0 (trn2)", "tp1 / inference_b/partition_0 (trn2)"}
    for argv, message in (([paths[0]], "required: -o/--output"),
                          ([paths[0], str(tmp_path / "none.json"), "-o", str(out)],
                           "none.json: cannot read"),
                          ([*paths, "-o", str(out), "--labels", "one"], "one label per trace")):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2 and message in capsys.readouterr().err
    # the module entry point, as users run it (no runpy warning on stderr)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    run = subprocess.run([sys.executable, "-m", "neuron_compiler.trace_merge", *paths, "-o",
                          str(tmp_path / "cli.json")], capture_output=True, text=True, env=env,
                         timeout=120)
    assert (run.returncode, run.stderr) == (0, ""), run.stderr
    assert json.loads((tmp_path / "cli.json").read_text()) == merge_chrome_traces(paths)


def test_profile_trace_export_and_distributed_export_outside_a_group(tmp_path):
    import torch.distributed as dist
    assert not dist.is_initialized()
    prof = Profile()
    path = tmp_path / "one.json"
    assert prof.export_chrome_trace(str(path)) is None
    assert json.loads(path.read_text()) == prof.chrome_trace() == {"traceEvents": [],
                                                                   "displayTimeUnit": "ns"}
    for call in (lambda: export_distributed_chrome_trace(prof, str(tmp_path / "all.json")),
                 lambda: prof.export_chrome_trace(str(tmp_path / "all.json"), all_ranks=True)):
        with pytest.raises(RuntimeError, match="torch.distributed is not initialised"):
            call()
    assert not (tmp_path / "all.json").exists()


# ---- two gloo ranks -------------------------------------------------------------------------
def _tp_mlp_traces(rank: int) -> dict:
    """The tensor-parallel MLP of test_collectives_tp.py (smaller), one profiled call; then this
    rank's own trace, and the merged trace twice (function, method) under per-rank paths."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    import neuron_compiler
    torch.manual_seed(0)
    up, down = torch.nn.Linear(D_IN, HIDDEN), torch.nn.Linear(HIDDEN, D_IN)
    half = HIDDEN // WORLD
    args = [t.detach() for t in (torch.randn(ROWS, D_IN), up.weight[rank * half:(rank + 1) * half],
                                 up.bias[rank * half:(rank + 1) * half],
                                 down.weight[:, rank * half:(rank + 1) * half], down.bias)]

    def mlp(x, w_up, b_up, w_down, b_down):
        h = torch.relu(torch.nn.functional.linear(x, w_up, b_up))
        return funcol.all_reduce(torch.nn.functional.linear(h, w_down), "sum",
                                 dist.group.WORLD) + b_down

    with neuron_compiler.profile() as prof:
        torch.compile(mlp, backend="neuron", options={"fallback": "error"})(*args)
    out = os.environ["NEURON_TEST_OUT"]
    prof.export_chrome_trace(os.path.join(out, f"own{rank}.json"))
    by_function = export_distributed_chrome_trace(prof, os.path.join(out, f"merged{rank}.json"))
    by_method = prof.export_chrome_trace(os.path.join(out, f"method{rank}.json"), all_ranks=True)
    return {"by_function": by_function, "by_method": by_method}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> tuple[list[dict], str]:
    out = tmp_path_factory.mktemp("trace_ranks")
    return run_ranks(_tp_mlp_traces, out, WORLD), str(out)


def _check_merged(trace: dict, world: int) -> None:
    """What Perfetto needs to show every rank: a traceEvents list of events with ph / pid (and
    ts, and dur >= 0 for complete events), one name and one sort index per process, rank r's
    processes sorted before rank r+1's; each of the ``world`` ranks with a partition process
    holding engine tracks and a collectives process holding its own collective events."""
    events = trace["traceEvents"]
    assert isinstance(events, list) and events
    for e in events:
        assert isinstance(e["ph"], str) and isinstance(e["pid"], int), e
        if e["ph"] != "M":
            assert isinstance(e["ts"], (int, float)) and isinstance(e["tid"], int), e
        if e["ph"] == "X":
            assert e["dur"] >= 0, e
    names, sort = _names(trace), _sort_index(trace)
    pids = {e["pid"] for e in events}
    assert len(names) == len(sort) == len(pids) and set(names) == set(sort) == pids
    rank_of = {pid: int(n.split(" / ")[0].removeprefix("rank ")) for pid, n in names.items()}
    order = sorted(pids, key=lambda p: sort[p])
    assert [rank_of[p] for p in order] == sorted(rank_of[p] for p in order)
    threads = {(e["pid"], e["args"]["name"]) for e in events
               if e["ph"] == "M" and e["name"] == "thread_name"}
    for track in ("pe (TensorE)", "act (ScalarE)", "dma0 (DMA queue 0)"):
        with_track = {rank_of[p] for p, t in threads if t == track}
        assert with_track == set(range(world)), (track, with_track)
    colls = {p for p, n in names.items() if n.split(" / ", 1)[1].startswith("collectives")}
    assert {rank_of[p] for p in colls} == set(range(world)), names
    for p in colls:
        mine = [e for e in events if e["pid"] == p and e["ph"] == "X"]
        assert mine and all(e["cat"] == "collective" and e["args"]["rank"] == rank_of[p]
                            and e["args"]["kind"] == "all_reduce" and e["dur"] > 0
                            for e in mine), mine


def test_rank0_writes_one_trace_of_both_ranks(ranks):
    results, out = ranks
    merged_file = os.path.join(out, "merged0.json")
    assert [r["by_function"] for r in results] == [merged_file, None]
    assert [r["by_method"] for r in results] == [os.path.join(out, "method0.json"), None]
    assert not os.path.exists(os.path.join(out, "merged1.json"))     # rank 1 wrote nothing
    assert not os.path.exists(os.path.join(out, "method1.json"))
    with open(merged_file) as f:
        merged = json.load(f)                                        # valid JSON
    _check_merged(merged, WORLD)
    with open(os.path.join(out, "method0.json")) as f:
        assert json.load(f) == merged
    # the same as merging the files each rank wrote alone: every event of both ranks
    own = [os.path.join(out, f"own{r}.json") for r in range(WORLD)]
    assert merge_chrome_traces(own) == merged
    counts = [sum(e["ph"] == "X" for e in json.load(open(p))["traceEvents"]) for p in own]
    assert sum(e["ph"] == "X" for e in merged["traceEvents"]) == sum(counts) and min(counts) > 0


def test_the_checker_fails_on_one_rank(ranks):
    _, out = ranks
    one = merge_chrome_traces([os.path.join(out, "own0.json")])
    _check_merged(one, 1)
    with pytest.raises(AssertionError):
        _check_merged(one, WORLD)
    # two copies of rank 0 (labelled 0 and 1) pass the track checks but not the collectives'
    # rank, which each rank stamps on its own events
    twice = merge_chrome_traces([_rank0_as(out, 1), _rank0_as(out, 0)])
    with pytest.raises(AssertionError):
        _check_merged(twice, WORLD)


def _rank0_as(out: str, rank: int) -> dict:
    """Rank 0's own trace with its collectives stamped as recorded by ``rank``."""
    with open(os.path.join(out, "own0.json")) as f:
        trace = json.load(f)
    for e in trace["traceEvents"]:
        if e.get("cat") == "collective":
            e["args"]["rank"] = rank
    return trace
