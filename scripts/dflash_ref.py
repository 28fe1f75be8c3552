#!/usr/bin/env python3
"""A PyTorch reference of the DFlash drafter, written from DESIGN section 7 alone, and the tiny
drafters with golden outputs built on it.

    python3 scripts/make_golden.py    # first: the target qwen35-tiny-f32 and its golden file
    python3 scripts/dflash_ref.py     # tests/data/drafter/<name>/, tests/data/golden/<name>.gguf

Needs torch besides numpy, gguf and safetensors. Deterministic (fixed seeds, CPU, float64): a
re-run rewrites every file byte for byte. tests/py/test_dflash_golden.py checks the golden
logits again with a NumPy reading of the same section.

Drafters, all for the target tests/data/models/qwen35-tiny-f32.gguf (hidden 32, 8 layers,
vocabulary 512, mask token <|mask|> = 511); 2 layers, 4 q / 2 kv heads x 16, FFN 64, RoPE
theta 1e7, bf16 weights in model.safetensors beside a config.json shaped like z-lab's:
  dflash-b16   block 16; layer_types [full, full]; target_layer_ids [1, 3, 6].
  dflash-b8    top-level block_size 16 overridden by dflash_config.block_size 8; no
               target_layer_ids (default [1, 5]); input_embedding_scale 1.5; output_multiplier
               0.75 and final_logit_softcapping 6 in dflash_config; layer_types [sliding,
               sliding] with is_causal false and sliding_window 5 (|p - p'| < 5).
  dflash-swa   block 16; layer_types [sliding, full], sliding_window 6, no is_causal (so the
               sliding layer is causal: p' <= p and p - p' < 6); target_layer_ids [2, 5].

Two consecutive draft steps over the target's golden token sequence t (tokens of
tests/data/golden/qwen35-tiny-f32.gguf): step 1 has L1 = 12 committed tokens t[0:12] and
pending token t[12]; it accepts 3 drafts, so step 2 has L2 = 16 committed and pending t[16].
The reference attends to every committed position; a drafter that caches context K/V from
step 1 and adds positions 12..15 must give the same step 2 logits.

Golden tensors (tests/data/golden/<name>.gguf; numpy shapes, GGUF ne reversed):
  context.tokens   I32 [L2]              committed tokens t[0:L2]
  features         F32 [L2, n_taps, H]   the target's residual after each tap layer (in
                                         target_layer_ids order), from the target's golden file
  features.fused   F32 [L2, H]           hidden_norm(fc(concat(taps))) for each position
  step<s>.block    I32 [B]               block input [pending, mask x (B-1)] at L_s..L_s+B-1
  step<s>.logits   F32 [B-1, V]          drafter logits of slots 1..B-1 (slot k: position L_s+k)
Metadata: golden.drafter, golden.target (model file), golden.step1.n_ctx (L1),
golden.step2.n_ctx (L2), golden.block_size, golden.mask_token_id.
"""
from __future__ import annotations

import json
import math
import pathlib
import sys

import numpy as np
import torch

import gguf
from safetensors.torch import save_file

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODELS_DIR = ROOT / "tests" / "data" / "models"
GOLDEN_DIR = ROOT / "tests" / "data" / "golden"
DRAFTER_DIR = ROOT / "tests" / "data" / "drafter"
TARGET = "qwen35-tiny-f32.gguf"
MASK_TOKEN = 511
L1, ACCEPT = 12, 3


# --- configuration (DESIGN 7, "Config") ---------------------------------------------------------

