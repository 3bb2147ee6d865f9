"""Per-sequence state carried between forward calls, one typed container per layer.

    state = model.new_state()          # ModelState: n_past + one container per layer
    state.layers[il]                   # made by the layer's attention module (`new_state()` there)

Containers (each attention module creates its own; an arch never builds one by hand):

| container        | made by                     | holds (per position unless noted)                         |
|------------------|-----------------------------|-----------------------------------------------------------|
| `KVCache`        | `attention/mha.py`          | keys [S, Hkv, K] and values [S, Hkv, V]                    |
| `LatentKV`       | `attention/mla.py` absorbed | latent c and shared rope key k_pe side by side: [S, C + R]  |
| `KVCache`        | `attention/mla.py` naive    | decompressed keys [S, H, K] and values [S, H, V]           |
| `IndexerKeys`    | `attention/dsa_indexer.py`  | the lightning indexer's keys [S, di] (llama.cpp's "lid" cache) |
| `DSAState`       | `attention/dsa.py`          | an MLA cache and, in a layer with its own indexer, `IndexerKeys` (or `KPoolKeys`) |
| `RecurrentState` | `attention/gated_deltanet.py`, `attention/kda.py` | conv tail [n_conv - 1, channels] and delta-rule matrix |
| `WindowKV`       | `attention/compressed_kv.py` | the raw keys (K = V) of the last n_swa positions, with their positions |
| `BlockFill`      | `attention/kv_compressor.py` | a compressor's projected rows (kv, gate score) of the block being filled (and the one before it: overlap) |
| `PooledBlocks`   | `attention/kv_compressor.py` | one pooled key per finished block [n_blocks, K] (attention keys, or the indexer's) |
| `CompressedKV`   | `attention/compressed_kv.py` | DeepSeek-V4's layer: the window, and by ratio the pooled blocks, the block being filled, the indexer's keys and block |
| `CompressorRows` | `attention/kv_compressor.py` | a compressor's state in a fixed-shape run: every position's projected rows and its block's pooled key as of it |
| `QSAState`       | `attention/qsa.py`          | a `KVCache` and the QSA indexer's raw (unpooled) keys `IndexerKeys` [S, di] |
| `NGramState`     | `embed/ngram.py`            | the last N-1 token ids and the n-gram conv's history [(Kc-1)*N, P*D] (fixed size) |
| `WithNGram`      | `embed/ngram.py`            | a layer's attention container plus its `NGramState` (the PLE layer)  |
| `KPoolKeys`      | `attention/kpool_indexer.py` | the k-pool indexer's key / gate rows [S, di] and pooled keys [n_pools, di] (a fixed-shape run: [S, di], at each pool's last row) |

A container of an attention with several forms carries the form its sequence runs (`form`: MLA's "absorbed" /
"naive", a delta rule's "recurrent" / "chunked"); the attention module reads it, so an arch passes the state and
never asks what kind of container it holds.

`Rows` is the appendable buffer they share: capacity doubling, so a decode step costs O(1) amortized
copies instead of one copy of the whole cache per token. Compressed caches (pooled blocks plus a
half-filled block, window rings) are further containers of the same kind: they own their buffers and
expose what attention reads.

Every container class is registered with `@state_container` (one line; `CONTAINERS` maps its name to the class),
which is how a state file (`refengine/state_file.py`) restores it: the file names the class and stores its instance
attributes, walked structurally. What a container may hold is listed in `state_file`'s docstring and the README
(Adding an architecture); anything else is refused when the state is saved, naming the attribute.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .ops.arrays import fused_op

CONTAINERS: dict[str, type] = {}          # class name -> class, for the state file (refengine/state_file.py)


def state_container(cls: type) -> type:
    """Register a state container class (a class decorator): a state file names it and restores it by this name,
    setting its instance attributes without calling `__init__`."""
    name = cls.__name__
    if CONTAINERS.get(name, cls) is not cls:
        raise TypeError(f"state container {name}: a different class of that name is registered "
                        f"({CONTAINERS[name].__module__}); state files name containers by class name")
    CONTAINERS[name] = cls
    return cls


class Rows:
    """An array grown along axis 0: `append(x)` stores x [n, ...] and returns all rows so far [S, ...].

    `append(x, fixed=True)` returns the whole buffer [capacity, ...] instead, the rows not written yet zeros: its
    shape stays the same from one call to the next until the capacity grows, as a decode step captured once and
    replayed (a CUDA graph) needs. The reader must hide the rows past the last one written: a causal mask does (they
    are positions no query has reached), and a zero row under a zero weight adds nothing. Rows that live on a device
    (refengine.devarray) are then written at a count kept there (`_count`, a 0-d int64 array, made from `n` at the
    first such call), so no host int that changes per call is baked into the write."""

    def __init__(self, dtype=np.float32):
        self.dtype = np.dtype(dtype)
        self._buf: np.ndarray | None = None
        self.n = 0
        self._count = None                   # fixed appends on a device: the count there (n, not read back)
        self.reserved = 0                    # the least capacity an allocation takes (reserve)

    def reserve(self, n: int) -> None:
        """Room for n rows: the buffer grown to n now if it is smaller, and no allocation below n later (a prompt's
        ubatches replayed from one captured graph need the capacity the whole prompt reaches: a growth ends the
        graph)."""
        self.reserved = max(self.reserved, int(n))
        if self._buf is not None and self._buf.shape[0] < self.reserved:
            self._buf = self._grown(self.reserved, self._buf)   # (a device count stays: it is n, the rows kept;
                                                                # made anew inside a captured step, it would
                                                                # restart there at each replay)

    def _grown(self, cap: int, like) -> np.ndarray:
        """A buffer of cap rows where `like` lives (host or device), the rows so far copied in."""
        grown = np.zeros_like(like, shape=(cap, *like.shape[1:]), dtype=self.dtype)
        if self._buf is not None:
            grown[:self.n] = self._buf[:self.n]
        return grown

    def append(self, x: np.ndarray, fixed: bool = False) -> np.ndarray:
        if self._room(x, fixed):                          # at the device's count: no per-call host int baked in
            self._write(x)
        return self._advance(x.shape[0], fixed)

    def _room(self, x, fixed: bool) -> bool:
        """Make room for x's rows (the buffer grown, or moved to where x lives); write them now unless the write is
        at the device count (fixed, x on a device: True, the count made if it is not, the write the caller's)."""
        T = x.shape[0]
        # (a buffer on the host meeting device rows, e.g. a state loaded from a file continued on a GPU: moved to
        # where the rows live once, here, rather than read back and uploaded at every step)
        if self._buf is None or self.n + T > self._buf.shape[0] or self._buf.shape[1:] != x.shape[1:] or \
                type(self._buf) is not type(x):
            if self._buf is not None and self._buf.shape[1:] != x.shape[1:]:
                raise ValueError(f"appending rows of shape {x.shape[1:]} to a buffer of {self._buf.shape[1:]}")
            cap = max(2 * (self.n + T), 16, self.reserved) if self._buf is None or self.n + T > self._buf.shape[0] \
                else self._buf.shape[0]                   # amortized O(1) per position
            self._buf = self._grown(cap, x)               # where x lives (a device)
            self._count = None
        if not fixed or isinstance(x, np.ndarray):
            self._buf[self.n:self.n + T] = x
            self._count = None                            # (a device count, if any, is behind now)
            return False
        if self._count is None:                           # once, from n: inside a captured span it would restart
            if (dev := getattr(x, "dev", None)) is not None:              # from the captured n at every replay
                dev._sync(lambda: "a cache's device row count made from its host count (an eager step makes it)")
            self._count = np.full_like(x, self.n, shape=(1,), dtype=np.int64)   # ((1,): CuPy reads () as None)
        return True

    def _write(self, x) -> None:
        """x's rows at the device count, the count advanced (a GPU: one launch)."""
        if (f := fused_op(x, "append_rows")) is None or not f(self._buf, x, self._count):
            self._buf[self._count + np.arange(x.shape[0], like=x)] = x
            self._count += x.shape[0]

    def _advance(self, T: int, fixed: bool) -> np.ndarray:
        self.n += T
        return self._buf if fixed else self._buf[:self.n]

    def view(self) -> np.ndarray | None:
        return None if self._buf is None else self._buf[:self.n]

    @property
    def capacity(self) -> int:
        """Rows the buffer holds (a fixed append returns them all)."""
        return 0 if self._buf is None else self._buf.shape[0]

    @classmethod
    def holding(cls, rows: np.ndarray | None, dtype) -> Rows:
        """A buffer holding `rows` [n, ...] (None: nothing appended yet), as a state file restores one."""
        r = cls(dtype)
        if rows is not None:
            r.append(rows)
        return r


def append_rows(a: Rows, x, b: Rows, y, fixed: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(a.append(x, fixed), b.append(y, fixed)): two caches given the same positions (keys and values; a latent and
    its rope key). On a GPU with fixed shapes both writes are one launch (`fused.append_rows` with a second cache)
    where each alone is one."""
    at_a, at_b = a._room(x, fixed), b._room(y, fixed)
    if not (at_a and at_b and (f := fused_op(x, "append_rows")) is not None
            and f(a._buf, x, a._count, b._buf, y, b._count)):
        if at_a:
            a._write(x)
        if at_b:
            b._write(y)
    return a._advance(x.shape[0], fixed), b._advance(y.shape[0], fixed)


@state_container
class KVCache:
    """Keys and values of one softmax-attention layer in float32 (llama.cpp with type_k = type_v = F32).

    form: the form of the attention that made it, where that attention has several (MLA's "naive": keys and
    values decompressed per head); None for plain softmax attention, which has one.
    """

    def __init__(self, dtype=np.float32, form: str | None = None):
        self.k, self.v = Rows(dtype), Rows(dtype)
        self.form = form

    @property
    def n(self) -> int:
        return self.k.n

    def append(self, k: np.ndarray, v: np.ndarray, fixed: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """k [T, Hkv, K], v [T, Hkv, V] -> every position's keys [S, Hkv, K] and values [S, Hkv, V] (fixed: S = the
        capacity, `Rows`)."""
        return append_rows(self.k, k, self.v, v, fixed)

    def append_by(self, k, v, fixed: bool, write):
        """The append of a kernel that makes the keys itself (`gqa.rope_append`: k is the keys before their norm
        and rotation, of the keys' shape): where both go at the device counts (fixed shapes, device arrays),
        write(key buffer, its count, value buffer, its count) writes both, advances both counts and returns its own
        result r -> (r, every position's keys, values). None when that is not the case or write declines (nothing
        appended: the caller appends as `append`)."""
        if not fixed or isinstance(k, np.ndarray) or isinstance(v, np.ndarray):
            return None
        if not (self.k._room(k, fixed) and self.v._room(v, fixed)):
            return None
        r = write(self.k._buf, self.k._count, self.v._buf, self.v._count)
        if r is None:
            return None
        return r, self.k._advance(k.shape[0], fixed), self.v._advance(v.shape[0], fixed)


@state_container
class LatentKV:
    """MLA's compressed cache: one latent row and one shared rope key per position (DeepSeek-V2 sec. 2.1), side by
    side in one row of width C + R as llama.cpp stores them (a single-head K whose first C columns are V): the
    attention reads the rows as they are, no per-step copy of the cache (which a K made by joining c and k_pe at
    every step was: O(S) bytes a layer and token)."""
    form = "absorbed"                     # MLA's weight-absorbed form: the only one that caches the latent

    def __init__(self, dtype=np.float32):
        self.kv = Rows(dtype)             # [S, C + R]

    @property
    def n(self) -> int:
        return self.kv.n

    def append(self, c: np.ndarray, k_pe: np.ndarray, fixed: bool = False):
        """c [T, C], k_pe [T, R] -> every position's (c [S, C], k_pe [S, R], both side by side [S, C + R]), views of
        one buffer (fixed: S = the capacity, `Rows`)."""
        C = c.shape[-1]
        rows = self.kv.append(c if k_pe.shape[-1] == 0 else np.concatenate([c, k_pe], axis=-1), fixed)
        return rows[:, :C], rows[:, C:], rows

    @classmethod
    def _restored(cls, obj) -> LatentKV:
        """A state file's LatentKV of the layout before (c and k_pe in two Rows, state files of 2026-12-05 and
        earlier): the rows joined. ValueError when it holds neither layout's rows."""
        fields = vars(obj)
        if "kv" in fields:
            return obj
        if not ({"c", "k_pe"} <= set(fields) and isinstance(fields["c"], Rows) and isinstance(fields["k_pe"], Rows)):
            raise ValueError(f"a LatentKV without its rows (kv, or c and k_pe): fields {sorted(fields)}")
        c, k = fields.pop("c"), fields.pop("k_pe")
        cv, kv = c.view(), k.view()
        if cv is not None and (kv is None or kv.shape[0] != cv.shape[0]):
            raise ValueError(f"a LatentKV of {cv.shape[0]} latent rows and "
                             f"{0 if kv is None else kv.shape[0]} rope-key rows")
        obj.kv = Rows.holding(None if cv is None else np.concatenate([cv, kv], axis=-1), c.dtype)
        return obj


@state_container
class IndexerKeys:
    """The DSA lightning indexer's key cache: one key of width di per position (shared by the indexer heads).

    llama.cpp keeps it in its own cache (the "lid" cache, src/llama-kv-cache-dsa.cpp:39-53) of the context's
    type_k: float32 here, as in the oracle's f32 context (its default f16 cache would round the keys).
    """

    def __init__(self, dtype=np.float32):
        self.k = Rows(dtype)

    @property
    def n(self) -> int:
        return self.k.n

    def append(self, k: np.ndarray, fixed: bool = False) -> np.ndarray:
        """k [T, di] -> every position's keys [S, di] (fixed: S = the capacity, `Rows`)."""
        return self.k.append(k, fixed)


@state_container
@dataclass
class DSAState:
    """A DSA layer: its MLA cache (`LatentKV` absorbed or `KVCache` naive) and its indexer's state (`IndexerKeys`, or
    the k-pool indexer's `KPoolKeys`); a layer that reuses an earlier layer's selection (glm-dsa's and glm5-next's
    shared indexer layers) has `index = None`."""
    kv: object
    index: object = None

    @property
    def n(self) -> int:
        return self.kv.n

    @property
    def form(self) -> str:
        """The MLA form this layer runs: its cache's."""
        return self.kv.form


@state_container
@dataclass
class RecurrentState:
    """Linear attention's state: the short conv's last inputs and the delta-rule matrix (fixed size), and the
    form of the delta rule this sequence runs: "recurrent" (llama.cpp's fused kernel) or "chunked"."""
    conv: np.ndarray | None = None        # [n_conv - 1, channels]
    ssm: np.ndarray | None = None         # [H, K, V]
    form: str = "recurrent"


@state_container
class WindowKV:
    """The raw keys of a sliding-window layer (DeepSeek-V4: K = V, one head): the last `n_keep` positions only.

    `extend(k, pos)` returns every key a query of this call may see (the kept ones, then the new ones) and their
    positions; `trim(n_keep)` then drops what no later query can see (llama.cpp's SWA cache keeps more cells and
    masks them; the visible set is the same)."""

    def __init__(self, dtype=np.float32):
        self.k = np.zeros((0, 0), dtype=dtype)           # [S, K]
        self.pos = np.zeros(0, dtype=np.int64)           # [S]
        self.rows: Rows | None = None                    # a fixed-shape run's: every position's key, row = position

    @property
    def n(self) -> int:
        return int(self.pos.size)

    def extend(self, k: np.ndarray, pos: np.ndarray, fixed: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """k [T, K], pos [T] -> keys [S + T, K], positions [S + T].
        fixed: a fixed-shape run from the sequence start: every key kept (`Rows`, fixed appends: S = the capacity,
        row s the key of position s; the window mask hides the rest) and `trim` keeps them."""
        if fixed:
            if self.rows is None:
                assert self.pos.size == 0, "a fixed-shape run keeps every key from position 0"
                self.rows = Rows(self.k.dtype)
            keys = self.rows.append(k, fixed=True)                                   # [cap, K]
            return keys, np.arange(keys.shape[0], like=k)
        keys = k if self.k.size == 0 else np.concatenate([self.k, k])
        kpos = np.concatenate([self.pos, pos.astype(np.int64, copy=False)])   # (where pos lives: no read-back)
        self.k, self.pos = keys, kpos
        return keys, kpos

    def trim(self, n_keep: int) -> None:
        if self.rows is None:
            self.k, self.pos = self.k[-n_keep:], self.pos[-n_keep:]


@state_container
class BlockFill:
    """A KV compressor's input rows not yet pooled: the projected values kv [n, W] and gate scores [n, W] of
    consecutive positions `start .. start + n - 1` (the block being filled, and for the overlapping compressor
    the finished block before it). llama.cpp keeps them in an f32 state of 2*ratio (ratio 4) or ratio (128)
    rows per layer (`llama_dsv4_comp_state`, src/llama-kv-cache-dsv4.cpp)."""

    def __init__(self):
        self.kv: np.ndarray | None = None                # [n, W]
        self.score: np.ndarray | None = None             # [n, W]
        self.start = 0                                   # position of row 0

    def extend(self, kv: np.ndarray, score: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """Append the rows of the next positions; returns all rows held [n, W] x2 and the first one's position."""
        if self.kv is not None:
            kv, score = np.concatenate([self.kv, kv]), np.concatenate([self.score, score])
        self.kv, self.score = kv, score
        return kv, score, self.start

    def keep_from(self, p: int) -> None:
        """Drop the rows before position p."""
        cut = max(0, p - self.start)
        self.kv, self.score = self.kv[cut:], self.score[cut:]
        self.start += cut


@state_container
class PooledBlocks(Rows):
    """One pooled (compressed) key per finished block, in block order: [n_blocks, K] (`Rows`)."""


@state_container
class CompressorRows:
    """A KV compressor's state in a fixed-shape run (`Runtime.fixed_shapes`), row = position (`Rows`, fixed
    appends): every position's projected rows (kv, score [S, c*K]) and, at position p, the pooled key of p's block
    as of p (ck [S, K]: complete, and so the block's key, at the block's last position b*r + r - 1)."""

    def __init__(self, dtype=np.float32):
        self.kv, self.score, self.ck = Rows(dtype), Rows(dtype), Rows(dtype)


@dataclass
@state_container
class CompressedKV:
    """DeepSeek-V4's attention state for one layer of compression ratio 0, 4 or 128: the raw window, and for
    ratio != 0 the pooled blocks and the block being filled; ratio 4 adds the lightning indexer's pooled keys
    and its own block being filled."""
    ratio: int
    window: WindowKV = field(default_factory=WindowKV)
    blocks: PooledBlocks | None = None
    fill: BlockFill | None = None
    index_keys: PooledBlocks | None = None
    index_fill: BlockFill | None = None
    n: int = 0                                           # positions seen
    fixed_rows: CompressorRows | None = None             # a fixed-shape run's compressor state (in place of the
    index_rows: CompressorRows | None = None             # pooled blocks and block fill), and the indexer's


@state_container
@dataclass
class QSAState:
    """A QSA layer (Qwen3.8-Flash-Next's full attention): its KV cache and the indexer's raw per-token keys, pooled
    into blocks again at every call (llama.cpp's "idx" cache, src/llama-memory-hybrid-idx.cpp)."""
    kv: KVCache
    index: IndexerKeys

    @property
    def n(self) -> int:
        return self.kv.n

    form = None                            # one form


@state_container
@dataclass
class NGramState:
    """The n-gram embeddings' carried state: the token ids the next call's hash reads back (at most N-1, oldest
    first; none at the sequence start) and the dilated conv's last (Kc-1)*N inputs [(Kc-1)*N, P*D] (None: zeros)."""
    tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    conv: np.ndarray | None = None


@state_container
@dataclass
class WithNGram:
    """A layer that also carries the n-gram embeddings' state (the PLE layer): `attn` is its attention's
    container (its form is the layer's), `ngram` the NGramState."""
    attn: object
    ngram: NGramState

    @property
    def form(self):
        return self.attn.form


@state_container
class KPoolKeys:
    """The k-pool indexer's state (GLM-5.3-Flash): every position's projected key and gate rows (k, g [S, di]) and
    one pooled key per finished pool of `kpool` positions (pooled [n_pools, di]). llama.cpp keeps key | gate | pooled
    in one f32 row per position of its indexer cache (src/llama-memory-hybrid-idx.cpp:57, the pooled key in the row
    of the pool's last member). A fixed-shape run (`Runtime.fixed_shapes`) keeps the pooled keys that way, in `pk`
    [S, di] (row p: p's pool as of p, so the key of a finished pool sits in the row of its last member), and
    `pooled` catches up from the rows when an ordinary run continues the sequence (and `pk` in the other case)."""

    def __init__(self, dtype=np.float32):
        self.k, self.g = Rows(dtype), Rows(dtype)        # [S, di] each
        self.pooled = Rows(dtype)                        # [n_pools, di]   an ordinary run's
        self.pk = Rows(dtype)                            # [S, di]         a fixed-shape run's

    @property
    def n(self) -> int:
        """Positions seen."""
        return self.k.n


@dataclass
class ModelState:
    """Everything a sequence carries: positions seen and one container per layer (a state file's root: saved and
    restored like a registered container; `home` not saved)."""
    layers: list = field(default_factory=list)
    n_past: int = 0
    home: object = field(default=None, repr=False, compare=False)   # weakref to the resident Device whose ops ran
    #                                       it last (Model.run_step re-homes its arrays when another Runtime's runs it)

    def nbytes(self) -> int:
        """Bytes of every cached array (used rows only): the cache cost per sequence."""
        def size(st) -> int:
            total = 0
            for v in vars(st).values():
                if isinstance(v, Rows):
                    total += 0 if v.view() is None else v.view().nbytes
                elif isinstance(v, np.ndarray) or type(v).__name__ == "DeviceArray":    # (a resident run's)
                    total += v.nbytes
                elif v is not None and hasattr(v, "__dict__"):      # a container inside a container (DSAState)
                    total += size(v)
            return total
        return sum(size(st) for st in self.layers)
