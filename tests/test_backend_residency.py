"""Whole graphs stay on the device: resident parameters, device->device tensors in HBM, host
copies only where the host reads, warm-up vs steady state in the profile.

Every expected byte count is computed here from the tensors themselves: the bytes of exactly the
tensors that must cross the host link, and nothing else.
"""
from __future__ import annotations

import pytest
import torch

import neuron_compiler
from neuron_compiler.testing import assert_ran_on_device, compile_for_neuron, run_on_device
from runtime_sim.costs import host_transfer_ns
from runtime_sim.targets import get_target


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def nbytes(*ts: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 8)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def _x(seed: int, rows: int = 16) -> torch.Tensor:
    return torch.randn(rows, 32, generator=torch.Generator().manual_seed(seed))


def test_parameters_are_sent_on_the_first_call_only():
    m = MLP()
    f = compile_for_neuron(m)
    params = nbytes(*m.parameters())
    x1, x2 = _x(1), _x(2)
    with torch.no_grad():
        y1, p1 = run_on_device(f, x1)
        y2, p2 = run_on_device(f, x2)
        y3, p3 = run_on_device(f, x2)              # the very same input again
        torch.testing.assert_close(y2, m(x2), rtol=1e-4, atol=1e-4)
    d1, d2, d3 = (assert_ran_on_device(p) for p in (p1, p2, p3))
    assert len(d1["partitions"]) == 1
    assert d1["transfer_bytes"] == params + nbytes(x1, y1)
    assert d1["transfers"] == 4 + 2                  # 4 parameters, x in, y out
    assert d2["transfer_bytes"] == nbytes(x2, y2) and d2["transfers"] == 2
    assert d3["transfer_bytes"] == nbytes(y3) and d3["transfers"] == 1
    tgt = get_target("trn2")
    assert d2["transfer_time_us"] == pytest.approx(
        host_transfer_ns(nbytes(x2, y2), tgt, transfers=2) / 1e3)
    # the partition row carries its own copies (inputs it read, outputs the host read)
    assert d2["partitions"][0]["transfer_bytes"] == d2["transfer_bytes"]
    # first call = warm-up, later calls = steady state
    assert d1["warmup"]["graph_calls"] == 1 and d1["steady_state"]["graph_calls"] == 0
    assert d1["warmup"]["transfer_bytes"] == d1["transfer_bytes"]
    assert d1["warmup"]["compile_time_s"] > 0.0
    assert d2["warmup"]["graph_calls"] == 0 and d2["steady_state"]["graph_calls"] == 1
    assert d2["steady_state"]["transfer_bytes"] == d2["transfer_bytes"]
    assert d2["steady_state"]["simulated_time_us"] == pytest.approx(d2["simulated_time_us"])


def test_one_profile_over_several_calls_separates_warmup_from_steady_state():
    m = MLP()
    f = compile_for_neuron(m, options={"sim_mode": "timing"})
    xs = [_x(i) for i in range(4)]
    with torch.no_grad(), neuron_compiler.profile() as prof:
        ys = [f(x) for x in xs]
    d = assert_ran_on_device(prof)
    warm, steady = d["warmup"], d["steady_state"]
    per_call = nbytes(xs[1], ys[1])
    assert warm["graph_calls"] == 1 and steady["graph_calls"] == 3
    assert warm["transfer_bytes"] == nbytes(*m.parameters()) + per_call
    assert steady["transfer_bytes"] == per_call                      # per call
    assert d["transfer_bytes"] == warm["transfer_bytes"] + 3 * per_call
    assert steady["simulated_time_us"] == pytest.approx(warm["simulated_time_us"])
    assert d["simulated_time_us"] == pytest.approx(4 * steady["simulated_time_us"])
    assert steady["compile_time_s"] == 0.0 and warm["compile_time_s"] > 0.0
    assert d["graphs"][0]["warmup_calls"] == 1 and d["graphs"][0]["steady_calls"] == 3
    text = prof.summary()
    assert "warm-up" in text and "steady state, per call" in text


def test_an_in_place_update_sends_that_tensor_again():
    m = MLP()
    f = compile_for_neuron(m)
    x = _x(3)
    with torch.no_grad():
        f(x)
        with torch.no_grad():
            m.fc1.weight.mul_(0.5)                  # _version changes: new host data
        y, prof = run_on_device(f, x)
        torch.testing.assert_close(y, m(x), rtol=1e-4, atol=1e-4)
    d = assert_ran_on_device(prof)
    assert d["transfer_bytes"] == nbytes(m.fc1.weight, y)   # x and the rest stayed resident


