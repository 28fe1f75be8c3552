#!/usr/bin/env python3
"""Builds the tiny random test models and their golden outputs.

    python3 scripts/train_tokenizer.py   # only to rebuild the vocabulary (committed)
    python3 scripts/make_golden.py       # tests/data/models/*.gguf, tests/data/golden/*.gguf
    python3 scripts/dflash_ref.py        # tests/data/drafter/*, tests/data/golden/dflash-*.gguf
    python3 -m pytest -q tests/py/test_converter.py

Needs torch and transformers (5.24 here: Qwen3 and Qwen3.5 modelling code) besides numpy, gguf,
tokenizers and safetensors. Deterministic (fixed seeds, CPU, one thread): a re-run rewrites every
file byte for byte. Models:
  qwen3-tiny   Qwen3ForCausalLM, 4 layers, hidden 64, 4 q / 2 kv heads x 16, FFN 96, untied.
               Files: f32.
  qwen3-tied   Qwen3ForCausalLM, 2 layers, hidden 256 (so rows fit 256-weight K-quant blocks),
               4 q / 2 kv heads x 16, FFN 64, tied embeddings. Files: q4_k, q5_k, q6_k, q4_k_m.
  qwen35-tiny  Qwen3_5ForCausalLM (text), 8 layers (DeltaNet x3 + attention, twice), hidden 32,
               attention 4 q / 2 kv heads x 16 with output gate and partial RoPE (4 of 16 dims),
               DeltaNet 2 key heads / 6 value heads x 16, conv kernel 4, FFN 64, untied, plus one
               MTP block (block_count 9, nextn_predict_layers 1). Files: f32, bf16, q8_0.
All use the 512-token vocabulary of tests/data/models/tokenizer*.json. Which types go with which
model keeps tests/data under 5 MB while every type appears: Q8_0 and F16 tensors also sit in the
K-quant files, where rows of 64 cannot hold 256-weight blocks (see convert_hf_to_gguf.py).

Each model file tests/data/models/<model>-<type>.gguf comes with tests/data/golden/<model>-<type>.gguf,
computed by Hugging Face transformers (float64 model; some of its ops run in float32) from the
weights exactly as stored in that file (dequantised with gguf.quants.dequantize, stored-form
conventions undone). Golden tensors (numpy shapes, row-major; GGUF ne is the reverse):
  tokens                       I32 [T]          input ids, T = 24, positions 0..T-1
  logits                       F32 [T, V]       logits at every position
  hidden.<l>                   F32 [T, H]       residual stream after layer l (l < n_main),
                                                before the final norm
  cont.logits                  F32 [T-P, V]     second chunk of a two-chunk run: tokens[0:P]
  cont.hidden.<l>              F32 [T-P, H]     with an empty cache, then tokens[P:T] (P = 16)
  prefix.blk.<l>.k / .v        F32 [n_kv, P, d] attention layers: cached K (after k_norm and
                                                RoPE) and V after the first chunk
  prefix.blk.<l>.ssm_state     F32 [n_v, d_k, d_v]  DeltaNet layers after the first chunk:
                                                recurrent state S (o = S^T q), value heads in GGUF
                                                (tiled) order
  prefix.blk.<l>.conv_state    F32 [K-1, C]     DeltaNet layers: the K-1 raw conv inputs before
                                                position P, oldest first, channels in GGUF order
Metadata: golden.model (the model file name), golden.n_prefix (P).
"""
from __future__ import annotations

import json
import pathlib
import shutil
import sys
import tempfile

import numpy as np
import torch

import gguf
from safetensors.torch import save_file

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import convert_hf_to_gguf as conv  # noqa: E402

ROOT = HERE.parent
MODELS_DIR = ROOT / "tests" / "data" / "models"
GOLDEN_DIR = ROOT / "tests" / "data" / "golden"
N_TOKENS = 24
N_PREFIX = 16
BOS, EOS, PAD = "<|endoftext|>", "<|im_end|>", "<|endoftext|>"
PROMPT = ("<|im_start|>user\nWhat is 3 + 4? Answer briefly, please.<|im_end|>\n"
          "<|im_start|>assistant\n<think>\nThe sum is 7.\n</think>\n\nIt is 7.<|im_end|>")

