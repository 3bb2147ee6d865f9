"""The whole forward pass on the GPU for `llama` and `qwen3moe`: activations never leave the device.

    dm = DeviceModel(model)                 # checks the arch and the layers' tensors; uploads nothing
    logits = dm.forward(tokens, state)      # same contract as Model.forward (state: ModelState)

Per layer (Legend: T tokens, D model dim, H/Hkv heads, K head dim, E experts, A active):

    h    = rms_norm(x) * attn_norm                        rms_norm_kernel (first layer; later: fused below)
    qkv  = h @ [Wq; Wk; Wv].T                              one GEMV/GEMM (q, k, v rows side by side)
    q, k = rope(norm(q)), rope(norm(k)); cache <- k, v     qk_rope_kernel
    o    = attention(q, cache)                             attention_kernel (prefill: attention_gqa_kernel)
    x    = x + o @ Wo.T;  h = rms_norm(x) * ffn_norm       GEMV + add_rms_norm_kernel
    moe:   ids, w = softmax_topk(h @ Wr.T)                 GEMV + route_kernel + bucket_kernel
           x = x + sum_a w_a down_e(silu(gate_e h) up_e h) grouped GLU, grouped down,
           h = rms_norm(x) * next norm                     combine + the next layer's attn_norm (or the
    dense: x = x + down(silu(gate h) * up h)               GLU GEMV, GEMV,  output norm): add_rms_norm_kernel

Weights are uploaded packed when a layer first runs (all experts: routing happens on the device).
The KV cache lives on the device beside the host `ModelState` (`state.device`); the position of the
first new token is a device scalar, so the launches of one decode step are captured once as a CUDA
graph and replayed for every later token (`graphs=True`). Used by `Runtime(backend="cuda")` when no
trace is recorded; the traced path runs the same kernels op by op from the NumPy block code.
"""
from __future__ import annotations

import numpy as np

import quant.cuda  # noqa: F401  (numpy shim before numba)
from numba import cuda

from quant import QTensor
from quant.cuda.gemv import GroupTable, dense_groups
from quant.cuda.moe import BN, EW, bucket_kernel, moe_ffn_device, one_token_ok
from quant.cuda.ops import NT_MAX, dense, grouped, supported
from quant.cuda.weights import device_weight

from ..config import ROPE_NEOX, ROPE_NORM
from ..errors import ConfigError
from quant.cuda.timing import Graph, Spinner

from . import attn
from .fused import swiglu_raw
from .kernels import (ATT_K, GQA_MIN_T, MAX_E, MAX_S, NORM_BLOCK, add_rms_norm_kernel, attention_gqa_kernel, attention_kernel,
                      gqa_fits, qk_rope_kernel, rms_norm_kernel, route_kernel)

TC_ATTENTION = not quant.cuda.SIM          # DeviceModel's default: prefill attention on the tensor cores (attn.py);
                                           # the simulator (an emulation there, slow) takes attention_gqa_kernel
OPTIONAL = ("attn_q_bias", "attn_k_bias", "attn_v_bias", "attn_qkv_bias", "attn_output_bias", "attn_q_scale",
            "attn_k_scale", "attn_v_scale", "attn_qkv_scale", "attn_output_scale", "ffn_gate_bias", "ffn_up_bias",
            "ffn_down_bias", "ffn_gate_scale", "ffn_up_scale", "ffn_down_scale")


