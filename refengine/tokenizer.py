"""Text <-> token ids with the GGUF's own vocabulary, through llama.cpp's tokenizer (a vocab-only load)."""
from __future__ import annotations

import ctypes
import os

from .errors import ConfigError, OracleError


class Tokenizer:
    def __init__(self, path: str | os.PathLike, gf=None):
        self.path = os.fspath(path)
        if gf is not None and gf.get("tokenizer.ggml.model") in (None, "none", "no_vocab"):
            raise ConfigError(f"{self.path}: the file has no tokenizer (tokenizer.ggml.model = "
                              f"{gf.get('tokenizer.ggml.model')!r}); pass token ids with --tokens")
        notes = gf.llamacpp_refusals() if hasattr(gf, "llamacpp_refusals") else []
        if notes:                      # llama.cpp's tokenizer would refuse the file, or abort the process on it
            raise ConfigError(f"{self.path}: llama.cpp's tokenizer cannot read this file: {notes[0]}")
        try:
            import llama_cpp as L
        except ImportError:
            raise OracleError("text prompts need llama-cpp-python's tokenizer: pip install 'llama-cpp-python==0.3.36'") from None
        from .oracle.llamacpp import quiet_logs
        quiet_logs(L)
        self.L = L
        mp = L.llama_model_default_params()
        mp.vocab_only = True
        self.model = L.llama_model_load_from_file(self.path.encode(), mp)
        if not self.model:
            raise ConfigError(f"{self.path}: llama.cpp could not load the vocabulary")
        self.vocab = L.llama_model_get_vocab(self.model)

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        n_max = len(data) + 16
        buf = (self.L.llama_token * n_max)()
        n = self.L.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, False)
        if n < 0:
            raise ConfigError(f"{self.path}: tokenizing needs {-n} tokens, more than {n_max}")
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        buf = ctypes.create_string_buffer(256)
        n = self.L.llama_token_to_piece(self.vocab, int(token), buf, len(buf), 0, False)
        return buf.raw[:max(n, 0)]

    def decode(self, tokens) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")

    def add_bos(self) -> bool:
        """Whether the vocabulary adds BOS in front of a text (`llama_vocab_get_add_bos`)."""
        return bool(self.L.llama_vocab_get_add_bos(self.vocab))

    def add_eos(self) -> bool:
        """Whether the vocabulary adds EOS after a text (`llama_vocab_get_add_eos`)."""
        return bool(self.L.llama_vocab_get_add_eos(self.vocab))

    def bos(self) -> int | None:
        t = self.L.llama_vocab_bos(self.vocab)
        return None if t < 0 else int(t)

    def eos(self) -> int | None:
        t = self.L.llama_vocab_eos(self.vocab)
        return None if t < 0 else int(t)

    def __del__(self):
        if getattr(self, "model", None):
            self.L.llama_model_free(self.model)
            self.model = None