MODELS = {
    "qwen3-tiny": dict(kind="qwen3", seed=1, hidden=64, layers=4, heads=4, kv_heads=2,
                       head_dim=16, ffn=96, tied=False, types=["f32"]),
    "qwen3-tied": dict(kind="qwen3", seed=2, hidden=256, layers=2, heads=4, kv_heads=2,
                       head_dim=16, ffn=64, tied=True,
                       types=["q4_k", "q5_k", "q6_k", "q4_k_m"]),
    "qwen35-tiny": dict(kind="qwen35", seed=3, hidden=32, layers=8, heads=4, kv_heads=2,
                        head_dim=16, ffn=64, tied=False, k_heads=2, v_heads=6, ssm_dim=16,
                        mtp=1, types=["f32", "bf16", "q8_0"]),
}


def tokenizer_path(kind: str) -> pathlib.Path:
    return MODELS_DIR / ("tokenizer-qwen35.json" if kind == "qwen35" else "tokenizer.json")


def chat_template(kind: str) -> str:
    """The family's real chat template (copies of Qwen3.5-4B's and Qwen3-0.6B's)."""
    return (MODELS_DIR / f"chat-template-{kind}.jinja").read_text(encoding="utf-8")


def hf_config(spec: dict, vocab: dict):
    import transformers
    common = dict(vocab_size=len(vocab), hidden_size=spec["hidden"],
                  intermediate_size=spec["ffn"], num_hidden_layers=spec["layers"],
                  num_attention_heads=spec["heads"], num_key_value_heads=spec["kv_heads"],
                  head_dim=spec["head_dim"], rms_norm_eps=1e-6, max_position_embeddings=4096,
                  tie_word_embeddings=spec["tied"], bos_token_id=vocab[BOS],
                  eos_token_id=vocab[EOS], pad_token_id=vocab[PAD])
    if spec["kind"] == "qwen3":
        cfg = transformers.Qwen3Config(
            rope_parameters={"rope_type": "default", "rope_theta": 1e6}, **common)
        cfg.architectures = ["Qwen3ForCausalLM"]
    else:
        cfg = transformers.Qwen3_5TextConfig(
            rope_parameters={"rope_type": "default", "rope_theta": 1e7,
                             "partial_rotary_factor": 0.25, "mrope_section": [1, 1, 0],
                             "mrope_interleaved": True},
            linear_conv_kernel_dim=4, linear_key_head_dim=spec["ssm_dim"],
            linear_value_head_dim=spec["ssm_dim"], linear_num_key_heads=spec["k_heads"],
            linear_num_value_heads=spec["v_heads"], full_attention_interval=4, **common)
        cfg.architectures = ["Qwen3_5ForCausalLM"]
    cfg._attn_implementation = "eager"
    return cfg


def hf_model(cfg):
    import transformers
    cls = (transformers.Qwen3ForCausalLM if cfg.architectures[0] == "Qwen3ForCausalLM"
           else transformers.Qwen3_5ForCausalLM)
    return cls(cfg).eval()


def weights_random(model, spec: dict) -> dict[str, torch.Tensor]:
    """Random float32 weights, larger than the default init so logits are far from flat.
    Matrices N(0, 2/sqrt(fan_in)); norms around 1 (as the model applies them); A_log, dt_bias
    spread so the DeltaNet decay ranges from almost none to strong."""
    g = torch.Generator().manual_seed(spec["seed"])
    zero_centred = spec["kind"] == "qwen35"   # Qwen3.5 RMSNorm applies 1 + w
    out = {}
    for name, p in sorted(model.state_dict().items()):
        if name == "lm_head.weight" and spec["tied"]:
            continue
        shape = tuple(p.shape)
        if name.endswith("A_log"):
            t = torch.empty(shape).uniform_(0.05, 1.5, generator=g).log()
        elif name.endswith("dt_bias"):
            t = torch.randn(shape, generator=g) * 0.5
        elif name.endswith("norm.weight"):
            t = torch.randn(shape, generator=g) * 0.15
            if not (zero_centred and not name.endswith("linear_attn.norm.weight")):
                t = t + 1.0
        elif name.endswith("conv1d.weight"):
            t = torch.randn(shape, generator=g) * 0.4
        else:
            t = torch.randn(shape, generator=g) * (2.0 / shape[-1] ** 0.5)
        out[name] = t.float().contiguous()
    if spec.get("mtp"):
        out.update(mtp_random(spec, g))
    return out