def unsupported(model) -> str | None:
    """Why `model` cannot run on the device path (None when it can)."""
    cfg = model.cfg
    if not model.arch.DEVICE_PATH:
        return f"architecture {model.arch.ARCH} (its embed / residual / head are not the device path's)"
    for il, spec in enumerate(cfg.layers):           # the layer kinds the device kernels implement
        if spec.attn != "mha" or spec.ffn not in ("dense", "moe"):
            return f"layer {il}: {spec.attn} attention / {spec.ffn} feed-forward"
        mc = spec.moe
        if mc is not None and (mc.gating != "softmax" or not mc.norm_w or mc.w_scale not in (0.0, 1.0)
                               or mc.n_shared or mc.n_groups > 1):
            return f"layer {il}: routing {mc.gating} (norm {mc.norm_w}, scale {mc.w_scale}, groups {mc.n_groups}, shared {mc.n_shared})"
    if cfg.rope_type not in (ROPE_NORM, ROPE_NEOX):
        return f"rope type {cfg.rope_type}"
    if model.n_ctx > MAX_S:
        return f"n_ctx {model.n_ctx} > {MAX_S}"
    if cfg.n_expert > MAX_E:
        return f"{cfg.n_expert} experts > {MAX_E}"
    if cfg.head_dim_k > ATT_K or cfg.head_dim_k % 4:
        return f"head dim {cfg.head_dim_k}"
    if not supported(model.g.output):
        return f"output type {model.g.output.type.name}"
    for il in range(cfg.n_layer):
        w = model.layer(il)
        if getattr(w, "ffn_gate_up_exps", None) is not None or getattr(w, "exp_probs_b", None) is not None:
            return f"layer {il}: fused ffn_gate_up_exps / exp_probs_b"
        for f in OPTIONAL:
            if getattr(w, f, None) is not None:
                return f"layer {il}: optional tensor {f}"
        for f in ("attn_q", "attn_k", "attn_v", "attn_qkv", "attn_output", "ffn_gate", "ffn_up", "ffn_down",
                  "ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"):
            t = getattr(w, f, None)
            if t is not None and not supported(t):
                return f"layer {il}: {f} of type {t.type.name}"
    return None


def _vec(a) -> object:
    return cuda.to_device(np.ascontiguousarray(a, dtype=np.float32))


class DeviceLayer:
    """One block's weights on the device (packed matrices, float32 vectors)."""

    def __init__(self, w, cfg, il: int, stream):
        spec = cfg.layers[il]
        self.spec = spec
        self.attn_norm = _vec(w.attn_norm)
        self.ffn_norm = _vec(w.ffn_norm)
        self.q_norm = _vec(w.attn_q_norm) if getattr(w, "attn_q_norm", None) is not None else None
        self.k_norm = _vec(w.attn_k_norm) if getattr(w, "attn_k_norm", None) is not None else None
        if getattr(w, "attn_qkv", None) is not None:
            self._qkv_host = w.attn_qkv
        else:
            self._qkv_host = self._concat([w.attn_q, w.attn_k, w.attn_v])
        self.qkv = device_weight(self._qkv_host).ensure(stream=stream)
        self.o = device_weight(w.attn_output).ensure(stream=stream)
        self.moe = spec.ffn == "moe"
        if self.moe:
            self.router = device_weight(w.ffn_gate_inp).ensure(stream=stream)
            self.up = device_weight(w.ffn_up_exps).ensure(stream=stream)
            self.gate = device_weight(w.ffn_gate_exps).ensure(stream=stream) if w.ffn_gate_exps is not None else None
            self.down = device_weight(w.ffn_down_exps).ensure(stream=stream)
            E = cfg.n_expert
            ones = np.ones(E, np.float32)
            gs = w.ffn_gate_exps_scale if w.ffn_gate_exps_scale is not None else ones
            us = w.ffn_up_exps_scale if w.ffn_up_exps_scale is not None else ones
            ds = w.ffn_down_exps_scale if w.ffn_down_exps_scale is not None else ones
            self.sc_gu = _vec(np.concatenate([gs, us]))
            self.sc_d = _vec(ds)
        else:
            self.up = device_weight(w.ffn_up).ensure(stream=stream)
            self.gate = device_weight(w.ffn_gate).ensure(stream=stream)
            self.down = device_weight(w.ffn_down).ensure(stream=stream)
            self.sc_gu = _vec(np.ones(2, np.float32))
            self.sc_d = _vec(np.ones(1, np.float32))

    @staticmethod
    def _concat(ts: list[QTensor]) -> QTensor:
        """q, k, v rows side by side in one packed tensor (one launch instead of three). Same type needed."""
        if len({t.type for t in ts}) != 1:
            raise ConfigError("device path: attn_q / attn_k / attn_v of different types")
        raw = np.concatenate([np.asarray(t.raw) for t in ts], axis=0)
        return QTensor.from_raw(ts[0].name.replace("attn_q", "attn_qkv"), ts[0].type,
                                (sum(t.shape[0] for t in ts), ts[0].shape[1]), raw)


