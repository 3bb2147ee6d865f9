"""The GPU expert cache (issue 24): routed experts held in a fixed number of device slots, copied from the mmapped
GGUF when a batch routes to one that is not there. This file is the cache's logic only (which expert sits in which
slot, what is evicted, what it cost); the bytes live in a slot pool (quant/cuda/expert_slots.py: CUDA buffers, or
NumPy ones for the "sim" device), and the loader callback moves them.

Legend: L layers, E experts of a layer, A active experts per token, T tokens, N slots.

    slot        gate, up and down of one expert of one layer (their packed GGUF bytes); slot_bytes = the largest
                such triple over the layers (per role: quant/cuda/expert_slots.py lays the three out separately)
    N           = budget // slot_bytes
    lookup(il, ids [T, A]) -> slots [T, A]
                the batch's distinct experts: hits are pinned and touched; each miss takes a free slot, else the
                policy's victim among the slots not pinned, and `loader(slot, expert)` copies the expert in.
                More distinct experts than N: ExpertBudgetError naming the budget and the layer (never a wrong
                answer; splitting the batch would change the kernels' row counts, so it would not be exact)
    release()   the batch's pins end (on the GPU: once its kernels are queued; a later copy into one of its slots
                is queued after them on the same stream)
    prefetch(il, experts, copy, submit, after=None)
                experts of il guessed for its next batch (refengine/expert_prefetch.py): each takes a slot now, as
                a miss would but never a pinned one, and `copy` fills it on a worker thread (`submit`); the slot is
                "loading" until `wait()`: never a victim, and a batch that uses it (or needs its room) waits first.
                after=il0: issued at the end of layer il0's next lookup, its batch pinned (a guess made at il0's
                router must not evict what il0 is about to use). A failed copy frees its slots and raises at the
                wait (the next lookup that needs them)

Replacement policies (POLICIES), all breaking ties by least recent use:
    lru         the slot used longest ago
    lfu         the expert used by the fewest batches so far (counts kept across evictions: LFU with history)
    decay       the smallest frequency score, each batch's use adding 1 and every score multiplied by `decay` per
                batch of its layer (a frequency with a memory of about 1 / (1 - decay) batches)

Counters (`as_dict()`, for `--json`): per layer lookups (distinct experts asked for by a batch), hits, misses, hit
rate, token-expert pairs, tokens, evictions; overall bytes moved host->device and the seconds spent in the loader
(on the GPU the copy from pageable mmapped memory is synchronous: that is the time stalled on misses). With prefetch
(`as_dict()["prefetch"]`): experts prefetched, of those used (hit before being evicted), their bytes (in bytes moved
too), the copies' seconds on the worker thread, and the seconds batches waited for them. A hit on a prefetched slot
is a hit: hits + misses are still the batches' distinct experts.

Budgets (`parse_budget`): "8GiB" / "512MiB" / "3GB", a byte count (int or digits), or a fraction of the model's
routed-expert bytes (a float in (0, 1], "0.25", "25%").
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

import numpy as np

from .errors import ConfigError, ExpertBudgetError

POLICIES = ("lru", "lfu", "decay")
ROLES = ("gate", "up", "down")
_UNITS = {"": 1, "b": 1, "k": 10 ** 3, "kb": 10 ** 3, "m": 10 ** 6, "mb": 10 ** 6, "g": 10 ** 9, "gb": 10 ** 9,
          "t": 10 ** 12, "tb": 10 ** 12, "kib": 2 ** 10, "mib": 2 ** 20, "gib": 2 ** 30, "tib": 2 ** 40}


def parse_budget(spec, expert_bytes: int | None = None) -> int:
    """A budget in bytes: "8GiB", "3GB", 123456, "123456"; or a fraction of `expert_bytes` (0.25, "0.25", "25%")."""
    if isinstance(spec, bool):
        raise ConfigError(f"expert budget {spec!r}: give bytes (\"8GiB\", 123456) or a fraction (0.25, \"25%\")")
    frac = None
    if isinstance(spec, (int, np.integer)):
        n = int(spec)
    elif isinstance(spec, float):
        frac = spec
    else:
        s = str(spec).strip().lower().replace(" ", "")
        m = re.fullmatch(r"([0-9]*\.?[0-9]+)(%|[a-z]*)", s)
        if m is None or (m.group(2) not in _UNITS and m.group(2) != "%"):
            raise ConfigError(f"expert budget {spec!r}: give bytes (\"8GiB\", \"512MiB\", \"3GB\", 123456) or a "
                              f"fraction of the routed-expert bytes (0.25, \"25%\")")
        num, unit = m.groups()
        if unit == "%":
            frac = float(num) / 100
        elif unit == "" and "." in num:
            frac = float(num)
        else:
            n = int(float(num) * _UNITS[unit])
    if frac is not None:
        if not 0 < frac <= 1:
            raise ConfigError(f"expert budget {spec!r}: a fraction must be in (0, 1]")
        if expert_bytes is None:
            raise ConfigError(f"expert budget {spec!r} is a fraction of the model's routed-expert bytes: build the "
                              f"cache with ExpertCache.for_model(model, {spec!r})")
        n = int(frac * expert_bytes)
    if n <= 0:
        raise ConfigError(f"expert budget {spec!r}: must be positive")
    return n


def _fmt(n: int) -> str:
    return f"{n / 2 ** 30:.2f} GiB" if n >= 2 ** 30 else f"{n / 2 ** 20:.2f} MiB" if n >= 2 ** 20 else f"{n} B"


@dataclass(frozen=True)
class ExpertGeometry:
    """The routed experts of a model, as a slot pool needs them: per role the largest per-expert byte count over the
    layers (gate and up share one: the GLU kernel reads both at one stride), the layers that have routed experts,
    and the total routed-expert bytes (what a fractional budget is a fraction of)."""
    strides: dict            # role -> bytes of one expert's slot
    layers: tuple            # layer indices with routed experts
    n_expert: int            # E (the largest over the layers)
    expert_bytes: int        # sum over layers and roles of the routed tensors' bytes

    @property
    def slot_bytes(self) -> int:
        return int(sum(self.strides.values()))

    @staticmethod
    def of_tensors(layers: dict) -> "ExpertGeometry":
        """layers: il -> {role: QTensor [E, O, I] or None}."""
        strides = {r: 0 for r in ROLES}
        total, E = 0, 0
        for ts in layers.values():
            for role, t in ts.items():
                if t is None:
                    continue
                strides[role] = max(strides[role], expert_bytes_of(t))
                total += expert_bytes_of(t) * t.shape[0]
                E = max(E, t.shape[0])
        strides["gate"] = strides["up"] = max(strides["gate"], strides["up"])
        return ExpertGeometry(strides, tuple(sorted(layers)), E, total)


def expert_bytes_of(t) -> int:
    """Packed bytes of one expert of an [E, O, I] tensor."""
    return int(t.raw.size // t.shape[0])


def routed_tensors(w) -> dict:
    """A loaded layer's routed experts as {role: QTensor [E, O, I] or None}; None when the layer has none. A fused
    `ffn_gate_up_exps` counts as gate and up halves (moe/block.py `split_gate_up`, here without copying)."""
    down = getattr(w, "ffn_down_exps", None)
    if down is None:
        return None
    gu = getattr(w, "ffn_gate_up_exps", None)
    if gu is not None:
        from quant import QTensor
        E, I2, D = gu.shape
        half = QTensor(gu.name + "[half]", gu.type, (E, I2 // 2, D), gu.raw[:, :I2 // 2])
        return {"gate": half, "up": half, "down": down}
    return {"gate": getattr(w, "ffn_gate_exps", None), "up": getattr(w, "ffn_up_exps", None), "down": down}


def model_geometry(model) -> ExpertGeometry:
    """The routed-expert geometry of a refengine Model (every layer's tensor table is resolved; nothing decoded)."""
    layers = {}
    for il in range(model.cfg.n_layer):
        ts = routed_tensors(model.layer(il))
        if ts is not None:
            layers[il] = ts
    if not layers:
        raise ConfigError(f"{model.path}: the model has no routed experts: an expert budget does not apply")
    return ExpertGeometry.of_tensors(layers)


@dataclass
class LayerCounters:
    lookups: int = 0          # distinct experts asked for by a batch (hits + misses)
    hits: int = 0
    misses: int = 0
    pairs: int = 0            # token-expert pairs routed (T * A per batch)
    tokens: int = 0
    evictions: int = 0        # slots this layer's misses took from another expert

    def as_dict(self) -> dict:
        return dict(lookups=self.lookups, hits=self.hits, misses=self.misses,
                    hit_rate=self.hits / self.lookups if self.lookups else None, pairs=self.pairs,
                    tokens=self.tokens, evictions=self.evictions)


@dataclass
class ExpertCache:
    """Which expert of which layer sits in which of `n_slots` slots (module docstring). `loader(slot, layer,
    expert) -> bytes copied` (None: slot_bytes) moves the bytes; `lookup` may pass its own for one batch."""
    budget_bytes: int
    slot_bytes: int
    policy: str = "lru"
    decay: float = 0.9                 # policy "decay": score multiplier per batch of the expert's layer
    loader: object = None
    geometry: ExpertGeometry | None = None
    strides: dict | None = None        # role -> bytes of its part of a slot (the slot pool's layout)
    log: list | None = None            # a list: (layer, expert, slot, evicted (layer, expert) or None) per load
    layers: dict = field(default_factory=dict)     # il -> LayerCounters
    bytes_moved: int = 0
    load_seconds: float = 0.0
    prefetcher: object = None          # refengine.expert_prefetch.Prefetcher (ExpertCache.for_model(prefetch=True))

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise ConfigError(f"expert cache policy {self.policy!r} is not one of {', '.join(POLICIES)}")
        if not 0 < self.decay < 1:
            raise ConfigError(f"expert cache decay {self.decay!r} must be in (0, 1)")
        if self.slot_bytes <= 0:
            raise ConfigError(f"expert cache: slot size {self.slot_bytes} bytes")
        self.n_slots = int(self.budget_bytes // self.slot_bytes)
        if self.geometry is not None:          # never more slots than there are experts
            self.n_slots = min(self.n_slots, len(self.geometry.layers) * self.geometry.n_expert)
        N = self.n_slots
        self.key = [None] * N                         # slot -> (layer, expert) or None (free)
        self.where: dict[tuple, int] = {}             # (layer, expert) -> slot
        self.pinned = np.zeros(N, dtype=bool)
        self.last = np.full(N, -1, dtype=np.int64)    # global use tick of the slot's expert (-1: free)
        self.score = np.zeros(N, dtype=np.float64)    # lfu: uses; decay: the decayed score at `seen`
        self.seen = np.zeros(N, dtype=np.int64)       # decay: the layer's batch clock at the last use
        self.slot_layer = np.zeros(N, dtype=np.int64)    # decay: the slot's layer, as its index in `clock`
        self.slot_il = np.full(N, np.iinfo(np.int64).min)  # the slot's (layer, expert), as arrays (free: no layer)
        self.slot_expert = np.zeros(N, dtype=np.int64)
        self._lidx: dict[int, int] = {}               # layer -> its index in `clock`
        self.freq: dict[tuple, int] = {}              # lfu: (layer, expert) -> batches that used it, ever
        self.clock = np.zeros(0, dtype=np.int64)      # decay: per layer (by _lidx) the batches of it so far
        self.tick = 0
        self.pool = None                              # the slot pool a backend attaches (quant/cuda/expert_slots.py)
        # prefetch (refengine/expert_prefetch.py): slots filled ahead of their layer by a background copy
        self.loading = np.zeros(N, dtype=bool)        # a copy into the slot may still be running
        self.jobs: list = []                          # those copies: (concurrent.futures.Future, their slots)
        self.pending = None                           # a prefetch issued once a layer's batch is pinned (`after`)
        self.fetched = np.zeros(N, dtype=bool)        # filled by a prefetch and not used since
        self.width: dict[int, int] = {}               # layer -> A of its last batch (ids [T, A])
        self.prefetches = 0                           # experts prefetched
        self.prefetch_used = 0                        # of those, hit by their layer's batch before being evicted
        self.prefetch_bytes = 0
        self.prefetch_seconds = 0.0                   # the copies' own time (in the background)
        self.prefetch_wait_seconds = 0.0              # time a batch waited for a copy still running

    @staticmethod
    def for_model(model, budget, policy: str = "lru", prefetch: bool = False, **kw) -> "ExpertCache":
        """A cache sized for `model`'s routed experts; budget as `parse_budget` (a fraction of their bytes too).
        prefetch: each MoE layer's router input also predicts the next MoE layer's experts, copied into slots in
        the background while the layers in between run (refengine/expert_prefetch.py)."""
        g = model_geometry(model)
        c = ExpertCache(parse_budget(budget, g.expert_bytes), g.slot_bytes, policy=policy, geometry=g,
                        strides=dict(g.strides), **kw)
        if prefetch:
            from .expert_prefetch import Prefetcher
            c.prefetcher = Prefetcher(model, c)
        return c

    @staticmethod
    def for_tensors(budget, tensors: dict, policy: str = "lru", **kw) -> "ExpertCache":
        """A cache with slots the size of one layer's experts (tensors: role -> QTensor [E, O, I] or None): what
        `Runtime(expert_budget="8GiB")` builds at its first MoE layer. A budget in bytes only (no model to take a
        fraction of); a later layer with larger experts is refused when loaded (use `for_model` then)."""
        g = ExpertGeometry.of_tensors({0: tensors})
        return ExpertCache(parse_budget(budget), g.slot_bytes, policy=policy, strides=dict(g.strides), **kw)

    # ------------------------------------------------------------ the policy
    def _victim(self) -> int:
        """The slot a miss takes: a free one (the lowest), else the policy's choice among the unpinned ones."""
        occupied = (self.last >= 0) | self.loading
        free = np.flatnonzero(~occupied)
        if free.size:
            return int(free[0])
        if self.policy == "lru":
            prim = self.last.astype(np.float64)
        elif self.policy == "lfu":
            prim = self.score.copy()
        else:
            now = self.clock[self.slot_layer]                                # [N] each slot's layer clock
            prim = self.score * self.decay ** (now - self.seen).astype(np.float64)
        prim[self.pinned | self.loading] = np.inf
        cand = np.flatnonzero(prim == prim.min())
        return int(cand[np.argmin(self.last[cand])])

    def _touch(self, slot: int, layer: int, expert: int) -> None:
        self.tick += 1
        self.last[slot] = self.tick
        k = (layer, expert)
        if self.policy == "lfu":
            self.freq[k] = self.freq.get(k, 0) + 1
            self.score[slot] = self.freq[k]
        elif self.policy == "decay":
            now = self.clock[self._lidx[layer]]
            old = self.score[slot] * self.decay ** (now - self.seen[slot]) if self.key[slot] == k else 0.0
            self.score[slot] = old + 1.0
            self.seen[slot] = now

    # ------------------------------------------------------------ the batch
    def lookup(self, layer: int, ids, loader=None) -> np.ndarray:
        """ids [T, A] (expert ids of layer `layer`) -> slot ids [T, A] int32; the misses loaded and every slot the
        batch uses pinned until `release()`. loader(slot, expert) -> bytes (None: slot_bytes) for this batch."""
        ids = np.asarray(ids)
        uniq, inv = np.unique(ids, return_inverse=True)
        T = ids.shape[0] if ids.ndim else 1
        if self.loading.any() and (uniq.size > int((~self.pinned & ~self.loading).sum()) or any(
                self.loading[self.where[(layer, int(e))]] for e in uniq.tolist() if (layer, e) in self.where)):
            self.wait()                               # a prefetched expert of this batch, or its room, still copying
        free_or_mine = int((~self.pinned).sum())
        if uniq.size > free_or_mine:
            pinned = self.n_slots - free_or_mine
            raise ExpertBudgetError(
                f"expert budget {_fmt(self.budget_bytes)} ({self.n_slots} slots of {_fmt(self.slot_bytes)}) cannot "
                f"hold layer {layer}'s {uniq.size} active experts for a batch of {T} tokens"
                + (f" ({pinned} slots pinned by an unreleased batch)" if pinned else "")
                + f": raise the budget to at least {_fmt(uniq.size * self.slot_bytes)}, or run fewer tokens per "
                  f"batch (--ubatch)")
        c = self.layers.setdefault(layer, LayerCounters())
        c.tokens += T
        c.pairs += ids.size
        self.width[layer] = int(ids.shape[-1]) if ids.ndim else 1
        li = self._layer_index(layer)
        self.clock[li] += 1
        slots = np.empty(uniq.size, dtype=np.int32)
        misses = []
        for i, e in enumerate(uniq.tolist()):       # hits first: pinned before any miss picks a victim
            s = self.where.get((layer, e))
            if s is None:
                misses.append(i)
                continue
            slots[i] = s
            self.pinned[s] = True
            if self.fetched[s]:
                self.fetched[s] = False
                self.prefetch_used += 1
            self._touch(s, layer, e)
        c.lookups += uniq.size
        c.hits += uniq.size - len(misses)
        c.misses += len(misses)
        load = loader if loader is not None else (
            (lambda s, e: self.loader(s, layer, e)) if self.loader is not None else (lambda s, e: None))
        try:
            for i in misses:
                e = int(uniq[i])
                s = self._victim()
                old = self._evict(s, c)                    # free while it loads (a failed loader leaves it so)
                t0 = time.perf_counter()
                moved = load(s, e)
                self.load_seconds += time.perf_counter() - t0
                self.bytes_moved += self.slot_bytes if moved is None else int(moved)
                self._hold(s, layer, e, li)
                self.pinned[s] = True
                self._touch(s, layer, e)
                slots[i] = s
                if self.log is not None:
                    self.log.append((layer, e, s, old))
            if self.pending is not None and self.pending[0] == layer:
                _, args = self.pending                # a prediction made at this layer: issued now that its batch
                self.pending = None                   # is pinned, so it never evicts the experts it is about to use
                self.prefetch(*args)
        except BaseException:                         # a loader failed: this batch pins nothing
            self.pinned[[self.where[(layer, int(e))] for e in uniq if (layer, int(e)) in self.where]] = False
            raise
        return slots[inv].reshape(ids.shape)

    def release(self) -> None:
        """The running batch's slots may be evicted again."""
        self.pinned[:] = False

    def prefetch(self, layer: int, experts, copy, submit, after: int | None = None) -> int:
        """Experts of `layer` expected by its next batch (the likeliest first): each one not resident takes a slot
        now (a free one, else the policy's victim among the slots neither pinned nor loading, as a miss would; none
        left: the rest are skipped) and `copy(slot, expert) -> bytes` (None: slot_bytes) fills them in the
        background: `submit(fn)` runs fn elsewhere (one worker: in order) and returns a Future. The bookkeeping is
        done here, in the caller's thread; a batch that uses such a slot, or needs its room, waits for the copies
        (`wait`), and a loading slot is never a victim. after: issue the prefetch at the end of layer `after`'s next
        lookup (its batch pinned), so that it cannot evict that batch's experts. Returns the experts prefetched."""
        if after is not None:
            self.pending = (after, (layer, experts, copy, submit))
            return 0
        todo = []
        for e in dict.fromkeys(int(e) for e in np.asarray(experts).reshape(-1)):
            if (layer, e) in self.where:
                continue                              # resident, or already on its way
            s = self._victim()
            if self.pinned[s] or self.loading[s]:
                break                                 # no room left that a batch does not hold
            old = self._evict(s, self.layers.setdefault(layer, LayerCounters()))   # as a miss of `layer` counts
            li = self._layer_index(layer)
            self._hold(s, layer, e, li)               # lfu / decay: no use yet (a wrong guess is the first victim)
            self.seen[s] = self.clock[li]
            self.loading[s] = self.fetched[s] = True
            self.tick += 1
            self.last[s] = self.tick                 # lru: as recent as a use (its batch is the next of `layer`)
            todo.append((s, e))
            if self.log is not None:
                self.log.append((layer, e, s, old))
        if not todo:
            return 0

        def run():                                    # the worker thread: copies only, no counter of ours touched
            t0, moved = time.perf_counter(), 0
            for s, e in todo:
                n = copy(s, e)
                moved += self.slot_bytes if n is None else int(n)
            return moved, time.perf_counter() - t0
        try:
            job = submit(run)
        except BaseException:
            self._free([s for s, _ in todo])
            raise
        self.jobs.append((job, [s for s, _ in todo]))
        self.prefetches += len(todo)
        return len(todo)

    def _layer_index(self, layer: int) -> int:
        """The layer's index in `clock` (a new layer gets the next one)."""
        li = self._lidx.setdefault(layer, len(self._lidx))
        if li >= self.clock.size:
            self.clock = np.concatenate([self.clock, np.zeros(1, np.int64)])
        return li

    def _evict(self, s: int, counters) -> tuple | None:
        """Slot s emptied for a new expert: its (layer, expert) forgotten (counted as an eviction in `counters`)
        and the slot free until `_hold` fills it. Returns what it held."""
        old = self.key[s]
        if old is not None:
            counters.evictions += 1
        self._free([s])
        return old

    def _hold(self, s: int, layer: int, e: int, li: int) -> None:
        """Slot s now holds expert e of `layer` (li: its clock index), with no use yet."""
        self.key[s], self.where[(layer, e)] = (layer, e), s
        self.slot_layer[s], self.slot_il[s], self.slot_expert[s] = li, layer, e
        self.score[s] = 0.0

    def _free(self, slots) -> None:
        """Slots whose copy failed (or never ran): they hold nothing."""
        for s in slots:
            if self.key[s] is not None:
                del self.where[self.key[s]]
            self.key[s], self.last[s], self.fetched[s], self.loading[s] = None, -1, False, False
            self.slot_il[s] = np.iinfo(np.int64).min

    def wait(self) -> None:
        """Every background copy finished, its slots usable and its bytes counted (here, in the caller's thread:
        bytes_moved, prefetch_bytes, the slot pool's counters). A copy that failed leaves its slots free (they hold
        nothing) and its error is raised here, after the others are waited for."""
        jobs, self.jobs = self.jobs, []
        err = None
        t0 = time.perf_counter()
        for job, slots in jobs:
            try:
                moved, secs = job.result()
            except BaseException as e:                # its slots are not what they claim: free them
                self._free(slots)
                err = err or e
                continue
            self.loading[slots] = False
            self.prefetch_bytes += moved
            self.bytes_moved += moved
            self.prefetch_seconds += secs
            if self.pool is not None and hasattr(self.pool, "count"):
                self.pool.count(len(slots), moved)
        self.prefetch_wait_seconds += time.perf_counter() - t0
        if err is not None:
            raise err

    def resident(self, layer: int | None = None) -> list:
        """(layer, expert) of every filled slot (of one layer), sorted."""
        return sorted(k for k in self.where if layer is None or k[0] == layer)

    def expert_of_slot(self, layer: int) -> np.ndarray:
        """int64 [N]: the expert of `layer` in each slot, 0 where the slot holds another layer's or none (a
        per-expert table, such as the `.scale` vectors, remapped to slots by indexing with it)."""
        return np.where(self.slot_il == layer, self.slot_expert, 0)

    # ------------------------------------------------------------ counters
    @property
    def hits(self) -> int:
        return sum(c.hits for c in self.layers.values())

    @property
    def misses(self) -> int:
        return sum(c.misses for c in self.layers.values())

    @property
    def hit_rate(self) -> float | None:
        n = self.hits + self.misses
        return self.hits / n if n else None

    def as_dict(self) -> dict:
        return dict(policy=self.policy, budget_bytes=self.budget_bytes, slot_bytes=self.slot_bytes,
                    n_slots=self.n_slots, expert_bytes=self.geometry.expert_bytes if self.geometry else None,
                    hits=self.hits, misses=self.misses, hit_rate=self.hit_rate,
                    evictions=sum(c.evictions for c in self.layers.values()), bytes_moved=self.bytes_moved,
                    load_seconds=self.load_seconds, tokens=max((c.tokens for c in self.layers.values()), default=0),
                    prefetch=None if self.prefetcher is None else dict(
                        experts=self.prefetches, used=self.prefetch_used, bytes=self.prefetch_bytes,
                        seconds=self.prefetch_seconds, wait_seconds=self.prefetch_wait_seconds),
                    layers={il: c.as_dict() for il, c in sorted(self.layers.items())})

    def summary(self) -> str:
        """One line for the end of `run`."""
        hr = self.hit_rate
        return (f"expert cache {self.policy}: {_fmt(self.budget_bytes)}, {self.n_slots} slots; hit rate "
                f"{'-' if hr is None else f'{hr:.3f}'} ({self.hits} hits, {self.misses} misses), "
                f"{_fmt(self.bytes_moved)} moved host->device in {self.load_seconds:.2f} s"
                + ("" if self.prefetcher is None else
                   f"; prefetched {self.prefetches} experts ({self.prefetch_used} used), {self.prefetch_seconds:.2f} s "
                   f"copying in the background, {self.prefetch_wait_seconds:.2f} s waited for"))