def mtp_random(spec: dict, g: torch.Generator) -> dict[str, torch.Tensor]:
    """A Qwen3.5 MTP block shaped like the published checkpoints' mtp.* tensors (transformers
    does not run it; it is here so the converter's block_count / nextn handling is exercised)."""
    h, hd, nh, nkv, f = (spec[k] for k in ("hidden", "head_dim", "heads", "kv_heads", "ffn"))
    shapes = {
        "mtp.fc.weight": (h, 2 * h),
        "mtp.pre_fc_norm_embedding.weight": (h,), "mtp.pre_fc_norm_hidden.weight": (h,),
        "mtp.norm.weight": (h,),
        "mtp.layers.0.input_layernorm.weight": (h,),
        "mtp.layers.0.post_attention_layernorm.weight": (h,),
        "mtp.layers.0.self_attn.q_proj.weight": (2 * nh * hd, h),
        "mtp.layers.0.self_attn.k_proj.weight": (nkv * hd, h),
        "mtp.layers.0.self_attn.v_proj.weight": (nkv * hd, h),
        "mtp.layers.0.self_attn.o_proj.weight": (h, nh * hd),
        "mtp.layers.0.self_attn.q_norm.weight": (hd,),
        "mtp.layers.0.self_attn.k_norm.weight": (hd,),
        "mtp.layers.0.mlp.gate_proj.weight": (f, h), "mtp.layers.0.mlp.up_proj.weight": (f, h),
        "mtp.layers.0.mlp.down_proj.weight": (h, f),
    }
    return {n: (torch.randn(s, generator=g) * (0.15 if len(s) == 1 else 2.0 / s[-1] ** 0.5))
            .float().contiguous() for n, s in shapes.items()}


def checkpoint_save(path: pathlib.Path, cfg, weights: dict, spec: dict) -> None:
    """A Hugging Face checkpoint directory: config.json, model.safetensors, tokenizer files."""
    path.mkdir(parents=True, exist_ok=True)
    d = cfg.to_dict()
    if spec.get("mtp"):
        d["mtp_num_hidden_layers"] = spec["mtp"]
    (path / "config.json").write_text(json.dumps(d, indent=2, sort_keys=True))
    save_file(weights, str(path / "model.safetensors"))
    shutil.copyfile(tokenizer_path(spec["kind"]), path / "tokenizer.json")
    tc = {"tokenizer_class": "Qwen2Tokenizer", "bos_token": None, "eos_token": EOS,
          "pad_token": PAD, "add_bos_token": False, "model_max_length": 4096,
          "chat_template": chat_template(spec["kind"])}
    (path / "tokenizer_config.json").write_text(json.dumps(tc, indent=2))


def gguf_tensors(path: pathlib.Path) -> dict[str, np.ndarray]:
    """Every tensor of a GGUF file, dequantised, in numpy shape (reverse of ne)."""
    r = gguf.GGUFReader(str(path))
    return {t.name: gguf.quants.dequantize(t.data, t.tensor_type)
            .reshape(tuple(int(n) for n in reversed(t.shape))) for t in r.tensors}


def hf_state_from_gguf(path: pathlib.Path, cfg_dict: dict, hf_names: list[str]) -> dict:
    """The HF state dict (float64) whose conversion is the file: stored conventions undone."""
    stored = gguf_tensors(path)
    state = {}
    for hf in hf_names:
        g = conv.gguf_name(hf, cfg_dict)
        if g is None:            # lm_head of a tied model
            g = "token_embd.weight"
        state[hf] = torch.from_numpy(conv.tensor_untransform(g, stored[g], cfg_dict))
    return state


def run_layers(model, ids: torch.Tensor, cache=None):
    """Logits and the output of every decoder layer for ids (batch 1)."""
    outs = []
    hooks = [layer.register_forward_hook(lambda m, a, o: outs.append(
        (o[0] if isinstance(o, tuple) else o).detach()))
        for layer in model.model.layers]
    try:
        with torch.no_grad():
            res = model(input_ids=ids, cache=cache, use_cache=cache is not None)
    finally:
        for h in hooks:
            h.remove()
    return res.logits[0], [o[0] for o in outs]