@pytest.fixture
def reject(monkeypatch):
    """Make the lowering registry reject the ATen ops whose names are given."""
    api = pytest.importorskip("lowering.api")
    real = api.why_unsupported
    rejected: set[str] = set()

    def why_unsupported(node):
        if str(node.target) in rejected:
            return f"{node.target}: rejected by the test"
        return real(node)

    monkeypatch.setattr(api, "why_unsupported", why_unsupported)
    return rejected


def test_a_tensor_between_two_device_partitions_stays_in_hbm(reject):
    reject.add("aten.cumsum.default")

    def fn(x, w):
        a = torch.relu(x @ w)          # partition 1
        b = torch.cumsum(a, 0)         # eager fallback: reads a on the host
        return b * 2.0 + a             # partition 2 reads b (host) and a (still on the device)

    f = compile_for_neuron(fn)
    w = torch.randn(16, 16)
    with torch.no_grad():
        f(torch.randn(8, 16), w)
        x = torch.randn(8, 16)
        out, prof = run_on_device(f, x, w)
        torch.testing.assert_close(out, fn(x, w), rtol=1e-4, atol=1e-4)
    d = assert_ran_on_device(prof, min_device_fraction=0.75)
    assert len(d["partitions"]) == 2
    a = torch.relu(x @ w)
    # x in; a out once (for the cumsum); b in; the result out. a is not sent back in.
    assert d["transfer_bytes"] == nbytes(x, a, torch.cumsum(a, 0), out)
    assert d["transfers"] == 4
    first, second = sorted(d["partitions"], key=lambda p: "aten.mm.default" not in p["ops"])
    assert first["transfer_bytes"] == nbytes(x, a)        # its input, its output the host read
    assert second["transfer_bytes"] == nbytes(a, out)     # b in (same size as a), the result out


def test_a_view_falling_back_reads_no_data(reject):
    reject.update({"aten.t.default", "aten.permute.default", "aten.transpose.int"})

    def fn(x, w, w2):
        a = torch.relu(x @ w)
        return a.t() @ w2               # the transpose falls back; it only changes metadata

    f = compile_for_neuron(fn)
    x, w, w2 = torch.randn(8, 16), torch.randn(16, 16), torch.randn(8, 4)
    with torch.no_grad():
        f(x, w, w2)
        out, prof = run_on_device(f, x, w, w2)
        torch.testing.assert_close(out, fn(x, w, w2), rtol=1e-4, atol=1e-4)
    d = assert_ran_on_device(prof, min_device_fraction=0.5)
    assert any(fb["op"] in reject for fb in d["fallbacks"]), d["fallbacks"]
    assert len(d["partitions"]) == 2
    assert d["transfer_bytes"] == nbytes(out)       # inputs resident, a.t() never left HBM


def _train_step(f, m, x):
    y = f(x)
    y.sum().backward()
    return y


def test_training_saved_activations_stay_on_the_device():
    m = MLP()
    f = compile_for_neuron(m)
    params = list(m.parameters())
    x = _x(4)
    _train_step(f, m, x)
    with neuron_compiler.profile() as prof:
        y = _train_step(f, m, _x(5))
    d = assert_ran_on_device(prof)
    kinds = sorted(g["kind"] for g in d["graphs"])
    assert kinds == ["backward", "forward"]
    # forward: x in, y out; backward: the tangent (shaped like y) in, one gradient per
    # parameter out. The activations saved for the backward never cross the host link.
    assert d["transfer_bytes"] == nbytes(x, y, y) + nbytes(*params)
    assert d["steady_state"]["graph_calls"] == 2
    assert d["steady_state"]["transfer_bytes"] == d["transfer_bytes"]
    # an optimizer step updates the parameters in place: the next step sends them again
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    opt.step()
    opt.zero_grad()
    with neuron_compiler.profile() as prof2:
        y = _train_step(f, m, _x(6))
    d2 = assert_ran_on_device(prof2)
    assert d2["transfer_bytes"] == nbytes(*params) + nbytes(x, y, y) + nbytes(*params)
