"""Test helper: copy a GGUF with keys or tensors dropped, added or changed (to make bad files on purpose)."""
import numpy as np
from gguf import GGUFWriter
from gguf.constants import GGMLQuantizationType, GGUFValueType

from refengine.gguf import LazyArray, open_gguf


def rewrite(src, dst, *, drop_keys=(), set_keys=None, drop_tensors=(), tensor_fn=None, add_tensors=None):
    """set_keys: {key: (value, GGUFValueType)} or, for an array, {key: (list, GGUFValueType.ARRAY, element type)}; tensor_fn(name, raw uint8 array) -> new raw (same size) or None;
    add_tensors: {name: float32 array}."""
    gf = open_gguf(src)
    w = GGUFWriter(str(dst), gf.get("general.architecture"))
    w.kv_data[0].pop("general.architecture", None)
    for k, v in gf.kv.items():
        if k in drop_keys or k.startswith("GGUF.") or k == "general.alignment":
            continue
        vt = gf.kv_types[k]
        if isinstance(v, LazyArray):
            w.add_key_value(k, list(v.value), vt, sub_type=v.elem_type)
        else:
            w.add_key_value(k, v, vt)
    for k, (v, vt, *sub) in (set_keys or {}).items():
        w.add_key_value(k, v, vt, sub_type=sub[0] if sub else None)
    for name, ti in gf.tensors.items():
        if name in drop_tensors:
            continue
        raw = np.array(gf.tensor(name).raw)                                 # [..., row_bytes] uint8
        if tensor_fn is not None:
            new = tensor_fn(name, raw)
            raw = raw if new is None else new.reshape(raw.shape)
        w.add_tensor(name, raw, raw_shape=list(raw.shape),   # byte shape: [..., row_bytes]
                     raw_dtype=GGMLQuantizationType(int(ti.type)))
    for name, arr in (add_tensors or {}).items():
        w.add_tensor(name, np.asarray(arr, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


__all__ = ["rewrite", "GGUFValueType"]