def golden_compute(model, cfg_dict: dict, tokens: list[int]) -> dict[str, np.ndarray]:
    from transformers import DynamicCache
    ids = torch.tensor([tokens])
    logits, hidden = run_layers(model, ids)
    out = {"tokens": np.array(tokens, dtype=np.int32), "logits": logits}
    out.update({f"hidden.{l}": h for l, h in enumerate(hidden)})
    cache = DynamicCache(config=model.config)
    logits1, _ = run_layers(model, ids[:, :N_PREFIX], cache)
    assert torch.allclose(logits1, logits[:N_PREFIX], atol=1e-4), "prefix run differs"
    for l, layer in enumerate(cache.layers):
        if hasattr(layer, "recurrent_states") and layer.recurrent_states.get(0) is not None:
            out.update(deltanet_state(l, layer, cfg_dict))
        else:
            out[f"prefix.blk.{l}.k"] = layer.keys[0]
            out[f"prefix.blk.{l}.v"] = layer.values[0]
    logits2, hidden2 = run_layers(model, ids[:, N_PREFIX:], cache)
    out["cont.logits"] = logits2
    out.update({f"cont.hidden.{l}": h for l, h in enumerate(hidden2)})
    return {k: (v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in out.items()}


def deltanet_state(l: int, layer, cfg: dict) -> dict[str, torch.Tensor]:
    """S and the conv window after the prefix, in GGUF head / channel order."""
    n_k, n_v = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    s = layer.recurrent_states[0][0].numpy()                        # [n_v, dk, dv], HF order
    s = conv.vheads_reorder(s.reshape(n_v, dk * dv), 0, n_k, n_v, 1).reshape(n_v, dk, dv)
    win = layer.conv_states[0][0].numpy()[:, 1:]                     # [C, K-1], oldest first
    qk = 2 * n_k * dk
    win = np.concatenate([win[:qk], conv.vheads_reorder(win[qk:], 0, n_k, n_v, dv)])
    return {f"prefix.blk.{l}.ssm_state": torch.from_numpy(np.ascontiguousarray(s)),
            f"prefix.blk.{l}.conv_state": torch.from_numpy(np.ascontiguousarray(win.T))}


def golden_write(path: pathlib.Path, model_file: str, gold: dict) -> None:
    w = gguf.GGUFWriter(str(path), "golden")
    w.add_string("golden.model", model_file)
    w.add_uint32("golden.n_prefix", N_PREFIX)
    for name, v in gold.items():
        w.add_tensor(name, np.ascontiguousarray(v.astype(np.int32 if v.dtype.kind == "i"
                                                         else np.float32)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def golden_tokens() -> list[int]:
    from tokenizers import Tokenizer
    ids = Tokenizer.from_file(str(tokenizer_path("qwen3"))).encode(PROMPT).ids
    assert len(ids) >= N_TOKENS, len(ids)
    return ids[:N_TOKENS]


def model_build(name: str, spec: dict, tmp: pathlib.Path, tokens: list[int]) -> None:
    vocab = json.loads(tokenizer_path(spec["kind"]).read_text())
    vocab = {**vocab["model"]["vocab"], **{a["content"]: a["id"] for a in vocab["added_tokens"]}}
    cfg = hf_config(spec, vocab)
    torch.manual_seed(spec["seed"])
    model = hf_model(cfg)
    weights = weights_random(model, spec)
    ckpt = tmp / name
    checkpoint_save(ckpt, cfg, weights, spec)
    cfg_dict = conv.config_load(ckpt)
    hf_names = list(model.state_dict())
    for qtype in spec["types"]:
        fname = f"{name}-{qtype}.gguf"
        out = MODELS_DIR / fname
        conv.convert(ckpt, out, qtype, name=name)
        ref = hf_model(cfg).double()
        ref.load_state_dict(hf_state_from_gguf(out, cfg_dict, hf_names), strict=True)
        gold = golden_compute(ref, cfg_dict, tokens)
        golden_write(GOLDEN_DIR / fname, fname, gold)
        top = gold["logits"].argmax(-1)
        print(f"{fname}: {out.stat().st_size} B, golden {(GOLDEN_DIR / fname).stat().st_size} B,"
              f" logits std {gold['logits'].std():.2f}, argmax {top[:8].tolist()}...")


def main() -> int:
    torch.set_num_threads(1)   # bit-identical reductions from run to run
    MODELS_DIR.mkdir(parents=True, exist_ok=True)
    GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
    tokens = golden_tokens()
    only = set(sys.argv[1:])
    with tempfile.TemporaryDirectory() as tmp:
        for name, spec in MODELS.items():
            if not only or name in only:
                model_build(name, spec, pathlib.Path(tmp), tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())
