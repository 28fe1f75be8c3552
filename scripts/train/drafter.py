"""The DFlash drafter as a trainable PyTorch module, its config.json and its export.

The forward pass is DESIGN section 7 (the same as scripts/dflash_ref.py, which tandem's C drafter
is tested against), batched over many blocks of one sequence at once, as the DFlash recipe
trains: for an anchor position a the block is [token a, MASK x (B-1)] at positions a..a+B-1;
its queries see the context features of positions < a (the committed context at inference
time: the anchor is the pending token, which has no target features yet) and all B keys of
their own block, never another block. Slot k is trained to predict token a+k.
"""
from __future__ import annotations


import torch
import torch.nn as nn
import torch.nn.functional as F


def config_json(s: dict) -> dict:
    """config.json shaped like z-lab's DFlash checkpoints (tests/data/dflash/*.json)."""
    eos = s["eos_id"]
    return {
        "architectures": ["DFlashDraftModel"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "block_size": s["block"],
        "bos_token_id": None,
        "dflash_config": {"mask_token_id": s["mask_id"], "target_layer_ids": s["taps"]},
        "dtype": "bfloat16",
        "eos_token_id": eos,
        "head_dim": s["d_head_dim"],
        "hidden_act": "silu",
        "hidden_size": s["hidden"],
        "initializer_range": 0.02,
        "intermediate_size": s["d_ffn"],
        "layer_types": ["full_attention"] * s["d_layers"],
        "max_position_embeddings": 4 * s["ctx"],
        "max_window_layers": s["d_layers"],
        "model_type": "qwen3",
        "num_attention_heads": s["d_heads"],
        "num_hidden_layers": s["d_layers"],
        "num_key_value_heads": s["d_kv_heads"],
        "num_target_layers": s["layers"],
        "pad_token_id": eos,
        "rms_norm_eps": 1e-6,
        "rope_scaling": None,
        "rope_theta": s["rope_theta"],
        "sliding_window": None,
        "tie_word_embeddings": False,
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": s["vocab"],
    }


def sizes_from_config(cfg: dict) -> dict:
    """The sizes.py keys Drafter reads, recovered from an exported config.json."""
    d = cfg["dflash_config"]
    return {"hidden": cfg["hidden_size"], "taps": d["target_layer_ids"],
            "d_layers": cfg["num_hidden_layers"], "d_heads": cfg["num_attention_heads"],
            "d_kv_heads": cfg["num_key_value_heads"], "d_head_dim": cfg["head_dim"],
            "d_ffn": cfg["intermediate_size"], "rope_theta": float(cfg["rope_theta"]),
            "block": cfg["block_size"], "mask": d["mask_token_id"]}


def wide(x: torch.Tensor) -> torch.dtype:
    """The type norms, RoPE and softmax run in: f32, or f64 for an f64 check."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


class RMSNorm(nn.Module):
    """Plain RMSNorm (x / rms * w), as the drafter stores it."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        xf = x.to(wide(x))
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) \
            * self.weight.to(x.dtype)


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """NeoX RoPE on the full head dim; x [..., n, heads, d], pos broadcastable to [..., n]."""
    half = x.shape[-1] // 2
    inv = theta ** (-torch.arange(half, device=x.device, dtype=torch.float64) / half)
    ang = (pos.double()[..., None] * inv).to(wide(x))      # [..., n, half]
    c, s = torch.cos(ang)[..., None, :], torch.sin(ang)[..., None, :]
    a, b = x[..., :half].to(wide(x)), x[..., half:].to(wide(x))
    return torch.cat([a * c - b * s, b * c + a * s], dim=-1).to(x.dtype)


def block_mask(anchors: torch.Tensor, K: int, Sc: int) -> torch.Tensor:
    """Which keys each query sees in one attention over [context ; every block]: a block's
    queries see the context positions before its anchor and the K keys of their own block,
    nothing else. anchors [B, N] -> bool [B, 1, N * K, Sc + N * K]."""
    B, N = anchors.shape
    dev = anchors.device
    seen = torch.arange(Sc, device=dev)[None, None, None, :] < anchors[:, :, None, None]
    blk = torch.arange(N, device=dev).repeat_interleave(K)
    own = (blk[:, None] == blk[None, :]).expand(B, N * K, N * K)
    return torch.cat([seen.expand(B, N, K, Sc).reshape(B, N * K, Sc), own], dim=-1)[:, None]


