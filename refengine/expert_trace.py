"""Which experts each token used: the routing trace a cache designer replays (issue 24), on every backend.

Legend: L layers, E experts of a layer, A active experts per token, T tokens of one forward call's batch.

    trace = ExpertTrace()
    Runtime(expert_stats=trace)          every `Runtime.moe_ffn` call adds (layer, ids [T, A], E), in call order
    trace.counts(il)                     int64 [E]: token-expert pairs of layer il per expert
    trace.save("route.npz")              the calls, flat (below); ExpertTrace.load reads it back
    replay(trace, cache)                 each call through ExpertCache.lookup / release, as a forward would

The file (`.npz`): `layer` int32 [n] (one entry per call), `shape` int32 [n, 2] (T, A of each call), `n_expert`
int32 [n], `ids` int32 [sum of T*A] (each call's [T, A] ids, row-major, one after another). Calls come in the
order the forward made them: a batch's layers one after another, then the next batch (a decode step is T = 1). A
prompt run for its last logits only (`forward(last_only=True)`: `refengine run`'s prefill) routes its last block for
its last token only, as llama.cpp does (its output rows, `Step.out_rows`): that call has T = 1.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class ExpertTrace:
    calls: list = field(default_factory=list)         # (layer, ids int32 [T, A], E)

    def add(self, layer: int, ids, n_expert: int) -> None:
        self.calls.append((int(layer), np.array(ids, dtype=np.int32, copy=True).reshape(np.shape(ids)[0], -1),
                           int(n_expert)))

    def layers(self) -> list[int]:
        return sorted({il for il, _, _ in self.calls})

    def counts(self, layer: int) -> np.ndarray:
        """int64 [E]: how many token-expert pairs of `layer` went to each expert."""
        E = max((n for il, _, n in self.calls if il == layer), default=0)
        out = np.zeros(E, dtype=np.int64)
        for il, ids, _ in self.calls:
            if il == layer:
                out += np.bincount(ids.reshape(-1), minlength=E)
        return out

    def tokens(self) -> int:
        """Tokens routed (those of the first MoE layer's calls)."""
        ls = self.layers()
        return sum(ids.shape[0] for il, ids, _ in self.calls if il == ls[0]) if ls else 0

    def as_dict(self) -> dict:
        """Per layer the use counts of each expert (for `--json`)."""
        return {"tokens": self.tokens(), "calls": len(self.calls),
                "layers": {il: self.counts(il).tolist() for il in self.layers()}}

    def save(self, path) -> None:
        n = len(self.calls)
        ids = np.concatenate([c[1].reshape(-1) for c in self.calls]) if n else np.zeros(0, np.int32)
        with open(path, "wb") as f:          # a file object: np.savez would append ".npz" to another name
            np.savez(f, layer=np.array([c[0] for c in self.calls], np.int32).reshape(n),
                     shape=np.array([c[1].shape for c in self.calls], np.int32).reshape(n, 2),
                     n_expert=np.array([c[2] for c in self.calls], np.int32).reshape(n), ids=ids.astype(np.int32))

    @staticmethod
    def load(path) -> "ExpertTrace":
        z = np.load(path)
        tr, o = ExpertTrace(), 0
        for il, (T, A), E in zip(z["layer"], z["shape"], z["n_expert"]):
            tr.calls.append((int(il), z["ids"][o:o + T * A].reshape(T, A), int(E)))
            o += int(T * A)
        return tr


def replay(trace: ExpertTrace, cache) -> None:
    """Every call of `trace` through `cache` (ExpertCache) as the forward would make it: lookup, then release.
    Counters accumulate on the cache; no bytes move unless the cache has a loader."""
    for il, ids, _ in trace.calls:
        cache.lookup(il, ids)
        cache.release()
