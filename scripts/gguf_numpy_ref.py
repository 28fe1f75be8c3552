#!/usr/bin/env python3
"""A NumPy forward pass of `qwen3` and `qwen35` GGUF files, written from DESIGN sections 5 and 6
(not from transformers): it reads the stored conventions back (1 + w norms, ssm_a = -exp(A_log),
tiled value-head order, conv1d ne {K, C}) and so checks the converter against the golden
outputs that transformers produced from the Hugging Face layout.

    python3 scripts/gguf_numpy_ref.py tests/data/models/qwen35-tiny-f32.gguf
    (compares with tests/data/golden/<same name> and prints the largest differences)

Everything runs in float64 on weights dequantised by gguf.quants.dequantize. Needs numpy and
gguf only.
"""
from __future__ import annotations

import pathlib
import sys

import numpy as np

import gguf


def gguf_read(path) -> tuple[dict, dict[str, np.ndarray]]:
    """(metadata, tensors): scalars/arrays by key, tensors dequantised in numpy shape."""
    r = gguf.GGUFReader(str(path))
    meta = {}
    for k, f in r.fields.items():
        if not k.startswith(("tokenizer.", "GGUF.")):
            meta[k] = f.contents()
    tensors = {}
    for t in r.tensors:
        shape = tuple(int(n) for n in reversed(t.shape))
        if t.tensor_type == gguf.GGMLQuantizationType.I32:
            tensors[t.name] = t.data.astype(np.int64).reshape(shape)
        else:
            a = gguf.quants.dequantize(t.data, t.tensor_type)
            tensors[t.name] = a.reshape(shape).astype(np.float64)
    return meta, tensors


def rmsnorm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def softplus(x):
    return np.logaddexp(0.0, x)


def rope(x, pos, n_rot, theta):
    """NeoX rotation of dims 0..n_rot-1, pairs (j, j + n_rot/2); x: [T, heads, d]."""
    half = n_rot // 2
    ang = pos[:, None] * theta ** (-np.arange(half) / half)          # [T, half]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., :half], x[..., half:n_rot]
    return np.concatenate([a * c - b * s, b * c + a * s, x[..., n_rot:]], axis=-1)


