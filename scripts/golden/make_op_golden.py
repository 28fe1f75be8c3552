#!/usr/bin/env python3
"""Golden data for the CPU ops tests (tests/test_ops_*.c), from independent references.

Writes tests/data/ops/ops_golden.gguf (GGUF as the container: tensors plus shape metadata):
  deq.<TYPE>.raw / deq.<TYPE>.out   random blocks and gguf-py's gguf.quants.dequantize of them
  cvt.*                             f32 <-> f16 / bf16 conversions by numpy and gguf-py
  rope.<case>.*, attn.<case>.*, conv.*, delta.*, norm.*, softmax.*, sample.<case>.*
                                    inputs (f32) and float64 numpy references

Every reference below is written from the math in DESIGN sections 5-8, not from the C code.
Run from the repository root:  python3 scripts/golden/make_op_golden.py
"""
import os
import struct

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize, quantize

OUT = os.path.join("tests", "data", "ops", "ops_golden.gguf")
rng = np.random.default_rng(20240607)


def f32(a):
    return np.ascontiguousarray(np.asarray(a, dtype=np.float32))


def i32(a):
    return np.ascontiguousarray(np.asarray(a, dtype=np.int32))


# --- dequantisation ---------------------------------------------------------------------

def rand_f16_bytes(n, lo, hi, signed=False):
    v = rng.uniform(lo, hi, n)
    if signed:
        v *= rng.choice([-1.0, 1.0], n)
    return v.astype(np.float16).view(np.uint8).reshape(n, 2)


def rand_blocks(qt, n):
    """n random but well-formed blocks of type qt (scales are finite f16 values)."""
    if qt == QT.Q8_0:
        d = rand_f16_bytes(n, 1e-3, 0.1, signed=True)
        q = rng.integers(0, 256, (n, 32), dtype=np.uint8)
        return np.concatenate([d, q], axis=1)
    if qt in (QT.Q4_K, QT.Q5_K):
        d = rand_f16_bytes(n, 1e-4, 0.02, signed=True)
        dmin = rand_f16_bytes(n, 1e-4, 0.02)
        rest = 12 + (32 if qt == QT.Q5_K else 0) + 128
        body = rng.integers(0, 256, (n, rest), dtype=np.uint8)
        return np.concatenate([d, dmin, body], axis=1)
    if qt == QT.Q6_K:
        body = rng.integers(0, 256, (n, 208), dtype=np.uint8)
        d = rand_f16_bytes(n, 1e-4, 0.01, signed=True)
        return np.concatenate([body, d], axis=1)
    raise ValueError(qt)


# --- RoPE -------------------------------------------------------------------------------

def rope_ref(x, pos, n_rot, theta):
    """x [n_tok][n_head][head_dim] float64, NeoX pairs (j, j + n_rot/2)."""
    y = x.copy()
    half = n_rot // 2
    for t in range(x.shape[0]):
        for j in range(half):
            ang = float(pos[t]) * float(theta) ** (-2.0 * j / n_rot)
            c, s = np.cos(ang), np.sin(ang)
            a = x[t, :, j].copy()
            b = x[t, :, j + half].copy()
            y[t, :, j] = a * c - b * s
            y[t, :, j + half] = a * s + b * c
    return y


# --- attention --------------------------------------------------------------------------

def visible(kind, qp, kp, window, tree_row, first_tree):
    """Mask for one query: list of bools over keys."""
    out = []
    for i, p in enumerate(kp):
        d = qp - p
        if kind == "bidir":
            ok = window == 0 or abs(d) < window
        elif kind == "tree" and i >= first_tree:
            ok = bool(tree_row[i - first_tree]) and (window == 0 or d < window)
        else:
            ok = d >= 0 and (window == 0 or d < window)
        out.append(ok)
    return np.array(out)


