"""Straightforward NumPy quantisers for the K-quant block types Q4_K, Q5_K and Q6_K.

gguf-py can dequantise these types but not quantise them. These produce valid blocks with
the byte layouts of DESIGN section 8 (the same as ggml's); the choice of scales is a plain
min/max fit, not llama.cpp's search, which the tests do not need: golden outputs are computed
from the dequantised weights (gguf.quants.dequantize, an independent decoder).

Each function takes float32 rows of shape (..., n) with n a multiple of 256 and returns uint8
of shape (..., n / 256 * block_bytes), the form gguf.GGUFWriter.add_tensor(raw_dtype=...) takes.
"""
import numpy as np

QK_K = 256  # weights per super-block


def _blocks(x: np.ndarray) -> tuple[np.ndarray, tuple[int, ...]]:
    x = np.asarray(x, dtype=np.float32)
    if x.shape[-1] % QK_K:
        raise ValueError(f"row length {x.shape[-1]} is not a multiple of {QK_K}")
    return x.reshape(-1, QK_K), x.shape


def _f16(v: np.ndarray) -> np.ndarray:
    """v rounded to float16 and back: the scale as the decoder will see it."""
    return v.astype(np.float16).astype(np.float32)


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a / b with 0 where b == 0 (an all-zero sub-block)."""
    out = np.zeros(np.broadcast(a, b).shape, dtype=np.float32)
    np.divide(a, b, out=out, where=(b != 0))
    return out


def _scale_min_fit(sub: np.ndarray, qmax: int):
    """Sub-block scales for y = d*sc*q - dmin*m, q in 0..qmax; sub: (nb, 8, 32).

    Returns f16-rounded d, dmin (nb,), 6-bit sc, m (nb, 8) and codes q (nb, 8, 32)."""
    lo = np.minimum(sub.min(axis=-1), 0.0)          # offset is never positive
    hi = sub.max(axis=-1)
    scale = (hi - lo) / qmax                         # (nb, 8)
    d = _f16(scale.max(axis=-1) / 63.0)
    dmin = _f16((-lo).max(axis=-1) / 63.0)
    sc = np.clip(np.rint(_div(scale, d[:, None])), 0, 63).astype(np.uint8)
    m = np.clip(np.rint(_div(-lo, dmin[:, None])), 0, 63).astype(np.uint8)
    step = d[:, None] * sc                           # (nb, 8)
    off = dmin[:, None] * m
    q = np.rint(_div(sub + off[..., None], step[..., None]))
    q = np.clip(q, 0, qmax).astype(np.uint8)
    return d, dmin, sc, m, q


def _pack_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """The 12 scale bytes of Q4_K / Q5_K from 6-bit sc, m of shape (nb, 8)."""
    s = np.zeros((sc.shape[0], 12), dtype=np.uint8)
    for j in range(4):
        s[:, j] = (sc[:, j] & 63) | ((sc[:, j + 4] >> 4) << 6)
        s[:, j + 4] = (m[:, j] & 63) | ((m[:, j + 4] >> 4) << 6)
        s[:, j + 8] = (sc[:, j + 4] & 0xF) | ((m[:, j + 4] & 0xF) << 4)
    return s


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """qs[128]: chunk c holds sub-block 2c in low nibbles, 2c+1 in high nibbles."""
    q = q.reshape(-1, 4, 2, 32)
    return ((q[:, :, 0] & 0xF) | ((q[:, :, 1] & 0xF) << 4)).reshape(-1, 128).astype(np.uint8)


def _d_bytes(v: np.ndarray) -> np.ndarray:
    return v.astype("<f2").view(np.uint8).reshape(-1, 2)


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """Q4_K, 144 bytes per 256 weights: d, dmin, scales[12], qs[128]."""
    blocks, shape = _blocks(x)
    d, dmin, sc, m, q = _scale_min_fit(blocks.reshape(-1, 8, 32), 15)
    out = np.concatenate([_d_bytes(d), _d_bytes(dmin), _pack_scales(sc, m),
                          _pack_nibbles(q)], axis=1)
    return out.reshape(*shape[:-1], shape[-1] // QK_K * 144)


def quantize_q5_k(x: np.ndarray) -> np.ndarray:
    """Q5_K, 176 bytes per 256 weights: d, dmin, scales[12], qh[32], qs[128]."""
    blocks, shape = _blocks(x)
    d, dmin, sc, m, q = _scale_min_fit(blocks.reshape(-1, 8, 32), 31)
    hi = (q >> 4).reshape(-1, 8, 32)   # fifth bit of sub-block j lives in bit j of qh[l]
    qh = np.zeros((q.shape[0], 32), dtype=np.uint8)
    for j in range(8):
        qh |= (hi[:, j] << j).astype(np.uint8)
    out = np.concatenate([_d_bytes(d), _d_bytes(dmin), _pack_scales(sc, m), qh,
                          _pack_nibbles(q & 0xF)], axis=1)
    return out.reshape(*shape[:-1], shape[-1] // QK_K * 176)


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """Q6_K, 210 bytes per 256 weights: ql[128], qh[64], int8 scales[16], d (last)."""
    blocks, shape = _blocks(x)
    sub = blocks.reshape(-1, 16, 16)
    amax = np.abs(sub).max(axis=-1)                            # (nb, 16)
    scale = amax / 31.0
    d = _f16(scale.max(axis=-1) / 127.0)
    sc = np.clip(np.rint(_div(scale, d[:, None])), -128, 127).astype(np.int8)
    step = d[:, None] * sc.astype(np.float32)
    w = np.clip(np.rint(_div(sub, step[..., None])), -32, 31).astype(np.int16) + 32
    w = w.reshape(-1, 2, 4, 32).astype(np.uint8)    # half n, quarter r (l, l+32, l+64, l+96)
    ql = np.zeros((w.shape[0], 2, 64), dtype=np.uint8)
    ql[:, :, :32] = (w[:, :, 0] & 0xF) | ((w[:, :, 2] & 0xF) << 4)
    ql[:, :, 32:] = (w[:, :, 1] & 0xF) | ((w[:, :, 3] & 0xF) << 4)
    qh = ((w[:, :, 0] >> 4) | ((w[:, :, 1] >> 4) << 2) | ((w[:, :, 2] >> 4) << 4)
          | ((w[:, :, 3] >> 4) << 6)).astype(np.uint8)      # (nb, 2, 32)
    out = np.concatenate([ql.reshape(-1, 128), qh.reshape(-1, 64),
                          sc.view(np.uint8).reshape(-1, 16), _d_bytes(d)], axis=1)
    return out.reshape(*shape[:-1], shape[-1] // QK_K * 210)