class DeviceState:
    """Device KV cache of every layer and the position scalar."""

    def __init__(self, cfg, n_ctx: int, stream):
        self.kc, self.vc, self.vt = [], [], []
        s_pad = attn.cols(n_ctx)
        for il in range(cfg.n_layer):
            Hkv = cfg.layers[il].n_head_kv
            self.kc.append(cuda.device_array((n_ctx, Hkv, cfg.head_dim_k), np.float32, stream=stream))
            self.vc.append(cuda.device_array((n_ctx, Hkv, cfg.head_dim_v), np.float32, stream=stream))
            # the value cache transposed (prefill attention on the tensor cores): zeros past the written rows
            self.vt.append(cuda.to_device(np.zeros((Hkv, cfg.head_dim_v, s_pad), np.float32), stream=stream))
        self.pos = cuda.device_array(1, np.int32, stream=stream)

    def host_state(self, model, state):
        """A host ModelState holding this device cache's first state.n_past rows per layer (a KVCache each, as the
        NumPy path fills them): what a state file saves. `state` itself is left as it is."""
        n = state.n_past
        host = model.new_state()
        for il, kv in enumerate(host.layers):
            if n:
                kv.append(self.kc[il][:n].copy_to_host(), self.vc[il][:n].copy_to_host())
        host.n_past = n
        return host

    def upload(self, state, stream) -> None:
        """Fill this (fresh) device cache with a host state's rows: one loaded from a state file, or run so far
        on another backend. Every layer must be a KVCache holding state.n_past rows."""
        n = state.n_past
        for il, kv in enumerate(state.layers):
            if getattr(kv, "n", None) != n or kv.k.view() is None:
                raise ConfigError(f"the cuda device path continues a host state only where every layer is a KV "
                                  f"cache of n_past = {n} rows (layer {il}: {type(kv).__name__})")
            k, v = kv.k.view(), kv.v.view()                       # [n, Hkv, K], [n, Hkv, V]
            self.kc[il][:n].copy_to_device(np.ascontiguousarray(k, dtype=np.float32), stream=stream)
            self.vc[il][:n].copy_to_device(np.ascontiguousarray(v, dtype=np.float32), stream=stream)
            vt = np.zeros(self.vt[il].shape, np.float32)          # [Hkv, V, S_pad], zeros past the rows
            vt[:, :, :n] = v.transpose(1, 2, 0)                   # [n, Hkv, V] -> [Hkv, V, n]
            self.vt[il].copy_to_device(vt, stream=stream)