def attn_ref(q, k, v, qpos, kpos, scale, kind, window, tree, gate):
    """q [n_q][n_head][D], k/v [n_kv][n_head_kv][D] (float64)."""
    n_q, n_head, D = q.shape
    n_kv, n_head_kv, _ = k.shape
    group = n_head // n_head_kv
    n_tree = 0 if tree is None else tree.shape[1]
    out = np.zeros((n_q, n_head, D))
    for t in range(n_q):
        vis = visible(kind, qpos[t], kpos, window, None if tree is None else tree[t], n_kv - n_tree)
        for h in range(n_head):
            g = h // group
            if not vis.any():
                continue
            s = scale * (k[:, g, :] @ q[t, h, :])
            s = np.where(vis, s, -np.inf)
            p = np.exp(s - s.max())
            p /= p.sum()
            o = p @ v[:, g, :]
            if gate is not None:
                o = o / (1.0 + np.exp(-gate[t, h, :]))
            out[t, h] = o
    return out


# --- conv1d and delta rule ---------------------------------------------------------------

def conv_ref(x, w, state):
    """x [n_tok][n_ch], w [n_ch][K], state [K-1][n_ch] (oldest first)."""
    K = w.shape[1]
    full = np.concatenate([state, x], axis=0)  # time -(K-1) .. n_tok-1
    n_tok = x.shape[0]
    out = np.zeros_like(x)
    states = np.zeros((n_tok, K - 1, x.shape[1]))
    for t in range(n_tok):
        win = full[t:t + K]  # times t-K+1 .. t
        out[t] = np.einsum("kc,ck->c", win, w)
        states[t] = full[t + 1:t + K]
    return out, states


def delta_ref(q, k, v, g, beta, S0, n_k_head):
    """q,k [T][n_k][dk], v [T][n_v][dv], g,beta [T][n_v], S0 [n_v][dk][dv]."""
    T, n_v, dv = v.shape
    S = S0.copy()
    out = np.zeros((T, n_v, dv))
    states = np.zeros((T,) + S.shape)
    for t in range(T):
        for h in range(n_v):
            kh = h % n_k_head
            S[h] = np.exp(g[t, h]) * S[h]
            kv = S[h].T @ k[t, kh]
            S[h] = S[h] + np.outer(k[t, kh], beta[t, h] * (v[t, h] - kv))
            out[t, h] = S[h].T @ q[t, kh]
        states[t] = S
    return out, states


# --- sampler ----------------------------------------------------------------------------

M32 = 0xFFFFFFFF


def philox4x32(ctr, key):
    c = list(ctr)
    k0, k1 = key
    for _ in range(10):
        p0 = 0xD2511F53 * c[0]
        p1 = 0xCD9E8D57 * c[2]
        c = [((p1 >> 32) ^ c[1] ^ k0) & M32, p1 & M32, ((p0 >> 32) ^ c[3] ^ k1) & M32, p0 & M32]
        k0 = (k0 + 0x9E3779B9) & M32
        k1 = (k1 + 0xBB67AE85) & M32
    return c


# Random123's published known answer (kat_vectors), so this reference is itself checked.
assert philox4x32([0, 0, 0, 0], [0, 0]) == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
assert philox4x32([M32] * 4, [M32, M32]) == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]


def uniform(seed, counter):
    o = philox4x32([counter & M32, counter >> 32, 0, 0], [seed & M32, seed >> 32])
    return (((o[0] << 32) | o[1]) >> 11) * 2.0 ** -53


def sample_probs_ref(logits, temp, top_k, top_p, min_p):
    """The filtered distribution: softmax(l/T) -> top_k -> top_p -> min_p -> renormalise."""
    n = len(logits)
    l64 = logits.astype(np.float64)
    best = int(np.argmax(l64))
    if temp == 0:
        p = np.zeros(n)
        p[best] = 1
        return p, None
    e = np.exp((l64 - l64.max()) / np.float64(np.float32(temp)))
    order = np.lexsort((np.arange(n), -l64))  # most likely first, lower id on ties
    keep = order
    if 0 < top_k < n:
        keep = keep[:top_k]
    margin = None
    if top_p < 1:
        total = e[keep].sum()
        cum = np.cumsum(e[keep])
        thr = np.float64(np.float32(top_p)) * total
        j = int(np.argmax(cum >= thr))
        # distance of the cut from the nearest cumulative sum, so the data is not knife-edge
        margin = min(abs(cum - thr)) / total
        keep = keep[:j + 1]
    if min_p > 0:
        keep = np.array([i for i in keep if e[i] >= np.float64(np.float32(min_p)) or i == best])
    p = np.zeros(n)
    p[keep] = e[keep] / e[keep].sum()
    return p, margin


