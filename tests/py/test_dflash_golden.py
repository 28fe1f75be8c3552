"""The tiny DFlash drafters and their golden files (numpy + gguf only, no torch).

scripts/dflash_ref.py (PyTorch) made the golden logits; a second, NumPy reading of DESIGN
section 7 here must reproduce them from config.json, the bf16 model.safetensors, the target's
GGUF (embedding, LM head) and the target's golden hidden states.
"""
import json
import pathlib

import numpy as np
import pytest

import gguf

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
DRAFTERS = ["dflash-b16", "dflash-b8", "dflash-swa"]


def gguf_arrays(path):
    r = gguf.GGUFReader(str(path))
    out = {}
    for t in r.tensors:
        shape = tuple(int(n) for n in reversed(t.shape))
        if t.tensor_type == gguf.GGMLQuantizationType.I32:
            out[t.name] = np.array(t.data).reshape(shape)
        else:
            out[t.name] = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape)
    meta = {k: f.contents() for k, f in r.fields.items() if k.startswith("golden.")}
    return meta, out


def safetensors_bf16(path):
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "BF16", name
        lo, hi = info["data_offsets"]
        bits = np.frombuffer(raw[8 + n + lo:8 + n + hi], dtype="<u2").astype(np.uint32) << 16
        out[name] = bits.view(np.float32).astype(np.float64).reshape(info["shape"])
    return out


def settings(raw):
    c = {**raw, **raw.get("dflash_config", {})}
    n_draft = c["num_hidden_layers"]
    ids = c.get("target_layer_ids") or [round(1 + i * (c["num_target_layers"] - 4) / (n_draft - 1))
                                        for i in range(n_draft)]
    theta = (c.get("rope_parameters") or {}).get("rope_theta", c.get("rope_theta"))
    return c, ids, theta


def norm(x, w, eps):
    return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * w


def neox(x, pos, theta):
    half = x.shape[-1] // 2
    f = np.outer(pos, theta ** (-np.arange(half) / half))[:, None, :]
    return np.concatenate([x[..., :half] * np.cos(f) - x[..., half:] * np.sin(f),
                           x[..., half:] * np.cos(f) + x[..., :half] * np.sin(f)], -1)


