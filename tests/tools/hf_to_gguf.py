"""llama.cpp's own converter (convert_hf_to_gguf.py) on a tokenizer-less checkpoint directory.

    PYTHONPATH=$LLAMA/gguf-py:$LLAMA python tests/tools/hf_to_gguf.py MODEL_DIR --outfile OUT.gguf --outtype f32

Everything is the vendored converter's, unchanged, except the vocabulary: a tiny random model has no
tokenizer, so the model class chosen by the converter writes `tokenizer.ggml.model = "none"` and
`{arch}.vocab_size` (what llama.cpp needs to load it, like refengine's synthetic files) in place of its own
`set_vocab`.

One more departure, for a converter bug: with transformers >= 5.23 installed the converter reads the config
through `AutoConfig`, whose `Qwen4ExpTextConfig` renames the checkpoint's `full_attention` layers to
`indexed_attention`; `conversion/qwen4exp.py` then finds no `full_attention` layer and writes
`qwen4exp.attention.compress_ratios` all 0, so llama.cpp runs those layers dense (QSA off). The checkpoint's own
`layer_types` (from its config.json) are put back before the converter reads them.

Used by tests/test_transformers_oracle.py; LLAMA is the llama.cpp tree
(`refengine.oracle.transformers.llamacpp_source()`).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import conversion
import convert_hf_to_gguf as cv
from conversion.base import ModelBase


def _no_vocab(self) -> None:
    self.gguf_writer.add_tokenizer_model("none")
    self.gguf_writer.add_vocab_size(int(self.find_hparam(["vocab_size"])))


def _load_hparams(dir_model, is_mistral_format):
    """transformers' config, with the checkpoint's own `layer_types` (see the module docstring)."""
    hparams = _load_hparams_orig(dir_model, is_mistral_format)
    raw = json.loads((Path(dir_model) / "config.json").read_text())
    raw = raw.get("text_config", raw)
    target = hparams.get("text_config", hparams)
    if "layer_types" in raw and "layer_types" in target:
        target["layer_types"] = raw["layer_types"]
    return hparams


def _get_model_class(name, mmproj=False):
    cls = _get_model_class_orig(name, mmproj=mmproj)
    if mmproj:
        return cls
    return type(cls.__name__, (cls,), {"set_vocab": _no_vocab, "model_arch": cls.model_arch})


_get_model_class_orig = conversion.get_model_class
cv.get_model_class = _get_model_class
_load_hparams_orig = ModelBase.load_hparams
ModelBase.load_hparams = staticmethod(_load_hparams)

if __name__ == "__main__":
    sys.exit(cv.main())                                  # the converter's own command line