def draw_ref(p32, seed, step):
    total = float(np.sum(p32.astype(np.float64)))
    target = uniform(seed, step) * total
    cum = 0.0
    last = -1
    for i, v in enumerate(p32):
        if v > 0:
            cum += float(v)
            last = i
            if cum > target:
                return i
    return last


def main():
    w = gguf.GGUFWriter(OUT, arch="tandem_ops_golden")

    # dequantisation of random blocks
    for qt, nb in ((QT.Q8_0, 16), (QT.Q4_K, 6), (QT.Q5_K, 6), (QT.Q6_K, 6)):
        raw = rand_blocks(qt, nb)
        out = dequantize(raw, qt).reshape(-1)
        w.add_tensor(f"deq.{qt.name}.raw", raw, raw_dtype=qt)
        w.add_tensor(f"deq.{qt.name}.out", f32(out))

    # f16 / bf16 <-> f32: every class of value (normal, subnormal, zero, inf, NaN, ties)
    h_bits = np.concatenate([
        rng.integers(0, 1 << 16, 2000, dtype=np.uint32).astype(np.uint16),
        np.array([0x0000, 0x8000, 0x0001, 0x03FF, 0x0400, 0x7BFF, 0x7C00, 0xFC00, 0x7E00,
                  0x7C01, 0xFE37, 0x3C00, 0xBC00], dtype=np.uint16)])
    w.add_tensor("cvt.f16_bits", h_bits.view(np.float16))
    w.add_tensor("cvt.f16_to_f32", f32(h_bits.view(np.float16).astype(np.float32)))
    xs = np.concatenate([
        rng.normal(0, 1, 500), rng.normal(0, 1e4, 200), rng.uniform(-1e-6, 1e-6, 200),
        rng.uniform(-1e-8, 1e-8, 100), rng.normal(0, 1e5, 100)]).astype(np.float32)
    # exact halfway cases for f16 (1 + k/2048 with odd and even k) and the overflow edge
    ties = np.array([1 + 1 / 2048, 1 + 3 / 2048, 2049.0, 2051.0, 65504.0, 65519.0, 65520.0,
                     2.0 ** -25, 3 * 2.0 ** -26, 2.0 ** -24 * 1.5, 2.0 ** -24 * 2.5,
                     np.inf, -np.inf, 0.0, -0.0], dtype=np.float32)
    xs = np.concatenate([xs, ties, -ties]).astype(np.float32)
    with np.errstate(over="ignore"):
        w.add_tensor("cvt.f32", xs)
        w.add_tensor("cvt.f32_to_f16", xs.astype(np.float16))
    bf = quantize(xs, QT.BF16)
    w.add_tensor("cvt.f32_to_bf16", bf, raw_dtype=QT.BF16)

    # RoPE: qwen35 layout (per head 16 query values then 16 gate values, n_rot 8 of 16,
    # theta 1e7) and a full-rotary case (qwen3 style)
    pos = i32([0, 1, 7, 100, 4097, 70001])
    for name, n_head, D, n_rot, theta in (("partial", 3, 16, 8, 1e7), ("full", 2, 12, 12, 1e6)):
        x = rng.normal(0, 1, (len(pos), n_head, 2 * D)).astype(np.float32)
        ref = rope_ref(x[:, :, :D].astype(np.float64), pos, n_rot, theta)
        w.add_tensor(f"rope.{name}.x", x)
        w.add_tensor(f"rope.{name}.pos", pos)
        w.add_tensor(f"rope.{name}.ref", f32(ref))
        w.add_uint32(f"rope.{name}.n_head", n_head)
        w.add_uint32(f"rope.{name}.head_dim", D)
        w.add_uint32(f"rope.{name}.n_rot", n_rot)
        w.add_float32(f"rope.{name}.theta", theta)

    # attention cases: (name, n_q, n_head, n_head_kv, D, n_ctx, kind, window, f16, gate)
    cases = (
        ("causal", 5, 4, 2, 16, 35, "causal", 0, False, False),
        ("causal_f16", 5, 4, 2, 16, 35, "causal", 0, True, False),
        ("long", 3, 2, 1, 8, 297, "causal", 0, True, False),
        ("bidir", 6, 3, 3, 8, 10, "bidir", 0, False, False),
        ("swa", 6, 4, 1, 8, 20, "causal", 8, False, False),
        ("swa_bidir", 6, 2, 1, 8, 0, "bidir", 3, False, False),
        ("gated", 4, 6, 2, 16, 9, "causal", 0, True, True),
        ("tree", 7, 4, 2, 8, 20, "tree", 0, False, False),
    )
    for name, n_q, n_head, n_head_kv, D, n_ctx, kind, window, half, gated in cases:
        tree = None
        if kind == "tree":
            # a tree below the last committed token: parent of each node, depth = position
            parent = [-1, 0, 0, 1, 1, 2, 5]
            depth = [0] * n_q
            for i in range(1, n_q):
                depth[i] = depth[parent[i]] + 1
            tree = np.zeros((n_q, n_q), dtype=np.int32)
            for i in range(n_q):
                j = i
                while j >= 0:
                    tree[i, j] = 1
                    j = parent[j]
            qpos = np.array([n_ctx + d for d in depth])
            kpos = np.concatenate([np.arange(n_ctx), qpos])
        else:
            qpos = np.arange(n_ctx, n_ctx + n_q)
            kpos = np.arange(n_ctx + n_q)
        n_kv = len(kpos)
        # q and gate interleaved per head as qwen35's attn_q output: [n_q][n_head][2*D]
        qg = rng.normal(0, 1, (n_q, n_head, 2 * D)).astype(np.float32)
        k = rng.normal(0, 1, (n_kv, n_head_kv, D)).astype(np.float32)
        v = rng.normal(0, 1, (n_kv, n_head_kv, D)).astype(np.float32)
        if half:
            k, v = k.astype(np.float16), v.astype(np.float16)
        scale = 1.0 / np.sqrt(D)
        ref = attn_ref(qg[:, :, :D].astype(np.float64), k.astype(np.float64),
                       v.astype(np.float64), qpos, kpos, np.float64(np.float32(scale)), kind,
                       window, tree, qg[:, :, D:].astype(np.float64) if gated else None)
        p = f"attn.{name}."
        w.add_tensor(p + "qg", qg)
        w.add_tensor(p + "k", k)
        w.add_tensor(p + "v", v)
        w.add_tensor(p + "q_pos", i32(qpos))
        w.add_tensor(p + "k_pos", i32(kpos))
        w.add_tensor(p + "ref", f32(ref))
        if tree is not None:
            w.add_tensor(p + "tree", i32(tree))
        for key, val in (("n_head", n_head), ("n_head_kv", n_head_kv), ("head_dim", D),
                         ("window", window), ("gated", int(gated))):
            w.add_uint32(p + key, val)
        w.add_string(p + "mask", kind)

    # conv1d: 6 channels, kernel 4, 9 tokens, with an incoming state
    n_tok, n_ch, K = 9, 6, 4
    x = rng.normal(0, 1, (n_tok, n_ch)).astype(np.float32)
    cw = rng.normal(0, 0.5, (n_ch, K)).astype(np.float32)
    st = rng.normal(0, 1, (K - 1, n_ch)).astype(np.float32)
    out, states = conv_ref(x.astype(np.float64), cw.astype(np.float64), st.astype(np.float64))
    for key, val in (("x", x), ("w", cw), ("state", st), ("ref", f32(out)),
                     ("ref_states", f32(states))):
        w.add_tensor("conv." + key, val)

    # gated delta rule: 2 key heads, 4 value heads (value head h uses key head h % 2)
    T, nk, nv, dk, dv = 7, 2, 4, 8, 6
    q = rng.normal(0, 1, (T, nk, dk))
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    q /= np.sqrt(dk)
    k = rng.normal(0, 1, (T, nk, dk))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    q, k = q.astype(np.float32), k.astype(np.float32)
    v = rng.normal(0, 1, (T, nv, dv)).astype(np.float32)
    g = -rng.uniform(0.01, 1.5, (T, nv)).astype(np.float32)
    beta = rng.uniform(0.05, 0.95, (T, nv)).astype(np.float32)
    S0 = rng.normal(0, 0.3, (nv, dk, dv)).astype(np.float32)
    out, states = delta_ref(*(a.astype(np.float64) for a in (q, k, v, g, beta, S0)), nk)
    for key, val in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta), ("state", S0),
                     ("ref", f32(out)), ("ref_states", f32(states))):
        w.add_tensor("delta." + key, val)

    # norms and softmax
    xn = rng.normal(0, 3, (5, 40)).astype(np.float32)
    wn = rng.normal(1, 0.2, 40).astype(np.float32)
    eps = np.float32(1e-6)
    x64 = xn.astype(np.float64)
    rms = x64 / np.sqrt((x64 ** 2).mean(axis=1, keepdims=True) + np.float64(eps))
    w.add_tensor("norm.x", xn)
    w.add_tensor("norm.w", wn)
    w.add_tensor("norm.rms_ref", f32(rms * wn.astype(np.float64)))
    w.add_tensor("norm.l2_ref", f32(x64 / np.sqrt((x64 ** 2).sum(axis=1, keepdims=True)
                                                  + np.float64(eps))))
    w.add_float32("norm.eps", float(eps))
    xs = rng.normal(0, 4, (4, 33)).astype(np.float32)
    xs[1] += 500  # large logits: needs the max subtraction
    e = np.exp(xs.astype(np.float64) - xs.astype(np.float64).max(axis=1, keepdims=True))
    w.add_tensor("softmax.x", xs)
    w.add_tensor("softmax.ref", f32(e / e.sum(axis=1, keepdims=True)))

    # sampler: filtered distributions and exact draws for fixed seeds
    V = 64
    logits = f32(rng.normal(0, 2, V))
    w.add_tensor("sample.logits", logits)
    settings = (  # name, temperature, top_k, top_p, min_p, seed
        ("plain", 1.0, 0, 1.0, 0.0, 1),
        ("temp", 0.7, 0, 1.0, 0.0, 42),
        ("topk", 1.0, 5, 1.0, 0.0, 7),
        ("topp", 0.8, 0, 0.9, 0.0, 12345),
        ("minp", 1.2, 0, 1.0, 0.05, 99),
        ("all", 0.9, 20, 0.8, 0.02, 0xDEADBEEFCAFEF00D),
        ("greedy", 0.0, 0, 1.0, 0.0, 3),
    )
    for name, temp, top_k, top_p, min_p, seed in settings:
        p, margin = sample_probs_ref(logits, temp, top_k, top_p, min_p)
        assert margin is None or margin > 1e-4, (name, margin)
        p32 = f32(p)
        steps = [0, 1, 2, 3, 10, 1000, 123456789, (1 << 40) + 5]
        tokens = [draw_ref(p32, seed, s) for s in steps]
        pre = f"sample.{name}."
        w.add_tensor(pre + "p", p32)
        w.add_tensor(pre + "tokens", i32(tokens))
        w.add_tensor(pre + "steps", np.array(steps, dtype=np.int64))
        w.add_float32(pre + "temperature", temp)
        w.add_int32(pre + "top_k", top_k)
        w.add_float32(pre + "top_p", top_p)
        w.add_float32(pre + "min_p", min_p)
        w.add_uint64(pre + "seed", seed)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(OUT, os.path.getsize(OUT), "bytes")


if __name__ == "__main__":
    main()
