"""The NaN/inf flags of a resident forward's products written in batches (`Runtime._write_flag`: on a GPU a queue,
`fused.FLAG_BATCH` arrays a launch of `fused.all_finite_many`), checked without a GPU: the sim device is given a
stand-in for the fused module whose `all_finite_many` computes the flags with NumPy. A queued array is checked when
its batch is written, not when its product ran: the tests show that nothing writes into a product's output in
between (every arch), that the flags land in their own cells (a poisoned weight still named, over several pages and
batch sizes) and that the logits do not change. The kernel itself: tests/test_fused.py."""
import numpy as np
import pytest

from gguf_edit import rewrite
from refengine import Model
from refengine.errors import NonFiniteError
from refengine.runtime import Runtime

ARCHS = ["llama", "qwen3moe", "deepseek2", "deepseek32", "glm-dsa", "qwen3next", "kimi-linear", "kimi-k3",
         "deepseek4", "qwen4exp", "glm5-next"]


class FlagStandIn:
    """Device.fused with only the flag batch: `write` True computes each flag into its cell (the kernel's work),
    False declines every array (the runtime's NumPy flag then). Each array is compared with the copy `queued` took
    of it when its product queued it."""

    def __init__(self, batch=8, write=True):
        self.FLAG_BATCH, self.write = batch, write
        self.launches, self.flags, self.copies, self.changed = 0, 0, {}, []
        self.batch_bytes = []

    def queued(self, a):
        self.copies.setdefault(id(a), []).append((a, a.raw.copy()))    # (one input feeds several products)

    def all_finite_many(self, ys, page, cells):
        assert 0 < len(ys) <= self.FLAG_BATCH and len(cells) == len(ys)
        self.launches += 1
        self.batch_bytes.append([y.raw.nbytes for y in ys])
        self.flags += len(ys)
        flat = page.reshape(-1)
        for y, c in zip(ys, cells):
            held, copy = self.copies[id(y)].pop(0)
            if not self.copies[id(y)]:
                del self.copies[id(y)]
            assert held is y
            if not np.array_equal(y.raw, copy, equal_nan=True):
                self.changed.append(y.shape)
            if self.write:
                flat[c] = bool(np.isfinite(y.raw).all())
        return [self.write] * len(ys)


def _with_stand_in(monkeypatch, rt, stand):
    rt.device.fused = stand
    orig = Runtime._write_flag

    def write_flag(self, row, col, a):
        if self.device is rt.device:                      # (rt or its untraced() copies, which share the queue)
            stand.queued(a)
        return orig(self, row, col, a)
    monkeypatch.setattr(Runtime, "_write_flag", write_flag)


@pytest.mark.parametrize("fixed", [True, False])
@pytest.mark.parametrize("arch", ARCHS)
def test_batched_flags_see_each_product_as_it_was(synth_model, monkeypatch, arch, fixed):
    """A prompt and two decode steps (fixed shapes, as a captured step runs them, and the eager forward's own):
    every queued output equals, when its batch is written, what its product wrote; every flag is written by the end
    of each forward; the logits equal a run with a flag written at each product bit for bit."""
    m = Model(synth_model(arch, wtype="Q8_0"))
    plain, batched = Runtime(resident=True, fixed_shapes=fixed), Runtime(resident=True, fixed_shapes=fixed)
    stand = FlagStandIn(batch=8, write=False)
    _with_stand_in(monkeypatch, batched, stand)
    st_p, st_b = m.new_state(), m.new_state()
    for toks in ([3, 9, 27, 81, 5], [7], [11]):
        a, b = m.forward(toks, st_p, rt=plain), m.forward(toks, st_b, rt=batched)
        assert np.array_equal(a, b)
        assert not batched._flag_queue and not stand.copies
    assert stand.flags > 0 and stand.changed == []
    assert stand.launches <= -(-stand.flags // 8) + 3 * 2         # full batches, a part batch at each forward's end


def _poisoned(base, tmp_path, tensor):
    def fn(name, raw):
        if name == tensor:
            a = raw.reshape(-1).view(np.float32).copy()
            a[1000] = np.inf
            return a.view(np.uint8)
    return rewrite(base, tmp_path / "n.gguf", tensor_fn=fn)


@pytest.fixture(scope="module")
def llama_f32(tmp_path_factory):
    from refengine.synth import write_synth
    return write_synth("llama", tmp_path_factory.mktemp("fb") / "base.gguf", seed=1)


@pytest.mark.parametrize("tensor", ["blk.0.attn_k.weight", "blk.1.ffn_down.weight", "blk.1.attn_output.weight"])
@pytest.mark.parametrize("batch,page_rows", [(8, 512), (3, 4), (1, 2)])
def test_batched_flags_name_the_weight(llama_f32, tmp_path, monkeypatch, tensor, batch, page_rows):
    """A weight with an inf makes NaN/inf from a finite input: with the flags written in batches of `batch`, over
    pages of `page_rows` rows, the error names that weight (a flag in another cell would name another, or none)."""
    f = _poisoned(llama_f32, tmp_path, tensor)
    rt = Runtime(resident=True)
    rt.PAGE_ROWS = page_rows
    stand = FlagStandIn(batch=batch, write=True)
    _with_stand_in(monkeypatch, rt, stand)
    with pytest.raises(NonFiniteError, match=tensor.replace(".", r"\.")):
        Model(f).forward([1, 2], rt=rt)
    assert stand.launches > 0 and stand.changed == []


def test_batched_flags_clean_forward_passes(llama_f32, monkeypatch):
    """The same stand-in writing the flags, no poison: the forward passes and equals the unbatched one."""
    rt = Runtime(resident=True)
    stand = FlagStandIn(batch=8, write=True)
    _with_stand_in(monkeypatch, rt, stand)
    m = Model(llama_f32)
    assert np.array_equal(m.forward([1, 2, 3], rt=rt), m.forward([1, 2, 3], rt=Runtime(resident=True)))
    assert stand.flags > 8 and stand.launches == -(-stand.flags // 8)


@pytest.mark.parametrize("bound", [1, 6000])
def test_flag_queue_bytes_bound(llama_f32, monkeypatch, bound):
    """The queue holds at most Runtime.FLAG_QUEUE_BYTES (a long prefill's products are large): a batch is written
    as soon as its arrays reach the bound, before FLAG_BATCH of them; the flags and the logits stay as they are.
    bound 1: an array a launch; 6000: batches of several small arrays, none past the bound before its last."""
    rt = Runtime(resident=True)
    rt.FLAG_QUEUE_BYTES = bound
    stand = FlagStandIn(batch=16, write=True)
    _with_stand_in(monkeypatch, rt, stand)
    m = Model(llama_f32)
    assert np.array_equal(m.forward([1, 2, 3], rt=rt), m.forward([1, 2, 3], rt=Runtime(resident=True)))
    assert stand.changed == [] and stand.flags > 16
    for sizes in stand.batch_bytes:
        assert sum(sizes[:-1]) < bound                  # the batch was written when its last array reached the bound
    if bound == 1:
        assert stand.launches == stand.flags
    else:
        assert stand.launches < stand.flags and max(map(len, stand.batch_bytes)) > 1
        assert any(sum(b) >= bound for b in stand.batch_bytes[:-1])   # written by the bound, not the count
