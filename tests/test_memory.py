"""Memory accounting, and what checkpointing and offloading save: measured with
ca.memory.profile() and cross-checked with tracemalloc (bytes, never times)."""
import pytest

import compiled_autograd as ca
from compiled_autograd.autograd.graph import save_on_disk
from compiled_autograd.utils.checkpoint import checkpoint

F = ca.nn.functional
WIDTH = BATCH = 256
ACT = WIDTH * BATCH * 4  # bytes of one float32 activation


@pytest.fixture(scope="module")
def blocks():
    ca.manual_seed(0)
    return [(ca.nn.Linear(WIDTH, WIDTH), ca.nn.LayerNorm(WIDTH)) for _ in range(16)]


def _block(h, lin, ln):
    return F.gelu(ln(lin(h)))


def _profile(blocks, mode):
    x = ca.randn(BATCH, WIDTH)
    with ca.memory.profile() as prof:
        h = x
        for lin, ln in blocks:
            h = checkpoint(_block, h, lin, ln) if mode == "checkpoint" else _block(h, lin, ln)
        h.sum().backward()
    for lin, ln in blocks:
        for p in list(lin.parameters()) + list(ln.parameters()):
            p.grad = None
    return prof


def test_accounting_basics():
    a = ca.randn(100, requires_grad=True)
    with ca.memory.profile() as prof:
        b = a.exp()            # 400 bytes, an activation, saved by exp
        c = (b * 2).sum()
        c.backward()
    allocs = [e for e in prof.timeline if e.action == "alloc"]
    assert any(e.name == "exp" and e.bytes == 400 and e.category == "activation" for e in allocs)
    assert any(e.action == "retag" and e.category == "saved" for e in prof.timeline)
    assert any(e.category == "gradient" and e.name.startswith("MulBackward") for e in allocs)
    steps = [e.step for e in prof.timeline]
    assert steps == sorted(steps)
    assert prof.live_bytes == 400 + 400 + 4  # b, a.grad, and c are still referenced


def test_checkpoint_per_block_halves_the_peak_or_better(blocks):
    plain = _profile(blocks, "plain")
    ckpt = _profile(blocks, "checkpoint")
    assert plain.peak_bytes >= 2 * ckpt.peak_bytes, (plain.peak_bytes, ckpt.peak_bytes)
    # tracemalloc sees numpy's buffers: it sees at least what the accounting
    # counts (plus kernel temporaries and Python objects), and the same saving.
    for prof in (plain, ckpt):
        assert prof.tracemalloc_peak_bytes >= prof.peak_bytes
    assert plain.tracemalloc_peak_bytes >= 1.9 * ckpt.tracemalloc_peak_bytes
    assert ckpt.max_by_category["recomputed"] > 0
    assert plain.max_by_category["recomputed"] == 0


def test_offload_keeps_saved_activations_out_of_ram(blocks, tmp_path):
    x = ca.randn(BATCH, WIDTH)
    with ca.memory.profile() as plain:
        h = x
        for lin, ln in blocks:
            h = _block(h, lin, ln)
        saved_plain = plain.live_bytes
    with ca.memory.profile() as prof:
        with save_on_disk(str(tmp_path)):
            h = x
            for lin, ln in blocks:
                h = _block(h, lin, ln)
        saved_in_ram = prof.max_by_category["saved"]
        live_after_forward = prof.live_bytes
        h.sum().backward()
    assert saved_plain > 16 * 2 * ACT              # several activations saved per block
    assert saved_in_ram == 0
    assert live_after_forward <= 2 * ACT           # the output (and little else)
    assert prof.max_by_category["reloaded"] > 0
    for lin, ln in blocks:
        for p in list(lin.parameters()) + list(ln.parameters()):
            p.grad = None


def _segment_peak(n_segments, blocks_per_segment):
    ca.manual_seed(1)
    layers = [(ca.nn.Linear(64, 64), ca.nn.LayerNorm(64))
              for _ in range(n_segments * blocks_per_segment)]
    x = ca.randn(128, 64)

    def segment(h, start):
        for lin, ln in layers[start:start + blocks_per_segment]:
            h = _block(h, lin, ln)
        return h

    with ca.memory.profile() as prof:
        h = x
        for s in range(n_segments):
            h = checkpoint(segment, h, s * blocks_per_segment)
        h.sum().backward()
    kept_inputs = n_segments * 128 * 64 * 4  # each checkpoint keeps its input
    return prof.peak_bytes - kept_inputs


def test_segment_peak_grows_with_segment_size_not_count():
    by_count = [_segment_peak(n, 2) for n in (2, 4, 8)]
    by_size = [_segment_peak(4, k) for k in (1, 2, 4)]
    # Beyond the kept inputs, the peak does not grow with the number of segments...
    assert max(by_count) - min(by_count) <= 0.1 * min(by_count), by_count
    # ...and grows with the segment size.
    assert by_size[0] < by_size[1] < by_size[2], by_size
    assert by_size[2] >= 2.5 * by_size[0], by_size
