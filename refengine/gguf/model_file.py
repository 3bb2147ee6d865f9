"""One virtual GGUF over all shards of a split set (`NAME-00001-of-000NN.gguf`).

llama.cpp's `gguf-split` writes `split.no` (u16, 0-based), `split.count` (u16) and
`split.tensors.count` (i32, total over all shards) into every shard; the model metadata lives in the
first shard. `open_gguf` accepts any shard (or a plain single file) and checks that the set is
complete and consistent before anything else is read.
"""
from __future__ import annotations

import os
import re

from quant import QTensor

from ..errors import MalformedGGUFError, MissingKeyError, MissingShardError, MissingTensorError, ShardMismatchError
from .reader import GGUFFile, LazyArray, TensorInfo, read_gguf

SPLIT_RE = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def shard_path(prefix: str, no: int, count: int) -> str:
    """llama.cpp's `llama_split_path`: 0-based `no`."""
    return f"{prefix}-{no + 1:05d}-of-{count:05d}.gguf"


class GGUFModel:
    """All shards of one model as a single file: metadata from shard 1, tensors from wherever they live."""

    def __init__(self, shards: list[GGUFFile]):
        self.shards = shards
        self.path = shards[0].path
        self.kv = shards[0].kv
        self.kv_types = shards[0].kv_types
        self.tensors: dict[str, TensorInfo] = {}
        self._owner: dict[str, GGUFFile] = {}
        for sh in shards:
            for name, ti in sh.tensors.items():
                if name in self.tensors:
                    raise ShardMismatchError(f"tensor {name!r} is in both {self.tensors[name].path} and {sh.path}")
                self.tensors[name] = ti
                self._owner[name] = sh

    # ---- metadata ----
    @property
    def arch(self) -> str:
        return self.require("general.architecture")

    def get(self, key: str, default=None):
        v = self.kv.get(key, default)
        return v.value if isinstance(v, LazyArray) else v

    def require(self, key: str):
        if key not in self.kv:
            raise MissingKeyError(f"{self.path}: required metadata key {key!r} is missing")
        return self.get(key)

    def llamacpp_refusals(self) -> list[str]:
        """What makes llama.cpp's loader refuse (or abort on) a file that refengine reads: keys refengine does not
        need, read by llama.cpp with a fixed GGUF type, and tensor data it cannot map. llama.cpp's words in quotes."""
        out = []
        for i, sh in enumerate(self.shards):
            # llama.cpp reads split.count of the file it opens; split.no and split.tensors.count only in a set
            keys = ["split.count"] if len(self.shards) == 1 else ["split.no"] if i else list(LLAMACPP_SPLIT_TYPES)
            if i == 0 and len(self.shards) > 1 and "split.tensors.count" not in sh.kv:
                out.append(f"{os.path.basename(sh.path)}: \"key not found in model: split.tensors.count\"")
            for key in keys:
                want, t = LLAMACPP_SPLIT_TYPES[key], sh.kv_types.get(key)
                if t is not None and t.name != want:
                    out.append(f"{os.path.basename(sh.path)}: \"key {key} has wrong type {t.name.lower()} but "
                               f"expected type {want.lower()}\"")
            if sh.tensors:
                first = min(ti.offset for ti in sh.tensors.values())
                if first % LLAMACPP_TENSOR_ALIGNMENT:
                    out.append(f"{os.path.basename(sh.path)}: tensor data starts at byte {first}, not a multiple of "
                               f"{LLAMACPP_TENSOR_ALIGNMENT} (general.alignment = {sh.alignment}): llama.cpp aborts "
                               f"mapping it, \"GGML_ASSERT(... && \"buffer pointer must be aligned\") failed\"")
        for key, want in LLAMACPP_KEY_TYPES.items():
            t = self.kv_types.get(key)
            if t is not None and t.name != want:
                out.append(f"\"key {key} has wrong type {t.name.lower()} but expected type {want.lower()}\"")
        tok = self.kv.get("tokenizer.ggml.model")
        if tok is None:
            out.append("\"key not found in model: tokenizer.ggml.model\" (llama.cpp's vocabulary loader)")
        elif self.kv_types["tokenizer.ggml.model"].name != "STRING":
            out.append(f"\"key tokenizer.ggml.model has wrong type {self.kv_types['tokenizer.ggml.model'].name.lower()}"
                       f" but expected type str\"")
        elif tok not in LLAMACPP_TOKENIZERS:
            out.append(f"\"unknown tokenizer: '{tok[:40]}'\"")
        elif tok not in ("none", "no_vocab") and self.kv_types.get("tokenizer.ggml.tokens") is None:
            out.append("\"cannot find tokenizer vocab in model file\" (tokenizer.ggml.tokens)")
        elif tok in ("none", "no_vocab") and f"{self.kv.get('general.architecture')}.vocab_size" not in self.kv:
            out.append(f"tokenizer.ggml.model = {tok!r} and no {{arch}}.vocab_size: llama.cpp's vocabulary has 0 "
                       f"tokens, \"check_tensor_dims: tensor 'token_embd.weight' has wrong shape\"")
        return out

    # ---- tensors ----
    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def tensor(self, name: str) -> QTensor:
        if name not in self.tensors:
            raise MissingTensorError(f"{self.path}: tensor {name!r} is not in the file")
        return self._owner[name].tensor(name)

    def advise_random(self, name: str) -> None:
        """Tensor `name` is read at scattered rows: no read-ahead around each (GGUFFile.advise_random)."""
        self._owner[name].advise_random(name)

    @property
    def nbytes(self) -> int:
        return sum(sh.size for sh in self.shards)

    def __repr__(self) -> str:
        return f"<GGUFModel {self.path!r}: {len(self.shards)} shard(s), {len(self.tensors)} tensors>"


