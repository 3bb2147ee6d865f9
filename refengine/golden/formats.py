"""The files a golden directory holds, written and read without any library but NumPy and gguf-py.

    tensors.safetensors   every named intermediate and `logits`      (safetensors, below)
    results.gguf          llama.cpp's `llama-results` file: `tokens` I32 [T], `logits` F32, `path_model`
    logits.kld            llama.cpp's `llama-perplexity --kl-divergence-base` file (log-probabilities)

**safetensors** (the format of Hugging Face weights, read by C++, Rust and Python engines with small
libraries, or by hand): an 8-byte little-endian header length N, N bytes of JSON
`{name: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {str: str}}`
(padded with spaces to a multiple of 8), then the raw little-endian data, offsets relative to its start.
Written here in ~40 lines rather than through the `safetensors` package: no new dependency, and the
writer streams tensor by tensor; tests read the files back with the `safetensors` package itself.

**llama-results** (`tools/results/results.cpp` in the vendored llama.cpp): a GGUF with the string key
`path_model` (compared with `-m` byte for byte by `--check`), the tensor `tokens` (I32, ne = {T}) and the
tensor `logits` (F32, ne = {T, V} as results.cpp declares it, with the bytes laid out as T rows of V
logits: `logits_data[i*n_vocab + j]`). `--check` recomputes the logits and fails when NMSE > 1e-6.

**KL-divergence base** (`tools/perplexity/perplexity.cpp`, `perplexity()` writing and `kl_divergence()`
reading): `"_logits_"`, int32 n_ctx, int32 n_vocab, int32 n_chunk, n_chunk*n_ctx int32 tokens, then per
chunk n_ctx - 1 - n_ctx/2 rows (positions n_ctx/2 .. n_ctx-2) of nv = 2*((n_vocab+1)/2) + 4 uint16:
float32 scale, float32 min_log_prob, then each logit as round((l - min_logit) / scale), with
min_logit = max(min(l), max(l) - 16) and scale = (max(l) - min_logit) / 65535 (`log_softmax`, :79-107).
The tokens are the text's, as tokenized: a chunk's first one is replaced by BOS only while it is evaluated.
The single-prompt golden writes one chunk (n_ctx = the number of tokens); the corpus golden
(`refengine/golden/corpus.py`) K chunks of n_ctx, streamed chunk by chunk through `KldBaseWriter`.
"""
from __future__ import annotations

import json
import os

import numpy as np

from ..errors import RefengineError

ST_DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.int32): "I32", np.dtype(np.float16): "F16",
             np.dtype(np.float64): "F64", np.dtype(np.int64): "I64", np.dtype(np.uint8): "U8"}
ST_NUMPY = {v: k for k, v in ST_DTYPES.items()}


class GoldenFormatError(RefengineError):
    """A golden directory or a dump that cannot be read as written."""


# ---------------------------------------------------------------- safetensors