def dflash_config(raw: dict, n_target: int | None = None) -> dict:
    """The settings the drafter runs with; keys in dflash_config override top-level ones."""
    c = {**raw, **(raw.get("dflash_config") or {})}
    n_draft = c["num_hidden_layers"]
    n_target = n_target or c.get("num_target_layers")
    ids = c.get("target_layer_ids")
    if ids is None:
        if n_draft == 1:
            ids = [n_target // 2]
        else:   # Python's round: half to even
            ids = [round(1 + i * (n_target - 4) / (n_draft - 1)) for i in range(n_draft)]
    rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", None):
        raise ValueError(f"RoPE scaling {rope_type!r} is not implemented")
    theta = rope.get("rope_theta", c.get("rope_theta", 10000.0))
    heads = c["num_attention_heads"]
    return {
        "hidden": c["hidden_size"], "ffn": c["intermediate_size"], "layers": n_draft,
        "heads": heads, "kv_heads": c.get("num_key_value_heads", heads),
        "head_dim": c.get("head_dim") or c["hidden_size"] // heads,
        "theta": float(theta), "eps": float(c.get("rms_norm_eps", 1e-6)),
        "block": int(c.get("block_size", 16)), "mask": int(c["mask_token_id"]),
        "taps": [int(i) for i in ids],
        "layer_types": list(c.get("layer_types") or ["full_attention"] * n_draft),
        "window": c.get("sliding_window"), "is_causal": c.get("is_causal"),
        "embed_scale": float(c.get("input_embedding_scale", 1.0)),
        "out_mult": c.get("output_multiplier"), "softcap": c.get("final_logit_softcapping"),
    }


# --- the drafter (DESIGN 7) ---------------------------------------------------------------------

def rmsnorm(x, w, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rope(x, pos, theta):
    """NeoX RoPE on the full head dim at absolute positions; x: [n, heads, d], pos: [n]."""
    half = x.shape[-1] // 2
    ang = pos[:, None].double() * theta ** (-torch.arange(half, dtype=torch.float64) / half)
    c, s = torch.cos(ang)[:, None, :], torch.sin(ang)[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * c - b * s, b * c + a * s], dim=-1)


def visible(layer_type: str, cfg: dict, q_pos, k_pos):
    """[nq, nk] mask of which keys each query sees (context and block keys alike)."""
    causal = cfg["is_causal"] if cfg["is_causal"] is not None else layer_type == "sliding_attention"
    d = q_pos[:, None] - k_pos[None, :]
    ok = torch.ones_like(d, dtype=torch.bool)
    if causal:
        ok &= d >= 0
    if layer_type == "sliding_attention":
        ok &= (d if causal else d.abs()) < cfg["window"]
    return ok


class Drafter:
    """Weights (float64) of one drafter; `draft` is one forward pass over one block."""

    def __init__(self, cfg: dict, weights: dict[str, torch.Tensor]):
        self.cfg, self.w = cfg, {k: v.double() for k, v in weights.items()}

    def fuse(self, taps: torch.Tensor) -> torch.Tensor:
        """taps [L, n_taps, H_target] -> H_t [L, H] = hidden_norm(fc(concat)), fc without bias."""
        x = taps.reshape(taps.shape[0], -1).double() @ self.w["fc.weight"].T
        return rmsnorm(x, self.w["hidden_norm.weight"], self.cfg["eps"])

    def draft(self, ctx: torch.Tensor, n_ctx: int, block_ids, embed, head) -> torch.Tensor:
        """Logits [B-1, V] of slots 1..B-1 for the block [pending, mask...] at n_ctx..n_ctx+B-1.
        ctx: H_t of the committed positions 0..n_ctx-1; embed, head: the target's token
        embedding and LM head (output.weight) as [V, H]."""
        c, w = self.cfg, self.w
        nh, nkv, d = c["heads"], c["kv_heads"], c["head_dim"]
        B = len(block_ids)
        ctx = ctx[:n_ctx]
        ctx_pos = torch.arange(n_ctx)
        blk_pos = n_ctx + torch.arange(B)
        k_pos = torch.cat([ctx_pos, blk_pos])
        x = embed[torch.as_tensor(block_ids)].double() * c["embed_scale"]
        for l in range(c["layers"]):
            p = f"layers.{l}."
            h = rmsnorm(x, w[p + "input_layernorm.weight"], c["eps"])
            q = (h @ w[p + "self_attn.q_proj.weight"].T).view(B, nh, d)
            q = rope(rmsnorm(q, w[p + "self_attn.q_norm.weight"], c["eps"]), blk_pos, c["theta"])
            kv_in = torch.cat([ctx, h])                 # H_t enters as it is, no input norm
            k = (kv_in @ w[p + "self_attn.k_proj.weight"].T).view(-1, nkv, d)
            k = rope(rmsnorm(k, w[p + "self_attn.k_norm.weight"], c["eps"]), k_pos, c["theta"])
            v = (kv_in @ w[p + "self_attn.v_proj.weight"].T).view(-1, nkv, d)
            ok = visible(c["layer_types"][l], c, blk_pos, k_pos)
            out = torch.empty(B, nh, d, dtype=torch.float64)
            for j in range(nh):
                kvh = j // (nh // nkv)
                s = (q[:, j] @ k[:, kvh].T) / math.sqrt(d)
                s = s.masked_fill(~ok, float("-inf"))
                out[:, j] = torch.softmax(s, dim=-1) @ v[:, kvh]
            x = x + out.reshape(B, -1) @ w[p + "self_attn.o_proj.weight"].T
            h = rmsnorm(x, w[p + "post_attention_layernorm.weight"], c["eps"])
            ff = torch.nn.functional.silu(h @ w[p + "mlp.gate_proj.weight"].T) \
                * (h @ w[p + "mlp.up_proj.weight"].T)
            x = x + ff @ w[p + "mlp.down_proj.weight"].T
        x = rmsnorm(x, w["norm.weight"], c["eps"])
        logits = x[1:] @ head.double().T
        if c["out_mult"] is not None:
            logits = logits * c["out_mult"]
        if c["softcap"] is not None:
            logits = torch.tanh(logits / c["softcap"]) * c["softcap"]
        return logits


# --- tiny drafters and their golden files -------------------------------------------------------

VARIANTS = {
    "dflash-b16": dict(seed=11, top={"block_size": 16, "layer_types": ["full_attention"] * 2},
                       dflash={"target_layer_ids": [1, 3, 6]}),
    "dflash-b8": dict(seed=12, top={"block_size": 16, "input_embedding_scale": 1.5,
                                    "layer_types": ["sliding_attention"] * 2, "sliding_window": 5,
                                    "is_causal": False, "use_sliding_window": True},
                      dflash={"block_size": 8, "output_multiplier": 0.75,
                              "final_logit_softcapping": 6.0}),
    "dflash-swa": dict(seed=13, top={"block_size": 16, "sliding_window": 6,
                                     "use_sliding_window": True,
                                     "layer_types": ["sliding_attention", "full_attention"]},
                       dflash={"target_layer_ids": [2, 5]}),
}


def config_json(v: dict) -> dict:
    raw = {
        "architectures": ["DFlashDraftModel"],
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "model_type": "qwen3", "dtype": "bfloat16", "attention_bias": False,
        "attention_dropout": 0.0, "hidden_act": "silu", "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "num_target_layers": 8,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000},
        "sliding_window": None, "use_sliding_window": False, "max_window_layers": 2,
        "tie_word_embeddings": False, "vocab_size": 512, "initializer_range": 0.02,
        "dflash_config": {"mask_token_id": MASK_TOKEN},
    }
    raw.update(v["top"])
    raw["dflash_config"].update(v["dflash"])
    return raw


def weights_random(cfg: dict, seed: int) -> dict[str, torch.Tensor]:
    """bf16 weights: matrices N(0, 2/sqrt(fan_in)), norms 1 + N(0, 0.15)."""
    g = torch.Generator().manual_seed(seed)
    H, F, nh, nkv, d = cfg["hidden"], cfg["ffn"], cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
    shapes = {"fc.weight": (H, len(cfg["taps"]) * H), "hidden_norm.weight": (H,),
              "norm.weight": (H,)}
    for l in range(cfg["layers"]):
        p = f"layers.{l}."
        shapes.update({p + "input_layernorm.weight": (H,),
                       p + "post_attention_layernorm.weight": (H,),
                       p + "self_attn.q_proj.weight": (nh * d, H),
                       p + "self_attn.k_proj.weight": (nkv * d, H),
                       p + "self_attn.v_proj.weight": (nkv * d, H),
                       p + "self_attn.o_proj.weight": (H, nh * d),
                       p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,),
                       p + "mlp.gate_proj.weight": (F, H), p + "mlp.up_proj.weight": (F, H),
                       p + "mlp.down_proj.weight": (H, F)})
    out = {}
    for name, s in sorted(shapes.items()):
        t = torch.randn(s, generator=g, dtype=torch.float64)
        t = 1.0 + 0.15 * t if len(s) == 1 else t * (2.0 / s[-1] ** 0.5)
        out[name] = t.to(torch.bfloat16).contiguous()
    return out


