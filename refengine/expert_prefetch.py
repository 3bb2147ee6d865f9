"""Prefetch of the next MoE layer's likely experts (issue 24): speculative routing, copies on a worker thread.

Legend: T tokens, D model dim, E experts of a layer, A active experts per token.

A decode step is host-bound (Python runs the layers), and a miss of the expert cache is a synchronous copy from the
mmapped file in that same thread. Here the copies of the experts the next MoE layer is likely to use run in a
worker thread instead, while the main thread works through the layers in between:

    h [T, D]          the router input of MoE layer il (`Runtime.matmul` of `blk.{il}.ffn_gate_inp.weight` calls
                      `on_router_input`)
    logits2 [T, E]  = h @ ffn_gate_inp(il2).T        il2 = the next MoE layer with a router: its router applied to
                                                      layer il's input (speculative routing: the residual stream
                                                      changes little from one layer to the next)
    sel             = logits2, or sigmoid(logits2) + exp_probs_b(il2) where the layer has that bias
    guess           = the union over tokens of top-A(sel) [T, A], the experts most tokens chose first; A = the
                      width of il2's last batch (no guess before il2's first lookup)
    cache.prefetch(il2, guess, copy, submit, after=il)
                      issued at the end of layer il's lookup (its own batch pinned, so the guess never evicts what
                      il is about to use); the slots are taken then, in the main thread, and `copy` fills them on
                      the worker; il2's lookup waits for the copy only if it uses such a slot (or needs its room)

The product runs on the runtime's backend (`Runtime.side_product`: on a GPU a device product of the resident h, and
one small read of the [T, E] logits), outside the model's computation (no trace, no teacher forcing, no NaN check,
and no hook: it cannot prefetch in turn). Hash-routed layers (`ffn_gate_tid2eid`: experts chosen by token id) are
never guessed; their router input still predicts the layer after them.

On a GPU the copies are `copy_to_device` on numba's default stream, the stream of the kernels: a copy into a slot
is queued after the kernels already launched that read it, and the main thread launches the kernels that read a
prefetched slot only after waiting for its copy. The results are the same bits with or without prefetch (the same
kernels read the same bytes): only where the experts sit and when they are copied changes.
"""
from __future__ import annotations

import bisect
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .moe.router import topk_desc


class Prefetcher:
    """The speculative router of every MoE layer of `model` (module docstring) feeding `cache.prefetch`; one worker
    thread (made at the first prefetch; `close()`, or the interpreter's exit, ends it)."""

    def __init__(self, model, cache):
        self.model, self.cache = model, cache
        self.routers: dict[int, tuple] = {}      # il -> (ffn_gate_inp [E, D], exp_probs_b [E] or None): the guessed
        self.sources: dict[str, int] = {}        # router weight name -> il: every routed layer's input guesses
        for il in range(model.cfg.n_layer):
            w = model.layer(il)
            r = getattr(w, "ffn_gate_inp", None)
            if r is None or getattr(w, "ffn_down_exps", None) is None:       # no routed experts in this layer
                continue
            self.sources[r.name] = il
            if getattr(w, "ffn_gate_tid2eid", None) is not None:
                continue                         # hash routing: the token id chooses, no router to guess with
            b = getattr(w, "exp_probs_b", None)
            self.routers[il] = (r, None if b is None else np.asarray(b, dtype=np.float32))
        self.order = sorted(self.routers)
        self._tensors: dict[int, dict] = {}
        self._pool = None
        self.guesses = 0                         # predictions made (router inputs seen with a layer to guess)

    def next_layer(self, il: int) -> int | None:
        """The next MoE layer after il with a router to guess by, or None."""
        i = bisect.bisect_right(self.order, il)
        return self.order[i] if i < len(self.order) else None

    def tensors(self, il: int) -> dict:
        """Layer il's routed experts as the runtime passes them to moe_ffn (role -> QTensor [E, O, I] or None; a
        fused gate_up as its two halves, moe/block.py `split_gate_up`): what `cached_experts` would copy."""
        if il not in self._tensors:
            w = self.model.layer(il)
            if getattr(w, "ffn_gate_up_exps", None) is not None:
                from .moe.block import split_gate_up
                gate, up = split_gate_up(w)
            else:
                gate, up = getattr(w, "ffn_gate_exps", None), w.ffn_up_exps
            self._tensors[il] = {"gate": gate, "up": up, "down": w.ffn_down_exps}
        return self._tensors[il]

    def guess(self, il2: int, logits: np.ndarray, A: int) -> np.ndarray:
        """logits [T, E] of layer il2's router -> the distinct experts of the tokens' top-A, most votes first."""
        r, b = self.routers[il2]
        if b is None:
            sel = logits                                                             # [T, E]
        else:
            with np.errstate(over="ignore"):
                sel = np.float32(1) / (np.float32(1) + np.exp(-logits)) + b          # [T, E]
        top = topk_desc(sel, min(A, sel.shape[-1]))                                  # [T, A]
        votes = np.bincount(top.reshape(-1), minlength=sel.shape[-1])                # [E]
        chosen = np.flatnonzero(votes)
        return chosen[np.argsort(-votes[chosen], kind="stable")]

    def on_router_input(self, il: int, x, rt) -> int:
        """x [T, D]: the input of layer il's router (host or device). Guesses the next MoE layer's experts and queues
        their prefetch after layer il's lookup; returns the number guessed (0: nothing to guess yet)."""
        il2 = self.next_layer(il)
        A = self.cache.width.get(il2)
        if il2 is None or A is None:
            return 0
        r, _ = self.routers[il2]
        if x.shape[-1] != r.shape[-1]:
            return 0
        logits = np.asarray(rt.side_product(x, r), dtype=np.float32)               # [T, E] on the host
        experts = self.guess(il2, logits, A)
        tensors = self.tensors(il2)
        cache = self.cache

        def copy(slot, expert):                  # the worker thread: the pool's uncounted copy (wait() counts)
            return cache.pool.copy(slot, tensors, expert)
        cache.prefetch(il2, experts, copy, self.submit, after=il)
        self.guesses += 1
        return int(experts.size)

    def submit(self, fn):
        """fn run on the worker thread: a concurrent.futures.Future."""
        if self._pool is None:                   # (its thread is joined at the interpreter's exit by the module)
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="expert-prefetch")
        return self._pool.submit(fn)

    def close(self) -> None:
        """Waits for the copies in flight (their errors raised), then ends the worker thread."""
        try:
            self.cache.wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