def write_safetensors(path: str | os.PathLike, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> int:
    """Write `tensors` (in the dict's order) as one safetensors file; returns its size in bytes."""
    header, offset, arrays = {}, 0, []
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        if a.dtype not in ST_DTYPES:
            raise GoldenFormatError(f"tensor {name!r}: dtype {a.dtype} has no safetensors name here")
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
        header[name] = {"dtype": ST_DTYPES[a.dtype], "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
        arrays.append(a)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-(8 + len(blob)) % 8)
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for a in arrays:
            a.tofile(f)
    return 8 + len(blob) + offset


def read_safetensors(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(tensors in file order, metadata). Arrays are read-only views of a memory map."""
    path = os.fspath(path)
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if not 0 < n <= size - 8:
                raise GoldenFormatError(f"{path}: not a safetensors file (header length {n}, file size {size})")
            header = json.loads(f.read(n))
    except (OSError, ValueError) as e:
        raise GoldenFormatError(f"{path}: cannot read as safetensors: {e}") from None
    meta = header.pop("__metadata__", {}) or {}
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n) if size > 8 + n else np.zeros(0, np.uint8)
    out = {}
    for name, h in header.items():
        if h.get("dtype") not in ST_NUMPY:
            raise GoldenFormatError(f"{path}: tensor {name!r} has dtype {h.get('dtype')!r}, not one of {sorted(ST_NUMPY)}")
        b, e = h["data_offsets"]
        dt = ST_NUMPY[h["dtype"]]
        if not 0 <= b <= e <= data.size or (e - b) != dt.itemsize * int(np.prod(h["shape"], dtype=np.int64)):
            raise GoldenFormatError(f"{path}: tensor {name!r}: data_offsets {[b, e]} do not fit its shape {h['shape']}")
        out[name] = data[b:e].view(dt.newbyteorder("<")).reshape(h["shape"])
    return out, meta


# ---------------------------------------------------------------- llama-results

def write_llama_results(path: str | os.PathLike, tokens, logits: np.ndarray, path_model: str) -> None:
    """The GGUF `llama-results -o FILE` writes and `llama-results --check -o FILE` reads."""
    from gguf import GGUFWriter
    from gguf.constants import GGMLQuantizationType
    tokens = np.asarray(tokens, dtype=np.int32).reshape(-1)                   # [T]
    logits = np.ascontiguousarray(logits, dtype=np.float32)                    # [T, V]
    T, V = logits.shape
    w = GGUFWriter(os.fspath(path), arch="")
    w.kv_data[0].pop("general.architecture", None)                           # results.cpp writes no arch
    w.add_string("path_model", path_model)
    w.add_tensor("tokens", tokens, raw_dtype=GGMLQuantizationType.I32)
    # results.cpp: ggml_new_tensor_2d(F32, n_tokens, n_vocab) -> ne = {T, V}; NumPy order of ne is (V, T)
    w.add_tensor("logits", logits, raw_shape=(V, T), raw_dtype=GGMLQuantizationType.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def read_llama_results(path: str | os.PathLike) -> tuple[str, np.ndarray, np.ndarray]:
    """(path_model, tokens [T], logits [T, V]) of a llama-results GGUF."""
    from gguf import GGUFReader
    r = GGUFReader(os.fspath(path))
    pm = r.fields["path_model"]
    path_model = bytes(pm.parts[pm.data[0]]).decode()
    t = {ti.name: ti for ti in r.tensors}
    tokens = np.array(t["tokens"].data, dtype=np.int32).reshape(-1)
    T = tokens.size
    logits = np.array(t["logits"].data, dtype=np.float32).reshape(T, -1)
    return path_model, tokens, logits


# ---------------------------------------------------------------- llama-perplexity KL-divergence base

def kld_rows(logits: np.ndarray) -> np.ndarray:
    """logits [N, V] -> uint16 [N, nv]: perplexity.cpp's `log_softmax` encoding, in its float32 arithmetic."""
    x = np.asarray(logits, dtype=np.float32)
    N, V = x.shape
    nv = 2 * ((V + 1) // 2) + 4
    out = np.zeros((N, nv), dtype=np.uint16)
    for i in range(N):
        l = x[i]
        mx = np.float32(l.max())
        mn = np.float32(max(np.float32(l.min()), np.float32(mx - np.float32(16))))
        sum_exp = float(np.sum(np.exp(l - mx).astype(np.float64)))         # expf summed in double
        log_sum_exp = np.float32(np.log(sum_exp))
        min_log_prob = np.float32(mn - mx - log_sum_exp)
        scale = np.float32((mx - mn) / np.float32(65535.0))
        out[i, :4].view(np.float32)[:] = (scale, min_log_prob)
        if scale != 0:
            inv = np.float32(np.float32(1.0) / scale)
            q = np.rint(inv * (l - mn)).astype(np.int64)                       # nearest_int: round half to even
            out[i, 4:4 + V] = np.where(l > mn, q, 0).astype(np.uint16)
    return out


def kld_scored(n_ctx: int) -> tuple[int, int]:
    """(first, n_rows): the positions a chunk of n_ctx scores, first .. first + n_rows - 1, each predicting the
    token after it: perplexity.cpp's `first = n_ctx/2` and `n_ctx - 1 - first` rows (the model always has at least
    half a window of context)."""
    first = n_ctx // 2
    return first, n_ctx - 1 - first


class KldBaseWriter:
    """Streams a KL-divergence base: the header and every chunk's tokens at once (they precede the rows in the
    file), then each chunk's rows as its logits are computed, so a corpus never holds more than one chunk's logits.

        with KldBaseWriter(path, tokens, n_vocab) as w:      # tokens [n_chunk, n_ctx]
            for c in range(n_chunk):
                w.add_chunk(logits_c)                          # [n_ctx, V]: every position of chunk c
    """

    def __init__(self, path: str | os.PathLike, tokens, n_vocab: int):
        tokens = np.asarray(tokens, dtype=np.int32)
        if tokens.ndim != 2 or tokens.shape[1] < 3:
            raise GoldenFormatError(f"{path}: a KLD base needs tokens [n_chunk, n_ctx] with n_ctx >= 3 (one scored "
                                    f"position), got shape {list(tokens.shape)}")
        self.path, self.n_vocab = os.fspath(path), int(n_vocab)
        self.n_chunk, self.n_ctx = tokens.shape
        self.written = 0
        self.f = open(self.path, "wb")
        self.f.write(b"_logits_")
        np.array([self.n_ctx, self.n_vocab, self.n_chunk], dtype="<i4").tofile(self.f)
        tokens.astype("<i4").tofile(self.f)                                   # [n_chunk * n_ctx]

    def add_chunk(self, logits: np.ndarray) -> None:
        """logits [n_ctx, V] of the next chunk (every position; the scored ones are taken here)."""
        logits = np.asarray(logits, dtype=np.float32)
        if logits.shape != (self.n_ctx, self.n_vocab):
            raise GoldenFormatError(f"{self.path}: chunk {self.written}: logits {list(logits.shape)}, "
                                    f"expected [{self.n_ctx}, {self.n_vocab}]")
        if self.written >= self.n_chunk:
            raise GoldenFormatError(f"{self.path}: more than the {self.n_chunk} chunks of the header")
        first, n = kld_scored(self.n_ctx)
        kld_rows(logits[first:first + n]).astype("<u2").tofile(self.f)       # [n, nv]
        self.written += 1

    def close(self) -> None:
        if self.f.closed:
            return
        self.f.close()
        if self.written != self.n_chunk:                   # a header promising chunks the file lacks: no file
            os.remove(self.path)
            raise GoldenFormatError(f"{self.path}: {self.written} chunks written, the header says {self.n_chunk}")

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:                                              # an interrupted corpus: no half file left behind
            self.f.close()
            os.remove(self.path)
        return False


def write_kld_base(path: str | os.PathLike, tokens, logits: np.ndarray) -> None:
    """One chunk of n_ctx = len(tokens): the file `llama-perplexity --kl-divergence-base FILE --kl-divergence
    -c n_ctx -b n_ctx` reads (it scores positions n_ctx/2 .. n_ctx-2)."""
    tokens = np.asarray(tokens, dtype=np.int32).reshape(1, -1)                # [1, n_ctx]
    logits = np.asarray(logits, dtype=np.float32)                             # [n_ctx, V]
    with KldBaseWriter(path, tokens, logits.shape[1]) as w:
        w.add_chunk(logits)


def read_kld_base(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """(tokens [n_chunk * n_ctx], log-probabilities [n_chunk, n_ctx - 1 - n_ctx/2, V]) of a KLD base file."""
    raw = np.fromfile(path, dtype=np.uint8)
    if raw[:8].tobytes() != b"_logits_" or raw.size < 20:
        raise GoldenFormatError(f"{path}: does not start with '_logits_' and its three int32 sizes")
    n_ctx, V, n_chunk = (int(v) for v in raw[8:20].view("<i4"))
    nv = 2 * ((V + 1) // 2) + 4
    _, n_rows = kld_scored(n_ctx)
    size = 20 + 4 * n_ctx * n_chunk + 2 * n_chunk * n_rows * nv
    if min(n_ctx, V, n_chunk) < 1 or raw.size != size:
        raise GoldenFormatError(f"{path}: {raw.size} bytes, but n_ctx {n_ctx}, n_vocab {V}, n_chunk {n_chunk} "
                                f"make {size}")
    tokens = raw[20:20 + 4 * n_ctx * n_chunk].view("<i4")
    rows = raw[20 + 4 * n_ctx * n_chunk:].view("<u2").reshape(n_chunk, n_rows, nv)
    scale = rows[..., :4].copy().view(np.float32)[..., 0:1]
    min_lp = rows[..., :4].copy().view(np.float32)[..., 1:2]
    return tokens, min_lp + scale * rows[..., 4:4 + V].astype(np.float32)