def gguf_arrays(path: pathlib.Path) -> dict[str, np.ndarray]:
    r = gguf.GGUFReader(str(path))
    out = {}
    for t in r.tensors:
        shape = tuple(int(n) for n in reversed(t.shape))
        if t.tensor_type == gguf.GGMLQuantizationType.I32:
            out[t.name] = np.array(t.data).reshape(shape)
        else:
            out[t.name] = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape)
    return out


def golden_write(path: pathlib.Path, meta: dict, tensors: dict) -> None:
    w = gguf.GGUFWriter(str(path), "golden")
    for k, v in meta.items():
        (w.add_string if isinstance(v, str) else w.add_uint32)(k, v)
    for name, v in tensors.items():
        v = np.asarray(v)
        w.add_tensor(name, np.ascontiguousarray(v.astype(np.int32 if v.dtype.kind in "iu"
                                                         else np.float32)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def variant_build(name: str, v: dict, target: dict, target_gold: dict) -> None:
    raw = config_json(v)
    cfg = dflash_config(raw)
    weights = weights_random(cfg, v["seed"])
    out = DRAFTER_DIR / name
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    drafter = Drafter(cfg, weights)
    tokens = target_gold["tokens"].astype(np.int64)
    L2 = L1 + ACCEPT + 1
    taps = np.stack([target_gold[f"hidden.{l}"][:L2] for l in cfg["taps"]], axis=1)
    fused = drafter.fuse(torch.from_numpy(taps))
    embed = torch.from_numpy(np.array(target["token_embd.weight"]))
    head = torch.from_numpy(np.array(target["output.weight"]))
    B = cfg["block"]
    gold = {"context.tokens": tokens[:L2], "features": taps, "features.fused": fused.numpy()}
    for s, n_ctx in ((1, L1), (2, L2)):
        block = [int(tokens[n_ctx])] + [cfg["mask"]] * (B - 1)
        logits = drafter.draft(fused, n_ctx, block, embed, head)
        gold[f"step{s}.block"] = np.array(block)
        gold[f"step{s}.logits"] = logits.numpy()
    meta = {"golden.drafter": name, "golden.target": TARGET, "golden.step1.n_ctx": L1,
            "golden.step2.n_ctx": L2, "golden.block_size": B, "golden.mask_token_id": cfg["mask"]}
    golden_write(GOLDEN_DIR / f"{name}.gguf", meta, gold)
    top = gold["step1.logits"].argmax(-1).tolist()
    print(f"{name}: taps {cfg['taps']}, B {B}, step1 argmax {top}, "
          f"logits std {gold['step1.logits'].std():.2f}")


def main() -> int:
    torch.set_num_threads(1)
    target = gguf_arrays(MODELS_DIR / TARGET)
    target_gold = gguf_arrays(GOLDEN_DIR / TARGET)
    for name, v in VARIANTS.items():
        variant_build(name, v, target, target_gold)
    return 0


if __name__ == "__main__":
    sys.exit(main())
