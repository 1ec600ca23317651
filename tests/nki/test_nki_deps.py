"""The tracer's access records (neuron_compiler/nki/deps.py): the waits an access gets, and
records that do not grow when a kernel re-reads the same tiles."""
import numpy as np

from neuron_compiler import nki
import neuron_compiler.nki.language as nl
from neuron_compiler.nki.deps import Records

A = ((0, 128), (0, 512))
B = ((0, 128), (512, 1024))
AB = ((0, 128), (0, 1024))


def _waits(r, box, write):
    got = {}
    r.waits(box, write, lambda s, c: got.__setitem__(s, max(c, got.get(s, 0))))
    return got


def test_read_waits_for_writers_write_for_readers_too():
    r = Records()
    r.add(A, "dve.done", 3, True)
    r.add(A, "act.done", 5, False)
    r.add(B, "pe.done", 7, True)
    assert _waits(r, A, False) == {"dve.done": 3}                    # RAW only
    assert _waits(r, A, True) == {"dve.done": 3, "act.done": 5}      # WAW and WAR
    assert _waits(r, AB, False) == {"dve.done": 3, "pe.done": 7}
    r.add(AB, "pool.done", 9, True)                                  # covers both: drops them
    assert _waits(r, A, True) == {"pool.done": 9}
    assert len(r) == 1


def test_rereads_keep_one_record_per_box_and_queue():
    r = Records()
    r.add(A, "dve.done", 1, True)
    for n in range(2, 10002):
        r.add(A, "act.done", n, False)
    assert len(r) == 1 and len(list(r)) == 2
    assert _waits(r, A, True) == {"dve.done": 1, "act.done": 10001}
    assert _waits(r, A, False) == {"dve.done": 1}


@nki.jit
def _reread(x):
    out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.load(x)
    acc = nl.zeros((128, 512), dtype=nl.float32, buffer=nl.sbuf)
    for i in nl.sequential_range(64):
        acc[...] = nl.add(acc, nl.exp(t))
    nl.store(out, value=acc)
    return out


def test_kernel_rereading_a_tile_has_bounded_records():
    x = np.random.default_rng(0).standard_normal((128, 512), dtype=np.float32) * 0.1
    np.testing.assert_allclose(_reread(x), 64 * np.exp(x), rtol=1e-5)
    # ...and the records of the re-read tile did not grow with the loop
    from neuron_compiler.nki import tracer
    seen = []
    orig = tracer.Tracer.emit

    def emit(self, *a, **kw):
        ins = orig(self, *a, **kw)
        seen.append(max(len(r) for r in self._records.values()))
        return ins
    tracer.Tracer.emit = emit
    try:
        nki.simulate(_reread, x, target="trn3")      # another target: traced, not cached
    finally:
        tracer.Tracer.emit = orig
    assert seen and max(seen) <= 8