class Layer(nn.Module):
    def __init__(self, s: dict):
        super().__init__()
        H, nh, nkv, d, f = s["hidden"], s["d_heads"], s["d_kv_heads"], s["d_head_dim"], s["d_ffn"]
        self.nh, self.nkv, self.d = nh, nkv, d
        self.input_layernorm = RMSNorm(H)
        self.post_attention_layernorm = RMSNorm(H)
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(H, nh * d, bias=False)
        self.self_attn.k_proj = nn.Linear(H, nkv * d, bias=False)
        self.self_attn.v_proj = nn.Linear(H, nkv * d, bias=False)
        self.self_attn.o_proj = nn.Linear(nh * d, H, bias=False)
        self.self_attn.q_norm = RMSNorm(d)
        self.self_attn.k_norm = RMSNorm(d)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(H, f, bias=False)
        self.mlp.up_proj = nn.Linear(H, f, bias=False)
        self.mlp.down_proj = nn.Linear(f, H, bias=False)

    def forward(self, x, ctx, anchors, theta, mask=None):
        """x [B, N, K, H] block stream (N blocks of K slots); ctx [B, S, H] fused context
        features; anchors [B, N] absolute position of each block's slot 0; mask: block_mask
        of these (made here when not given)."""
        B, N, K, _ = x.shape
        Sc = ctx.shape[1]
        a, nh, nkv, d = self.self_attn, self.nh, self.nkv, self.d
        h = self.input_layernorm(x)
        blk_pos = anchors[:, :, None] + torch.arange(K, device=x.device)      # [B, N, K]
        ctx_pos = torch.arange(Sc, device=x.device)
        q = rope(a.q_norm(a.q_proj(h).view(B, N, K, nh, d)), blk_pos, theta)
        kb = rope(a.k_norm(a.k_proj(h).view(B, N, K, nkv, d)), blk_pos, theta)
        vb = a.v_proj(h).view(B, N * K, nkv, d)
        kc = rope(a.k_norm(a.k_proj(ctx).view(B, Sc, nkv, d)), ctx_pos, theta)  # H_t as it is
        vc = a.v_proj(ctx).view(B, Sc, nkv, d)
        # One attention over [context ; every block] (block_mask says who sees what); keys
        # are repeated per query head (query head j reads KV head j div (nh / nkv)).
        k = torch.cat([kc, kb.reshape(B, N * K, nkv, d)], 1).repeat_interleave(nh // nkv, 2)
        v = torch.cat([vc, vb], 1).repeat_interleave(nh // nkv, 2)
        if mask is None:
            mask = block_mask(anchors, K, Sc)
        out = F.scaled_dot_product_attention(q.reshape(B, N * K, nh, d).transpose(1, 2),
                                             k.transpose(1, 2), v.transpose(1, 2),
                                             attn_mask=mask)                 # [B, nh, NK, d]
        x = x + a.o_proj(out.transpose(1, 2).reshape(B, N, K, nh * d))
        h = self.post_attention_layernorm(x)
        m = self.mlp
        return x + m.down_proj(F.silu(m.gate_proj(h)) * m.up_proj(h))


class Drafter(nn.Module):
    """Tensor names follow the z-lab checkpoints: fc, hidden_norm, layers.N.*, norm."""

    def __init__(self, s: dict):
        super().__init__()
        H = s["hidden"]
        self.s = s
        self.fc = nn.Linear(len(s["taps"]) * H, H, bias=False)
        self.hidden_norm = RMSNorm(H)
        self.layers = nn.ModuleList([Layer(s) for _ in range(s["d_layers"])])
        self.norm = RMSNorm(H)
        for mod in self.modules():
            if isinstance(mod, nn.Linear):
                nn.init.normal_(mod.weight, std=0.02)

    def forward(self, feats, block_emb, anchors):
        """feats [B, S, n_taps * H] target tap outputs (concatenated in taps order);
        block_emb [B, N, K, H] token embeddings of the blocks; anchors [B, N].
        Returns the final-normed hidden states [B, N, K, H] (the LM head is the target's)."""
        ctx = self.hidden_norm(self.fc(feats))
        x = block_emb
        mask = block_mask(anchors, x.shape[2], ctx.shape[1])
        for layer in self.layers:
            x = layer(x, ctx, anchors, self.s["rope_theta"], mask)
        return self.norm(x)

    def export_state(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().to("cpu", torch.bfloat16).contiguous()
                for k, v in self.state_dict().items()}