# What llama.cpp demands of parts of a file refengine does not need (see GGUFModel.llamacpp_refusals).
LLAMACPP_SPLIT_TYPES = {"split.no": "UINT16", "split.count": "UINT16", "split.tensors.count": "INT32"}
LLAMACPP_KEY_TYPES = {"general.name": "STRING", "tokenizer.ggml.pre": "STRING",    # read for every arch
                      "tokenizer.ggml.token_type_count": "UINT32"}
LLAMACPP_TENSOR_ALIGNMENT = 32        # ggml-backend.cpp: CPU buffers from a pointer (the mmap) must be aligned
LLAMACPP_TOKENIZERS = ("none", "no_vocab", "llama", "bert", "gpt2", "hybriddna", "whitespace", "t5", "rwkv", "test",
                       "plamo2", "gemma4")          # llama_vocab::impl::load (src/llama-vocab.cpp:1949-2151)

# The split keys gguf-split writes, the integer range each must be in (llama.cpp reads them as u16, u16, i32).
SPLIT_KEYS = {"split.no": (0, 65534), "split.count": (0, 65535), "split.tensors.count": (0, 2**31 - 1)}


def split_key(gf: GGUFFile, key: str):
    """A split key of one shard, typed: an integer in range, or None when absent."""
    if key not in gf.kv:
        return None
    v, t = gf.kv[key], gf.kv_types[key].name
    lo, hi = SPLIT_KEYS[key]
    if t not in ("UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "UINT64", "INT64") or not lo <= v <= hi:
        shown = repr(v) if isinstance(v, (int, float, str)) else repr(v)[:60]
        raise MalformedGGUFError(f"{gf.path}: metadata key {key!r} must be an integer in {lo}..{hi}, but is {t} {shown}")
    return int(v)


def open_gguf(path: str | os.PathLike) -> GGUFModel:
    """Open a GGUF file or a whole split set given any of its shards."""
    path = os.fspath(path)
    if not os.path.exists(path):
        m = SPLIT_RE.match(path)
        if m:
            raise MissingShardError(f"{path}: shard {int(m['no'])} of {int(m['count'])} is missing")
        raise MalformedGGUFError(f"{path}: no such file")
    first = read_gguf(path)
    count = split_key(first, "split.count") or 0
    if not count or count == 1 and "split.no" not in first.kv:
        return GGUFModel([first])

    m = SPLIT_RE.match(path)
    if not m:
        raise ShardMismatchError(
            f"{path}: has split.count = {count} but its name does not follow NAME-0000N-of-{count:05d}.gguf, "
            f"so the other shards cannot be found")
    prefix = m["prefix"]
    if int(m["count"]) != count:
        raise ShardMismatchError(f"{path}: file name says {int(m['count'])} shards, split.count says {count}")
    paths = [shard_path(prefix, i, count) for i in range(count)]
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        raise MissingShardError(f"{path}: split set of {count} shards is incomplete; missing: {', '.join(missing)}")
    shards = [first if p == path else read_gguf(p) for p in paths]
    for i, sh in enumerate(shards):
        no, cnt = split_key(sh, "split.no"), split_key(sh, "split.count")
        if no != i or cnt != count:
            raise ShardMismatchError(f"{sh.path}: split.no = {no}, split.count = {cnt}; expected {i} and {count}")
    model = GGUFModel(shards)
    want = split_key(shards[0], "split.tensors.count")
    if want is not None and want != len(model.tensors):
        raise ShardMismatchError(
            f"{shards[0].path}: split.tensors.count = {want} but the {count} shards hold {len(model.tensors)} tensors")
    return model
