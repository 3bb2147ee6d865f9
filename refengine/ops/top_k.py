"""`ggml_top_k` as llama.cpp's CPU backend selects: which k indices win when scores tie.

A top-k set is the k largest scores; where the k-th and (k+1)-th scores are equal the set is a choice. The CPU
op (`ggml_compute_forward_top_k_f32`, ggml/src/ggml-cpu/ops.cpp:8786-8823) makes it with
`std::partial_sort(idx, idx + k, idx + n, data[a] > data[b])`, which the GNU C++ library runs as a heap select:
a heap of the first k indices (the smallest score on top), then every later index whose score is strictly larger
than the top replaces it. `heap_select` follows those steps (make_heap / adjust_heap / push_heap / pop_heap, as
the algorithm is specified), so exact ties resolve as llama.cpp's do. Exact ties are common where scores are
sums of ReLUs (the k-pool indexer: a pool every head scores below zero has score 0 exactly).
The order of the returned set is not llama.cpp's (it sorts, or swaps, afterwards); only the set is.
"""
from __future__ import annotations

import numpy as np


def ggml_top_k_rows(score: np.ndarray, n: np.ndarray, k: int, clean_stable: bool = False) -> np.ndarray:
    """Rows of `ggml_top_k` on a padded axis, each ordered by descending score: score [T, N] float32, n [1] int (the
    axis llama.cpp sorts over: entries j >= N of it score -inf, entries past n are not in it), k the most kept ->
    [T, k] int32: per row `sorted(ggml_top_k(row, min(k, n)), key=-score)` (a stable sort: tied scores in the heap's
    order), -1 past min(k, n). clean_stable: a row whose k-th score is not tied by a score outside the set (or is
    -inf, or whose set is the whole axis) is ordered with ties by index instead (np.argsort(-row, kind="stable"):
    the same set; the order the k-pool indexer's `select` gives a call of more than 16 tokens, where llama.cpp does
    not read the order). The statement of a GPU kernel (refengine/cuda/fused.py `ggml_top_k_rows`, one thread a
    row: the same steps), reached through `ops.arrays.row_kernel` with n on the device (the k-pool indexer's
    selection on a device: its padded pool count is made from the step's positions there)."""
    score = np.asarray(score, dtype=np.float32)
    T, N = score.shape
    L = int(np.asarray(n).reshape(-1)[0])
    kk = min(k, L)
    row = np.full(L, -np.inf, dtype=np.float32)
    out = np.full((T, k), -1, dtype=np.int32)
    for t in range(T):
        row[:min(L, N)] = score[t, :L]
        top = sorted(ggml_top_k(row, kk), key=lambda i: -row[i])
        if clean_stable and kk and (kk >= L or row[top[-1]] == -np.inf or np.sum(row >= row[top[-1]]) == kk):
            top = sorted(top, key=lambda i: (-row[i], i))
        out[t, :kk] = top
    return out


def heap_select(scores: np.ndarray, k: int) -> list[int]:
    """scores [n] -> the k indices std::partial_sort(.., greater) leaves in front (as a set; heap order)."""
    return _partial_sort(scores, k, sort=False)


def ggml_top_k(scores: np.ndarray, k: int) -> list[int]:
    """scores [n] -> the k indices in the order llama.cpp's CPU `ggml_top_k` writes them: partial_sort's (heap
    select, then sort_heap: descending, ties as the heap leaves them), entries 0 and 1 swapped (ops.cpp:8818-8821)."""
    out = _partial_sort(scores, k, sort=True)
    if len(out) > 1:
        out[0], out[1] = out[1], out[0]
    return out


def _partial_sort(scores: np.ndarray, k: int, *, sort: bool) -> list[int]:
    s = [float(x) for x in scores]
    n = len(s)
    k = min(k, n)
    first = list(range(n))

    def comp(a: int, b: int) -> bool:        # the heap's "less": a higher score ranks lower in the heap
        return s[a] > s[b]

    def push_heap(hole: int, top: int, value: int) -> None:
        parent = (hole - 1) // 2
        while hole > top and comp(first[parent], value):
            first[hole] = first[parent]
            hole = parent
            parent = (hole - 1) // 2
        first[hole] = value

    def adjust_heap(hole: int, length: int, value: int) -> None:
        top = second = hole
        while second < (length - 1) // 2:
            second = 2 * (second + 1)
            if comp(first[second], first[second - 1]):
                second -= 1
            first[hole] = first[second]
            hole = second
        if length % 2 == 0 and second == (length - 2) // 2:
            second = 2 * (second + 1)
            first[hole] = first[second - 1]
            hole = second - 1
        push_heap(hole, top, value)

    if k >= 2:                                # make_heap(first, first + k)
        parent = (k - 2) // 2
        while True:
            adjust_heap(parent, k, first[parent])
            if parent == 0:
                break
            parent -= 1
    for i in range(k, n):                     # heap select: replace the top with any strictly better index
        if comp(first[i], first[0]):
            value = first[i]
            first[i] = first[0]
            adjust_heap(0, k, value)
    if sort:                                  # sort_heap(first, first + k): pop the top to the back, k - 1 times
        for last in range(k - 1, 0, -1):
            value = first[last]
            first[last] = first[0]
            adjust_heap(0, last, value)
    return first[:k]
