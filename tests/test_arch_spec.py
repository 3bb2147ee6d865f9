"""Every registered arch against the contract `refengine.archs.spec.ArchSpec`; the tools read the spec, not modules."""
import os
import re
import types

import pytest

from refengine import Model
from refengine.archs import ARCHS, ArchSpec, ArchSpecError, spec_of
from refengine.archs.spec import OPTIONAL, REQUIRED, cut_layers
from refengine.synth import resolve_preset
from refengine.synthplan import TensorPlan

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GGUF_TYPES = {"str", "u32", "f32", "bool", "arr_u32", "arr_f32", "arr_bool", "arr_u64"}      # what refengine.synth writes


@pytest.mark.parametrize("arch", list(ARCHS))
def test_registered_arch_fulfils_the_spec(arch):
    s = ARCHS[arch]
    assert isinstance(s, ArchSpec) and s.ARCH == arch
    for name in REQUIRED:
        if name[0].islower():
            assert callable(getattr(s, name)), name
    assert isinstance(s.PRESETS, dict) and "tiny" in s.PRESETS, "a tiny preset: the tests' and conformance's model"
    assert all(isinstance(p, dict) for p in s.PRESETS.values())
    assert isinstance(s.MATMUL_INPUTS, list) and s.MATMUL_INPUTS
    for row in s.MATMUL_INPUTS:
        re.compile(row[0])
        assert all("{il}" in n or not n.startswith("blk.") for n in row[1]), row
    assert isinstance(s.LOCAL_INPUTS, bool)
    assert isinstance(s.ATTN_FORMS, tuple) and all(isinstance(f, str) for f in s.ATTN_FORMS)
    assert callable(s.synth_resolve)


@pytest.mark.parametrize("arch,preset", [(a, p) for a, s in ARCHS.items() for p in s.PRESETS])
def test_every_preset_plans(arch, preset):
    """Each preset resolves and its synth_plan / synth_metadata run (shapes only: nothing is written)."""
    s = ARCHS[arch]
    p = resolve_preset(arch, preset)
    plan = s.synth_plan(p)
    assert plan and all(isinstance(t, TensorPlan) for t in plan)
    names = [t.name for t in plan]
    assert len(set(names)) == len(names), "a tensor planned twice"
    assert "token_embd.weight" in names
    rows = s.synth_metadata(p, name=f"{arch}-{preset}")
    assert all(len(r) == 3 and isinstance(r[0], str) for r in rows)
    assert all(k.startswith((f"{arch}.", "general.", "tokenizer.")) for k, _, _ in rows), [k for k, _, _ in rows]
    assert {t for _, _, t in rows} <= GGUF_TYPES, sorted({t for _, _, t in rows})


@pytest.mark.parametrize("arch", list(ARCHS))
def test_tiny_model_states_for_every_form(synth_model, arch):
    """The tiny model loads through the spec; new_state makes one container per layer for each attention form."""
    s = ARCHS[arch]
    m = Model(synth_model(arch, preset="tiny"))
    assert m.arch is s
    for form in (None, *s.ATTN_FORMS):
        st = m.new_state(form)
        assert len(st.layers) == m.cfg.n_layer


def test_spec_of_names_the_arch_and_the_missing_member():
    import refengine.archs.llama as llama
    broken = types.ModuleType("refengine.archs.broken")
    for name in REQUIRED:
        setattr(broken, name, getattr(llama, name))
    broken.ARCH = "broken"
    del broken.head, broken.MATMUL_INPUTS
    with pytest.raises(ArchSpecError, match=r"'broken'.*head, MATMUL_INPUTS|'broken'.*MATMUL_INPUTS, head"):
        spec_of(broken)
    broken.head, broken.MATMUL_INPUTS = llama.head, llama.MATMUL_INPUTS
    s = spec_of(broken)                                   # the optional members take their defaults
    assert {n: getattr(s, n) for n in OPTIONAL} == OPTIONAL and s.synth_resolve is cut_layers
    broken.LOCAL_INPUTS = 1
    with pytest.raises(ArchSpecError, match="'broken': LOCAL_INPUTS must be a bool"):
        spec_of(broken)
    broken.LOCAL_INPUTS, broken.embed = True, "embed"
    with pytest.raises(ArchSpecError, match="'broken': embed must be a function"):
        spec_of(broken)


def test_cut_layers():
    p = dict(n_layer=4, n_embd=8)
    assert cut_layers(p, None) is p and cut_layers(p, 2) == dict(n_layer=2, n_embd=8) and p["n_layer"] == 4


PROBE = re.compile(r"\b(?:get|has)attr\(\s*(?:[\w.]*\barch|ARCHS\[|[\w.]*\bmodule)\b")


def test_no_tool_probes_the_arch_contract():
    """The tools read the spec's fields: no getattr / hasattr on an arch outside `spec_of`."""
    hits = []
    for top in ("refengine", "quant", "tests", "benchmarks"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                path = os.path.join(dirpath, f)
                if not f.endswith(".py") or path.endswith(os.path.join("archs", "spec.py")):
                    continue
                with open(path, encoding="utf-8") as fh:
                    for i, line in enumerate(fh, 1):
                        if PROBE.search(line):
                            hits.append(f"{os.path.relpath(path, ROOT)}:{i}: {line.strip()}")
    assert not hits, "\n".join(hits)