class DeviceModel:
    def __init__(self, model, *, graphs: bool | None = None, n_layer: int | None = None,
                 tc_attention: bool | None = None, gqa_min_t: int = GQA_MIN_T, split_ffn_min_t: int = NT_MAX + 1):
        """graphs: capture decode steps as CUDA graphs (default on a GPU); n_layer: run only the first
        n_layer blocks, then the output head (benchmarks: per-layer cost by difference).
        Prefill attention from gqa_min_t new tokens on: on the tensor cores where tc_attention (default
        TC_ATTENTION: on a GPU) and the sizes fit, else the per-KV-head kernel; below it, attention_kernel.
        A dense FFN of split_ffn_min_t tokens or more: gate and up as two `dense` products (the tensor cores on a
        GPU), then SwiGLU; fewer: gate and up in one launch of the GEMV kernels (a decode step's). (The one-launch
        pair is a GEMV of 8-token tiles whatever T: at a prompt's 512 tokens it ran llama-3-8b's 4-block prefill
        at 8.5x llama.cpp's time, session 33.)"""
        why = unsupported(model)
        if why is not None:
            raise ConfigError(f"{model.path}: the cuda device path does not support {why}")
        self.model = model
        self.cfg = model.cfg
        self.stream = cuda.stream()
        self.n_layer = self.cfg.n_layer if n_layer is None else int(n_layer)
        self.layers: list[DeviceLayer | None] = [None] * self.cfg.n_layer
        self.out_norm = _vec(model.g.output_norm)
        self.output = device_weight(model.g.output).ensure(stream=self.stream)
        self.out_scale = None if model.g.output_scale is None else float(np.asarray(model.g.output_scale).reshape(-1)[0])
        self.bufs: dict[int, dict] = {}
        self.graphs_on = (not quant.cuda.SIM) if graphs is None else graphs      # the simulator has no graphs
        self.tc_attention = TC_ATTENTION if tc_attention is None else bool(tc_attention)
        self.gqa_min_t = int(gqa_min_t)
        self.split_ffn_min_t = int(split_ffn_min_t)
        self.graphs: dict[int, object] = {}
        self.n_replays = 0
        self._marks = None                     # [(stage name, event)] while profiling
        self._ev = (cuda.event(), cuda.event())
        self.last_gpu_us = None                # GPU time of the last forward's launches (events)
        self._spin = None
        self._s_end = 0

    def layer(self, il: int) -> DeviceLayer:
        if self.layers[il] is None:
            self.layers[il] = DeviceLayer(self.model.layer(il), self.cfg, il, self.stream)
        return self.layers[il]

    # ------------------------------------------------------------ buffers (fixed per T: graph-safe)
    def _buffers(self, T: int) -> dict:
        if T in self.bufs:
            return self.bufs[T]
        cfg, s = self.cfg, self.stream
        D, K = cfg.n_embd, cfg.head_dim_k
        H = max(sp.n_head for sp in cfg.layers)
        Hkv = max(sp.n_head_kv for sp in cfg.layers)
        A = max([sp.n_expert_used for sp in cfg.layers] + [1])
        E = max(cfg.n_expert, 1)

        def z(*shape, dt=np.float32):
            return cuda.device_array(shape, dt, stream=s)
        b = dict(x=z(T, D), xo=z(T, D), x2=z(T, D), h=z(T, D), qkv=z(T, (H + 2 * Hkv) * K), q=z(T, H, K), att=z(T, H * K),
                 a=z(T, D), cos=z(T, cfg.n_rot // 2), sin=z(T, cfg.n_rot // 2), logits=z(T, cfg.n_vocab),
                 rlog=z(T, E), ids=z(T, A, dt=np.int32), wts=z(T * A), scratch={})
        gmax = min(E, T * A)
        n = T * A
        b["tab_x"] = z(GroupTable.size(gmax, n, BN), dt=np.int32)
        b["tab_p"] = z(GroupTable.size(gmax, n, BN), dt=np.int32)
        b["cnt"] = z(E, dt=np.int32)
        b["fill"] = z(E, dt=np.int32)
        b["dense_grp"] = cuda.to_device(dense_groups(T, BN), stream=s)
        self.bufs[T] = b
        return b

    # ------------------------------------------------------------ one layer, device arrays only
    def _layer(self, il: int, T: int, b: dict, st: DeviceState, x, xo, normed: bool, next_norm, last_row=None):
        """x [T, D] -> xo [T, D] for layer il (all launches on self.stream); then b['h'] = rms_norm(xo) *
        next_norm. normed: b['h'] already holds rms_norm(x) * attn_norm (the previous layer made it). last_row:
        the one-token buffers (`_buffers(1)`) to run the FFN half on the last row alone, into their xo and h (a
        prompt's last layer when only the next token is wanted: llama.cpp's inp_out_ids)."""
        cfg, s = self.cfg, self.stream
        L = self.layer(il)
        sp = L.spec
        H, Hkv, K = sp.n_head, sp.n_head_kv, cfg.head_dim_k
        h, qkv, q, att, a, x2 = b["h"], b["qkv"], b["q"], b["att"], b["a"], b["x2"]
        if not normed:
            self._mark("attn_norm")
            rms_norm_kernel[T, NORM_BLOCK, s](x, L.attn_norm, cfg.rms_eps, h)
        self._mark("qkv")
        qkv_v = qkv[:, :(H + 2 * Hkv) * K] if qkv.shape[1] != (H + 2 * Hkv) * K else qkv
        dense(L.qkv, h, qkv_v, stream=s)
        qn = L.q_norm if L.q_norm is not None else L.attn_norm
        kn = L.k_norm if L.k_norm is not None else L.attn_norm
        qv = q if q.shape[1] == H else q[:, :H, :]
        self._mark("qk_norm_rope")
        qk_rope_kernel[(T, H + 2 * Hkv), K, s](qkv_v, H, Hkv, K, qn, kn, L.q_norm is not None, cfg.rms_eps,
                                               b["cos"], b["sin"], cfg.n_rot, cfg.rope_type == ROPE_NEOX,
                                               st.pos, st.kc[il], st.vc[il], st.vt[il], qv)
        attv = att if att.shape[1] == H * K else att[:, :H * K]
        self._mark("attention")
        G = H // Hkv
        Kv = st.vt[il].shape[1]
        if (T >= self.gqa_min_t and self.tc_attention and H % Hkv == 0 and qv.is_c_contiguous() and attv.is_c_contiguous()
                and attn.fits(T, H, K, Kv, self._s_end)):                         # prefill: on the tensor cores
            sc = b.get(("scores", H))
            if sc is None or sc.shape[1] < attn.cols(self._s_end):
                sc = b[("scores", H)] = cuda.device_array((T * H, attn.cols(self._s_end)), np.float32, stream=s)
            grp = b.get(("head_grp", H, G))
            if grp is None:
                grp = b[("head_grp", H, G)] = cuda.to_device(attn.head_groups(T, H, G), stream=s)
            attn.attention_tc(qv, st.kc[il], st.vt[il], st.pos, self._s_end - T, 1.0 / np.sqrt(K), sc, attv, grp, s)
        elif T >= self.gqa_min_t and H % Hkv == 0 and gqa_fits(G, self._s_end, K):      # prefill: KV rows read once per G heads
            attention_gqa_kernel(G)[(Hkv, T), 256, s](qv, st.kc[il], st.vc[il], st.pos, 1.0 / np.sqrt(K), attv)
        else:
            attention_kernel[(H, T), 128, s](qv, st.kc[il], st.vc[il], st.pos, 1.0 / np.sqrt(K), attv)
        self._mark("attn_output")
        dense(L.o, attv, a, stream=s)
        self._mark("residual_ffn_norm")
        add_rms_norm_kernel[T, NORM_BLOCK, s](a, 1, x, True, L.ffn_norm, cfg.rms_eps, x2, h)     # ffn_inp, its norm
        if last_row is not None:                          # the FFN half on the last row alone
            last_row["x2"].copy_to_device(x2[T - 1:], stream=s)
            last_row["h"].copy_to_device(h[T - 1:], stream=s)
            self._ffn(L, 1, last_row, last_row["x2"], last_row["xo"], last_row["h"], next_norm)
        else:
            self._ffn(L, T, b, x2, xo, h, next_norm)

    def _ffn(self, L, T: int, b: dict, x2, xo, h, next_norm):
        """The FFN half of a layer on T rows: xo = x2 + FFN(h); then h = rms_norm(xo) * next_norm."""
        cfg, s, sp = self.cfg, self.stream, L.spec
        if L.moe:
            A, E = sp.n_expert_used, cfg.n_expert
            self._mark("router")
            dense(L.router, h, b["rlog"], stream=s)
            ids = b["ids"] if b["ids"].shape[1] == A else b["ids"][:, :A]
            self._mark("route_topk")
            route_kernel(E)[T, 32, s](b["rlog"], A, True, ids, b["wts"])
            n = T * A
            gmax = min(E, n)
            one = None
            if T == 1 and one_token_ok(L.up, L.gate, L.down, h):               # one token: no grouping needed
                one = b["ids"][0, :A]
            else:
                self._mark("bucket")
                bucket_kernel[1, EW, s](b["ids"].reshape(T * b["ids"].shape[1]) if b["ids"].shape[1] == A else ids,
                                         E, A, n, BN, b["tab_x"], b["tab_p"], b["cnt"], b["fill"])
            moe_ffn_device(h, b["tab_x"], b["tab_p"], gmax, n, T, A, b["wts"], up=L.up, gate=L.gate, down=L.down,
                           sc_gu=L.sc_gu, sc_d=L.sc_d, res=x2, out=xo, scratch=b["scratch"], stream=s,
                           mark=self._mark, ids=one, combine=lambda dn, A_, r, o: add_rms_norm_kernel[T, NORM_BLOCK, s](
                               dn, A_, r if r is not None else o, r is not None, next_norm, cfg.rms_eps, o, h))
        else:
            self._mark("ffn")
            grp = b["dense_grp"]
            act = b["scratch"].get("dense_act")
            if act is None or act.shape != (T, L.up.O):
                act = b["scratch"]["dense_act"] = cuda.device_array((T, L.up.O), np.float32, stream=s)
            if T >= self.split_ffn_min_t:                 # a prompt: two dense products (tensor cores), SwiGLU
                gu = b["scratch"].get("dense_gu")
                if gu is None or gu.shape != (2, T, L.up.O):
                    gu = b["scratch"]["dense_gu"] = cuda.device_array((2, T, L.up.O), np.float32, stream=s)
                dense(L.gate, h, gu[0], stream=s)
                dense(L.up, h, gu[1], stream=s)
                n = T * L.up.O                             # the modules' SwiGLU kernel, on flat views
                swiglu_raw(gu[0].reshape(n), gu[1].reshape(n), act.reshape(n), stream=s)
            else:                                         # a decode step: gate and up in one GEMV launch
                grouped(L.gate, h, act, grp, 1, T, T, sc=L.sc_gu, up=L.up, stream=s)
            dn = b["scratch"].get("dense_dn")
            if dn is None or dn.shape != (T, cfg.n_embd):
                dn = b["scratch"]["dense_dn"] = cuda.device_array((T, cfg.n_embd), np.float32, stream=s)
            grouped(L.down, act, dn, grp, 1, T, T, stream=s)
            add_rms_norm_kernel[T, NORM_BLOCK, s](dn, 1, x2, True, next_norm, cfg.rms_eps, xo, h)

    def _steps(self, T: int, b: dict, st: DeviceState, last_only: bool = False) -> None:
        """Every launch of one forward of T tokens after the inputs are in b['x'], b['cos'], b['sin'], st.pos
        (last_only: the head on the last row alone)."""
        cur, nxt = b["x"], b["xo"]
        b1 = self._buffers(1) if last_only and T > 1 and self.n_layer else None     # the last row's FFN half, head
        for il in range(self.n_layer):
            nn = self.layer(il + 1).attn_norm if il + 1 < self.n_layer else self.out_norm
            self._layer(il, T, b, st, cur, nxt, il > 0, nn, last_row=b1 if il == self.n_layer - 1 else None)
            cur, nxt = nxt, cur
        self._mark("output")
        if self.n_layer == 0:
            rms_norm_kernel[T, NORM_BLOCK, self.stream](cur, self.out_norm, self.cfg.rms_eps, b["h"])
        if b1 is not None:
            dense(self.output, b1["h"], b1["logits"], stream=self.stream)
            return
        rows = slice(T - 1, T) if last_only else slice(0, T)
        dense(self.output, b["h"][rows], b["logits"][rows], stream=self.stream)

    # ------------------------------------------------------------ profile
    def _mark(self, name: str) -> None:
        if self._marks is not None:
            ev = cuda.event()
            ev.record(self.stream)
            self._marks.append((name, ev))

    def profile(self, tokens, state) -> dict:
        """GPU time per stage (microseconds, summed over layers) of one eager forward of `tokens`.

        Every launch is queued behind a spinning kernel first, so the events time the GPU, not Python."""
        self.graphs_on, saved = False, self.graphs_on
        self.forward(tokens, self.model.new_state())               # compiled, buffers for this T ready
        self._marks = []
        try:
            self.forward(tokens, state)
        finally:
            marks, self._marks, self.graphs_on = self._marks, None, saved
        out: dict = {}
        for (name, e0), (_, e1) in zip(marks, marks[1:]):
            out[name] = out.get(name, 0.0) + cuda.event_elapsed_time(e0, e1) * 1e3
        out["total"] = cuda.event_elapsed_time(marks[0][1], marks[-1][1]) * 1e3
        return out

    # ------------------------------------------------------------ forward
    def forward(self, tokens, state, last_only: bool = False) -> np.ndarray:
        """tokens [T] -> logits [T, V] ([1, V] with last_only: the last layer's FFN half and the head on the last
        row alone, and only it read back, as a prompt whose next token is wanted needs; the caches the same)."""
        m, cfg = self.model, self.cfg
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if tokens.size == 0:
            raise ConfigError("forward: no tokens given")
        if tokens.min() < 0 or tokens.max() >= cfg.n_vocab:
            bad = tokens[(tokens < 0) | (tokens >= cfg.n_vocab)][0]
            raise ConfigError(f"{m.path}: token id {bad} is outside the vocabulary [0, {cfg.n_vocab})")
        T = tokens.size
        if state.n_past + T > m.n_ctx:
            raise ConfigError(f"{m.path}: {state.n_past + T} positions exceed the context size n_ctx = {m.n_ctx}")
        st = getattr(state, "device", None)
        if st is None:
            st = DeviceState(cfg, m.n_ctx, self.stream)
            if state.n_past:                             # a host state (a state file, another backend): uploaded
                st.upload(state, self.stream)
            state.device = st
        for il in range(self.n_layer):
            self.layer(il)
        pos = np.arange(state.n_past, state.n_past + T)
        cos, sin = m.arch.rope_for(cfg, m.g, pos, m.n_ctx)
        b = self._buffers(T)
        s = self.stream
        b["x"].copy_to_device(np.ascontiguousarray(m.embed(tokens), dtype=np.float32), stream=s)
        b["cos"].copy_to_device(np.ascontiguousarray(cos, dtype=np.float32), stream=s)
        b["sin"].copy_to_device(np.ascontiguousarray(sin, dtype=np.float32), stream=s)
        st.pos.copy_to_device(np.array([state.n_past], np.int32), stream=s)
        self._s_end = state.n_past + T                   # cache rows the last new token sees (kernel choice)
        key = (T, id(st))
        g = self.graphs.get(key)
        self._ev[0].record(s)
        if g is not None:
            g.launch(s)                                  # replay: one launch for the whole step
            self.n_replays += 1
        elif self.graphs_on and T == 1 and b.get("warm"):
            self.graphs = {k: v for k, v in self.graphs.items() if k[0] != T}    # one state at a time
            self.graphs[key] = g = Graph.capture(lambda: self._steps(T, b, st), s)
            g.launch(s)
        else:
            if self._marks is not None:                  # profiling: queue everything behind a spin
                self._spin = self._spin or Spinner()
                self._spin(s, 30000)
            self._steps(T, b, st, last_only)             # eager (also compiles and warms every kernel)
            self._mark("end")
            b["warm"] = True
        self._ev[1].record(s)
        if last_only and T > 1 and self.n_layer:
            logits = self._buffers(1)["logits"].copy_to_host(stream=s)     # (`_steps` ran the last row's head there)
        else:
            logits = b["logits"][(T - 1 if last_only else 0):T].copy_to_host(stream=s)
        s.synchronize()
        if not quant.cuda.SIM:                           # the simulator keeps no event times
            self.last_gpu_us = cuda.event_elapsed_time(*self._ev) * 1e3
        if self.out_scale is not None:
            logits = logits * np.float32(self.out_scale)
        state.n_past += T
        return logits