class Model:
    """Weights and shapes of one GGUF file; state lives in a dict per sequence."""

    def __init__(self, path):
        self.meta, self.t = gguf_read(path)
        a = self.arch = self.meta["general.architecture"]
        m = self.meta
        self.n_layer = m[f"{a}.block_count"] - m.get(f"{a}.nextn_predict_layers", 0)
        self.n_head = m[f"{a}.attention.head_count"]
        self.n_kv = m[f"{a}.attention.head_count_kv"]
        self.hd = m[f"{a}.attention.key_length"]
        self.eps = m[f"{a}.attention.layer_norm_rms_epsilon"]
        self.theta = m[f"{a}.rope.freq_base"]
        self.n_rot = m.get(f"{a}.rope.dimension_count", self.hd)
        self.interval = m.get(f"{a}.full_attention_interval", 1)
        if a == "qwen35":
            self.n_k = m[f"{a}.ssm.group_count"]
            self.n_v = m[f"{a}.ssm.time_step_rank"]
            self.dk = m[f"{a}.ssm.state_size"]
            self.dv = m[f"{a}.ssm.inner_size"] // self.n_v
            self.kconv = m[f"{a}.ssm.conv_kernel"]

    def is_attention(self, l: int) -> bool:
        return self.arch == "qwen3" or (l + 1) % self.interval == 0

    def w(self, name: str) -> np.ndarray:
        return self.t[name]

    def state_new(self) -> dict:
        return {"pos": 0}

    def forward(self, tokens, state: dict) -> tuple[np.ndarray, list[np.ndarray]]:
        """Logits [T, V] and the residual after each layer [T, H] for tokens that follow
        what `state` has seen; state is updated."""
        x = self.w("token_embd.weight")[np.asarray(tokens)]
        pos = state["pos"] + np.arange(len(tokens), dtype=np.float64)
        hidden = []
        for l in range(self.n_layer):
            p = f"blk.{l}."
            h = rmsnorm(x, self.w(p + "attn_norm.weight"), self.eps)
            if self.is_attention(l):
                x = x + self.attention(l, h, pos, state)
            else:
                x = x + self.deltanet(l, h, state)
            post = "post_attention_norm.weight" if self.arch == "qwen35" else "ffn_norm.weight"
            h = rmsnorm(x, self.w(p + post), self.eps)
            ff = silu(h @ self.w(p + "ffn_gate.weight").T) * (h @ self.w(p + "ffn_up.weight").T)
            x = x + ff @ self.w(p + "ffn_down.weight").T
            hidden.append(x)
        state["pos"] += len(tokens)
        head = self.t.get("output.weight", self.w("token_embd.weight"))
        return rmsnorm(x, self.w("output_norm.weight"), self.eps) @ head.T, hidden

    def attention(self, l, h, pos, state):
        p, T, hd = f"blk.{l}.", h.shape[0], self.hd
        q = (h @ self.w(p + "attn_q.weight").T).reshape(T, self.n_head, -1)
        gate = None
        if self.arch == "qwen35":          # per head: hd query values, then hd gate values
            q, gate = q[..., :hd], q[..., hd:].reshape(T, -1)
        k = (h @ self.w(p + "attn_k.weight").T).reshape(T, self.n_kv, hd)
        v = (h @ self.w(p + "attn_v.weight").T).reshape(T, self.n_kv, hd)
        q = rope(rmsnorm(q, self.w(p + "attn_q_norm.weight"), self.eps), pos, self.n_rot,
                 self.theta)
        k = rope(rmsnorm(k, self.w(p + "attn_k_norm.weight"), self.eps), pos, self.n_rot,
                 self.theta)
        kc = state[p + "k"] = np.concatenate([state.get(p + "k", np.zeros((0, self.n_kv, hd))), k])
        vc = state[p + "v"] = np.concatenate([state.get(p + "v", np.zeros((0, self.n_kv, hd))), v])
        kpos = np.arange(kc.shape[0])
        out = np.zeros((T, self.n_head, hd))
        group = self.n_head // self.n_kv
        for j in range(self.n_head):
            s = q[:, j] @ kc[:, j // group].T / np.sqrt(hd)           # [T, Tk]
            s = np.where(kpos[None, :] <= pos[:, None], s, -np.inf)
            s = np.exp(s - s.max(-1, keepdims=True))
            out[:, j] = (s / s.sum(-1, keepdims=True)) @ vc[:, j // group]
        out = out.reshape(T, -1)
        if gate is not None:
            out = out / (1.0 + np.exp(-gate))
        return out @ self.w(p + "attn_output.weight").T

    def deltanet(self, l, h, state):
        p, T = f"blk.{l}.", h.shape[0]
        n_k, n_v, dk, dv, K = self.n_k, self.n_v, self.dk, self.dv, self.kconv
        raw = h @ self.w(p + "attn_qkv.weight").T                     # [T, C]
        C = raw.shape[1]
        win = np.concatenate([state.get(p + "conv", np.zeros((K - 1, C))), raw])
        state[p + "conv"] = win[-(K - 1):]
        wc = self.w(p + "ssm_conv1d.weight")                           # [C, K]
        conv = np.stack([(win[t:t + K] * wc.T).sum(0) for t in range(T)])
        conv = silu(conv)
        q = conv[:, :n_k * dk].reshape(T, n_k, dk)
        k = conv[:, n_k * dk:2 * n_k * dk].reshape(T, n_k, dk)
        v = conv[:, 2 * n_k * dk:].reshape(T, n_v, dv)
        l2 = lambda a: a / np.sqrt((a * a).sum(-1, keepdims=True) + self.eps)  # noqa: E731
        q, k = l2(q) / np.sqrt(dk), l2(k)
        beta = 1.0 / (1.0 + np.exp(-(h @ self.w(p + "ssm_beta.weight").T)))  # [T, n_v]
        g = softplus(h @ self.w(p + "ssm_alpha.weight").T + self.w(p + "ssm_dt.bias")) \
            * self.w(p + "ssm_a")
        S = state.get(p + "ssm", np.zeros((n_v, dk, dv)))
        o = np.zeros((T, n_v, dv))
        for t in range(T):
            for hv in range(n_v):
                kk, qq = k[t, hv % n_k], q[t, hv % n_k]       # tiled order: key head hv mod n_k
                S[hv] *= np.exp(g[t, hv])
                kv = S[hv].T @ kk
                S[hv] += np.outer(kk, beta[t, hv] * (v[t, hv] - kv))
                o[t, hv] = S[hv].T @ qq
        state[p + "ssm"] = S
        z = (h @ self.w(p + "attn_gate.weight").T).reshape(T, n_v, dv)
        y = rmsnorm(o, self.w(p + "ssm_norm.weight"), self.eps) * silu(z)
        return y.reshape(T, -1) @ self.w(p + "ssm_out.weight").T


def golden_compare(model_path, golden_path) -> dict[str, float]:
    """Largest absolute difference per golden quantity (logits, hidden.*, cont.*, prefix.*)."""
    model = Model(model_path)
    _, gold = gguf_read(golden_path)
    n_prefix = int(gguf.GGUFReader(str(golden_path)).fields["golden.n_prefix"].contents())
    tokens = gold["tokens"]
    errs = {}
    logits, hidden = model.forward(tokens, model.state_new())
    errs["logits"] = np.abs(logits - gold["logits"]).max()
    errs["hidden"] = max(np.abs(h - gold[f"hidden.{l}"]).max() for l, h in enumerate(hidden))
    st = model.state_new()
    model.forward(tokens[:n_prefix], st)
    prefix = []
    for l in range(model.n_layer):
        p = f"blk.{l}."
        if model.is_attention(l):
            prefix.append(np.abs(st[p + "k"].transpose(1, 0, 2) - gold[f"prefix.{p}k"]).max())
            prefix.append(np.abs(st[p + "v"].transpose(1, 0, 2) - gold[f"prefix.{p}v"]).max())
        else:
            prefix.append(np.abs(st[p + "ssm"] - gold[f"prefix.{p}ssm_state"]).max())
            prefix.append(np.abs(st[p + "conv"] - gold[f"prefix.{p}conv_state"]).max())
    errs["prefix"] = max(prefix)
    logits2, hidden2 = model.forward(tokens[n_prefix:], st)
    errs["cont.logits"] = np.abs(logits2 - gold["cont.logits"]).max()
    errs["cont.hidden"] = max(np.abs(h - gold[f"cont.hidden.{l}"]).max()
                              for l, h in enumerate(hidden2))
    return {k: float(v) for k, v in errs.items()}


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    for path in argv:
        path = pathlib.Path(path)
        golden = path.parent.parent / "golden" / path.name
        errs = golden_compare(path, golden)
        print(path.name, " ".join(f"{k}={v:.2e}" for k, v in errs.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
