"""Fuzz the loader: mutated GGUFs, each opened and run in a bounded child process, beside llama.cpp's loader.

    python -m refengine.fuzz -n 5100 --jobs 2 --out fuzz.jsonl --table fuzz.md   (see --help; docs/fuzz.md)

A mutant is one seed file (or split set) with one structured change (`KINDS`) or random byte flips. Each is
run twice, in two forked children with an address-space and CPU-time bound (`resource.setrlimit`) and a
wall-clock deadline:

    refengine   Model(path); load_all(); forward([1, 2, 3])
    llama.cpp   ggml's gguf_init_from_file (the GGUF reader), then llama_model_load_from_file (the loader)

and classified (`OUTCOMES`):

    typed     a refengine error (`refengine.errors`), naming the file, key or tensor
    ran       loaded and produced logits (`warned`: with a note that llama.cpp refuses the file)
    untyped   any other Python exception: a bug
    crash     the child died by a signal (a segfault, an abort)
    hang      past the deadline or the CPU bound
    memory    MemoryError, or the child hit the address-space bound

Mutants are deterministic in (seed, index): `mutate(seed_files, kind, rng)` rewrites the header through a
small parser (`RawGGUF`) that keeps every key's encoded value, the tensor table and each tensor's bytes.

    rawgguf.py    a GGUF as editable parts            mutate.py    one function per mutation kind
    bounded.py    the two runs in bounded children    campaign.py  seeds, records, tables, command line
"""
from .bounded import DEADLINE_S, MEMORY_BYTES, OUTCOMES, run_bounded, run_llamacpp, run_refengine
from .campaign import SEEDS, campaign, differential_table, disagreement_table, fuzz_one, main, make_seeds, outcome_table
from .mutate import KINDS, MUTATIONS, mutate
from .rawgguf import ARR, BOOL, F32, F64, I8, I16, I32, I64, STR, U8, U16, U32, U64, RawGGUF, TInfo, encode_value, parse

__all__ = ["KINDS", "MUTATIONS", "OUTCOMES", "SEEDS", "DEADLINE_S", "MEMORY_BYTES", "RawGGUF", "TInfo", "campaign",
           "differential_table", "disagreement_table", "encode_value", "fuzz_one", "main", "make_seeds", "mutate",
           "outcome_table", "parse", "run_bounded", "run_llamacpp", "run_refengine",
           "ARR", "BOOL", "F32", "F64", "I8", "I16", "I32", "I64", "STR", "U8", "U16", "U32", "U64"]