def draft(raw, w, feats, n_ctx, block, embed, head):
    c, _, theta = settings(raw)
    eps, nh, nkv, d = c["rms_norm_eps"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    ctx = norm(feats[:n_ctx].reshape(n_ctx, -1) @ w["fc.weight"].T, w["hidden_norm.weight"], eps)
    B = len(block)
    qp = np.arange(n_ctx, n_ctx + B)
    kp = np.arange(n_ctx + B)
    x = embed[block] * c.get("input_embedding_scale", 1.0)
    for l, kind in enumerate(c.get("layer_types") or ["full_attention"] * c["num_hidden_layers"]):
        p = f"layers.{l}."
        causal = c["is_causal"] if "is_causal" in c else kind == "sliding_attention"
        dist = qp[:, None] - kp[None, :]
        see = np.ones(dist.shape, bool)
        if causal:
            see &= dist >= 0
        if kind == "sliding_attention":
            see &= (dist if causal else np.abs(dist)) < c["sliding_window"]
        h = norm(x, w[p + "input_layernorm.weight"], eps)
        q = neox(norm((h @ w[p + "self_attn.q_proj.weight"].T).reshape(B, nh, d),
                      w[p + "self_attn.q_norm.weight"], eps), qp, theta)
        src = np.concatenate([ctx, h])
        k = neox(norm((src @ w[p + "self_attn.k_proj.weight"].T).reshape(-1, nkv, d),
                      w[p + "self_attn.k_norm.weight"], eps), kp, theta)
        v = (src @ w[p + "self_attn.v_proj.weight"].T).reshape(-1, nkv, d)
        att = np.einsum("qhd,khd->hqk", q, np.repeat(k, nh // nkv, axis=1)) / np.sqrt(d)
        att = np.where(see[None], att, -np.inf)
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        o = np.einsum("hqk,khd->qhd", att, np.repeat(v, nh // nkv, axis=1)).reshape(B, -1)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        h = norm(x, w[p + "post_attention_layernorm.weight"], eps)
        g = h @ w[p + "mlp.gate_proj.weight"].T
        x = x + (g / (1 + np.exp(-g)) * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    logits = norm(x, w["norm.weight"], eps)[1:] @ head.T * c.get("output_multiplier", 1.0)
    if "final_logit_softcapping" in c:
        cap = c["final_logit_softcapping"]
        logits = np.tanh(logits / cap) * cap
    return logits


@pytest.fixture(scope="module")
def target():
    _, t = gguf_arrays(DATA / "models" / "qwen35-tiny-f32.gguf")
    _, g = gguf_arrays(DATA / "golden" / "qwen35-tiny-f32.gguf")
    return t, g


@pytest.mark.parametrize("name", DRAFTERS)
def test_drafter_files_have_the_published_layout(name):
    raw = json.loads((DATA / "drafter" / name / "config.json").read_text())
    assert raw["architectures"] == ["DFlashDraftModel"]
    assert raw["dflash_config"]["mask_token_id"] == 511
    w = safetensors_bf16(DATA / "drafter" / name / "model.safetensors")
    c, ids, _ = settings(raw)
    assert w["fc.weight"].shape == (32, 32 * len(ids))
    assert {k for k in w if not k.startswith("layers.")} == {"fc.weight", "hidden_norm.weight",
                                                             "norm.weight"}
    assert len([k for k in w if k.startswith("layers.1.")]) == 11


@pytest.mark.parametrize("name,taps,block", [("dflash-b16", [1, 3, 6], 16),
                                             ("dflash-b8", [1, 5], 8),
                                             ("dflash-swa", [2, 5], 16)])
def test_golden_features_are_the_targets_tap_layers(name, taps, block, target):
    _, gold_t = target
    meta, g = gguf_arrays(DATA / "golden" / f"{name}.gguf")
    assert settings(json.loads((DATA / "drafter" / name / "config.json").read_text()))[1] == taps
    assert meta["golden.block_size"] == block and meta["golden.mask_token_id"] == 511
    n2 = meta["golden.step2.n_ctx"]
    assert (meta["golden.step1.n_ctx"], n2) == (12, 16)
    np.testing.assert_array_equal(g["context.tokens"], gold_t["tokens"][:n2])
    for i, l in enumerate(taps):
        np.testing.assert_array_equal(g["features"][:, i], gold_t[f"hidden.{l}"][:n2])
    for s, n in ((1, 12), (2, 16)):
        assert g[f"step{s}.block"].tolist() == [gold_t["tokens"][n]] + [511] * (block - 1)
        assert g[f"step{s}.logits"].shape == (block - 1, 512)


@pytest.mark.parametrize("name", DRAFTERS)
def test_numpy_drafter_reproduces_golden_logits(name, target):
    t, _ = target
    raw = json.loads((DATA / "drafter" / name / "config.json").read_text())
    w = safetensors_bf16(DATA / "drafter" / name / "model.safetensors")
    meta, g = gguf_arrays(DATA / "golden" / f"{name}.gguf")
    for s in (1, 2):
        got = draft(raw, w, g["features"].astype(np.float64), meta[f"golden.step{s}.n_ctx"],
                    g[f"step{s}.block"], t["token_embd.weight"], t["output.weight"])
        np.testing.assert_allclose(got, g[f"step{s}.logits"], atol=2e-5, rtol=0)
    # the two steps and the slots differ by far more than the tolerance
    assert np.abs(g["step1.logits"] - g["step2.logits"]).max() > 1.0
    assert np.abs(np.diff(g["step1.logits"], axis=0)).max(-1).min() > 0.1
