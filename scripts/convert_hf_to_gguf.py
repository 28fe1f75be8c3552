#!/usr/bin/env python3
"""Converts a Hugging Face checkpoint of Qwen3 or Qwen3.5 (text) to GGUF, laid out the way
llama.cpp's converter writes architectures `qwen3` and `qwen35`.

    python3 scripts/convert_hf_to_gguf.py MODEL_DIR --outfile OUT.gguf --outtype q4_k_m

MODEL_DIR holds config.json, model.safetensors (or shards with model.safetensors.index.json),
tokenizer.json and tokenizer_config.json (chat template there or in chat_template.jinja).
Accepted: Qwen3ForCausalLM (-> qwen3); Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration
(text part only; vision tensors are dropped) (-> qwen35). Needs numpy and gguf, not torch.

What the qwen35 conversion does (DESIGN section 5):
  - every norm except the DeltaNet output norm (linear_attn.norm -> ssm_norm) is stored as 1 + w;
  - A_log -> ssm_a = -exp(A_log); dt_bias -> ssm_dt.bias; conv1d [C, 1, K] -> [C, K] (ne {K, C});
  - value heads are re-ordered from grouped-by-key-head to tiled: HF value head k*r + j (key head k,
    r = n_v / n_k) becomes GGUF head j*n_k + k, in attn_qkv (v rows), attn_gate, ssm_alpha,
    ssm_beta, ssm_a, ssm_dt, ssm_conv1d (v channels) and ssm_out (input columns);
  - the MTP block (mtp.*) becomes block n_main: mtp.layers.0.* as a normal layer plus nextn.eh_proj,
    nextn.enorm, nextn.hnorm, nextn.shared_head_norm; block_count = n_main + mtp layers and
    `qwen35.nextn_predict_layers` says how many trailing blocks are MTP.

Output types (--outtype): f32, f16, bf16, q8_0, q4_k, q5_k, q6_k, q4_k_m. 1-D tensors, ssm_a,
ssm_dt.bias and ssm_conv1d stay F32 in every type, as llama.cpp keeps them. A tensor whose rows
do not fit the requested block (256 for K-quants, 32 for Q8_0) falls back to Q8_0, then F16.
q4_k_m is a Q4_K_M-like mix (see tensor_type_mix) holding Q4_K, Q5_K, Q6_K, Q8_0, F16, F32.
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import re
import sys

import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import kquant  # noqa: E402

ARCHS = {
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3_5ForCausalLM": "qwen35",
    "Qwen3_5ForConditionalGeneration": "qwen35",
}
OUTTYPES = {  # name -> (default 2-D type, general.file_type)
    "f32": (QT.F32, gguf.LlamaFileType.ALL_F32),
    "f16": (QT.F16, gguf.LlamaFileType.MOSTLY_F16),
    "bf16": (QT.BF16, gguf.LlamaFileType.MOSTLY_BF16),
    "q8_0": (QT.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
    "q4_k": (QT.Q4_K, gguf.LlamaFileType.MOSTLY_Q4_K_S),
    "q5_k": (QT.Q5_K, gguf.LlamaFileType.MOSTLY_Q5_K_S),
    "q6_k": (QT.Q6_K, gguf.LlamaFileType.MOSTLY_Q6_K),
    "q4_k_m": (QT.Q4_K, gguf.LlamaFileType.MOSTLY_Q4_K_M),
}


class ConvertError(Exception):
    """The checkpoint cannot be converted; the message says why."""


# --- configuration -------------------------------------------------------------------------

def config_load(model_dir: pathlib.Path) -> dict:
    """config.json with a text_config (multimodal checkpoints) merged over the top level."""
    path = model_dir / "config.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConvertError(f"{path}: {e}") from None
    if isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg, **cfg["text_config"]}
    archs = cfg.get("architectures") or []
    arch = next((ARCHS[a] for a in archs if a in ARCHS), None)
    if arch is None and cfg.get("model_type") == "qwen3_5_text":
        arch = "qwen35"
    if arch is None:
        raise ConvertError(f"{path}: architectures {archs} not supported "
                           f"(supported: {', '.join(ARCHS)})")
    cfg["_arch"] = arch
    return cfg


def rope_params(cfg: dict) -> dict:
    rp = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    rp.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
    rope_type = rp.get("rope_type", rp.get("type", "default"))
    if rope_type not in ("default", None):
        raise ConvertError(f"RoPE type {rope_type!r} is not supported (only default RoPE)")
    return rp


def layer_interval(cfg: dict) -> int:
    """full_attention_interval, checked against layer_types when both are given."""
    n = cfg["num_hidden_layers"]
    interval = cfg.get("full_attention_interval")
    types = cfg.get("layer_types")
    if interval is None and types:
        full = [i for i, t in enumerate(types) if t == "full_attention"]
        interval = full[0] + 1 if full else n + 1
    interval = int(interval or 4)
    if types:
        want = ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                for i in range(n)]
        if list(types) != want:
            raise ConvertError("layer_types is not a periodic pattern with one full-attention "
                               "layer every full_attention_interval layers; qwen35 GGUF cannot "
                               "express it")
    return interval


def head_dim(cfg: dict) -> int:
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def metadata_write(w: gguf.GGUFWriter, cfg: dict, file_type: int, name: str) -> int:
    """Writes general.* and <arch>.* keys; returns block_count."""
    arch = cfg["_arch"]
    if cfg.get("attention_bias"):
        raise ConvertError("attention_bias = true is not supported")
    rp = rope_params(cfg)
    n_main = cfg["num_hidden_layers"]
    n_mtp = int(cfg.get("mtp_num_hidden_layers", 0) or 0) if arch == "qwen35" else 0
    hd = head_dim(cfg)
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(name)
    w.add_block_count(n_main + n_mtp)
    w.add_context_length(int(cfg.get("max_position_embeddings", 4096)))
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg.get("num_key_value_heads", cfg["num_attention_heads"]))
    w.add_rope_freq_base(float(rp["rope_theta"]))
    w.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-6)))
    w.add_key_length(hd)
    w.add_value_length(hd)
    if arch == "qwen35":
        prf = rp.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25))
        sections = list(rp.get("mrope_section") or [11, 11, 10])[:4]
        sections += [0] * (4 - len(sections))
        w.add_rope_dimension_sections(sections)
        w.add_rope_dimension_count(int(hd * prf))
        w.add_ssm_conv_kernel(cfg.get("linear_conv_kernel_dim", 4))
        w.add_ssm_state_size(cfg["linear_key_head_dim"])
        w.add_ssm_group_count(cfg["linear_num_key_heads"])
        w.add_ssm_time_step_rank(cfg["linear_num_value_heads"])
        w.add_ssm_inner_size(cfg["linear_value_head_dim"] * cfg["linear_num_value_heads"])
        w.add_full_attention_interval(layer_interval(cfg))
        if n_mtp:
            w.add_uint32(f"{arch}.nextn_predict_layers", n_mtp)
    w.add_file_type(int(file_type))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    return n_main + n_mtp


# --- safetensors reading (numpy only) --------------------------------------------------------

_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64}


def safetensors_read(path: pathlib.Path) -> dict[str, np.ndarray]:
    """All tensors of one safetensors file as float32 arrays."""
    raw = path.read_bytes()
    if len(raw) < 8:
        raise ConvertError(f"{path}: truncated safetensors header")
    n = int.from_bytes(raw[:8], "little")
    if 8 + n > len(raw):
        raise ConvertError(f"{path}: header length {n} runs past the end of the file")
    try:
        header = json.loads(raw[8:8 + n])
    except ValueError as e:
        raise ConvertError(f"{path}: header is not JSON: {e}") from None
    body = memoryview(raw)[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = _ST_DTYPES.get(info["dtype"])
        if dt is None:
            raise ConvertError(f"{path}: tensor {name}: dtype {info['dtype']} not supported")
        lo, hi = info["data_offsets"]
        count = math.prod(info["shape"])
        if hi > len(body) or hi - lo != count * np.dtype(dt).itemsize:
            raise ConvertError(f"{path}: tensor {name}: data_offsets do not match its shape")
        a = np.frombuffer(body[lo:hi], dtype=dt).reshape(info["shape"])
        if info["dtype"] == "BF16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        out[name] = a.astype(np.float32)
    return out


def checkpoint_read(model_dir: pathlib.Path) -> dict[str, np.ndarray]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in model_dir.glob("model*.safetensors"))
    if not files:
        raise ConvertError(f"{model_dir}: no model*.safetensors")
    tensors = {}
    for f in files:
        tensors.update(safetensors_read(model_dir / f))
    return tensors


# --- tensor names and transforms ----------------------------------------------------------------

LAYER_NAMES = {  # HF name inside a layer -> GGUF name inside blk.N
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "linear_attn.in_proj_qkv.weight": "attn_qkv.weight",
    "linear_attn.in_proj_z.weight": "attn_gate.weight",
    "linear_attn.in_proj_b.weight": "ssm_beta.weight",
    "linear_attn.in_proj_a.weight": "ssm_alpha.weight",
    "linear_attn.conv1d.weight": "ssm_conv1d.weight",
    "linear_attn.dt_bias": "ssm_dt.bias",
    "linear_attn.A_log": "ssm_a",
    "linear_attn.norm.weight": "ssm_norm.weight",
    "linear_attn.out_proj.weight": "ssm_out.weight",
}
MTP_NAMES = {  # mtp.<name> -> blk.<n_main>.<name>
    "fc.weight": "nextn.eh_proj.weight",
    "pre_fc_norm_embedding.weight": "nextn.enorm.weight",
    "pre_fc_norm_hidden.weight": "nextn.hnorm.weight",
    "norm.weight": "nextn.shared_head_norm.weight",
}


def gguf_name(hf: str, cfg: dict) -> str | None:
    """GGUF name of a HF tensor name; None for tensors that are not converted (vision)."""
    arch = cfg["_arch"]
    hf = re.sub(r"^model\.language_model\.", "model.", hf)
    if hf.startswith(("model.visual.", "visual.")):
        return None
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return None if cfg.get("tie_word_embeddings") else "output.weight"
    m = re.match(r"^(?:model\.)?mtp\.(?:layers\.(\d+)\.)?(.+)$", hf)
    if m and arch == "qwen35":
        n_main = cfg["num_hidden_layers"]
        if m.group(1) is not None:
            bid, rest = n_main + int(m.group(1)), m.group(2)
        elif m.group(2) in MTP_NAMES:
            return f"blk.{n_main}.{MTP_NAMES[m.group(2)]}"
        else:
            raise ConvertError(f"unknown MTP tensor {hf}")
    else:
        m = re.match(r"^model\.layers\.(\d+)\.(.+)$", hf)
        if not m:
            raise ConvertError(f"unknown tensor {hf}")
        bid, rest = int(m.group(1)), m.group(2)
    if rest == "post_attention_layernorm.weight":
        return f"blk.{bid}." + ("post_attention_norm.weight" if arch == "qwen35"
                                else "ffn_norm.weight")
    if rest not in LAYER_NAMES:
        raise ConvertError(f"unknown tensor {hf}")
    return f"blk.{bid}.{LAYER_NAMES[rest]}"


def vheads_reorder(x: np.ndarray, axis: int, n_k: int, n_v: int, width: int,
                   inverse: bool = False) -> np.ndarray:
    """Re-orders n_v value heads of `width` along axis from grouped-by-key-head (HF: head
    k*r + j) to tiled (GGUF: head j*n_k + k), r = n_v / n_k; inverse=True goes back."""
    r = n_v // n_k
    shape = list(x.shape)
    axis %= len(shape)
    assert shape[axis] == n_v * width, (shape, axis, n_v, width)
    grouped = [n_k, r] if not inverse else [r, n_k]
    y = x.reshape(shape[:axis] + grouped + [width] + shape[axis + 1:])
    return np.swapaxes(y, axis, axis + 1).reshape(shape)


def tensor_transform(name: str, x: np.ndarray, cfg: dict) -> np.ndarray:
    """HF values -> stored values for GGUF tensor `name` (qwen35 conventions)."""
    if cfg["_arch"] != "qwen35":
        return x
    n_k, n_v = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    leaf = name.split(".", 2)[-1] if name.startswith("blk.") else name
    if leaf == "ssm_conv1d.weight":
        x = x.reshape(x.shape[0], x.shape[-1])
    if n_k != n_v:
        qk = 2 * n_k * dk
        if leaf in ("attn_qkv.weight", "ssm_conv1d.weight"):
            x = np.concatenate([x[:qk], vheads_reorder(x[qk:], 0, n_k, n_v, dv)])
        elif leaf == "attn_gate.weight":
            x = vheads_reorder(x, 0, n_k, n_v, dv)
        elif leaf in ("ssm_beta.weight", "ssm_alpha.weight", "ssm_a", "ssm_dt.bias"):
            x = vheads_reorder(x, 0, n_k, n_v, 1)
        elif leaf == "ssm_out.weight":
            x = vheads_reorder(x, 1, n_k, n_v, dv)
    if leaf == "ssm_a":
        x = -np.exp(x)
    elif leaf.endswith("norm.weight") and leaf != "ssm_norm.weight":
        x = x + np.float32(1)
    return x.astype(np.float32)


def tensor_untransform(name: str, x: np.ndarray, cfg: dict) -> np.ndarray:
    """Inverse of tensor_transform, in float64: stored values -> HF values."""
    x = np.asarray(x, dtype=np.float64)
    if cfg["_arch"] != "qwen35":
        return x
    n_k, n_v = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    leaf = name.split(".", 2)[-1] if name.startswith("blk.") else name
    if leaf == "ssm_a":
        x = np.log(-x)
    elif leaf.endswith("norm.weight") and leaf != "ssm_norm.weight":
        x = x - 1.0
    if n_k != n_v:
        qk = 2 * n_k * dk
        if leaf in ("attn_qkv.weight", "ssm_conv1d.weight"):
            x = np.concatenate([x[:qk], vheads_reorder(x[qk:], 0, n_k, n_v, dv, True)])
        elif leaf == "attn_gate.weight":
            x = vheads_reorder(x, 0, n_k, n_v, dv, True)
        elif leaf in ("ssm_beta.weight", "ssm_alpha.weight", "ssm_a", "ssm_dt.bias"):
            x = vheads_reorder(x, 0, n_k, n_v, 1, True)
        elif leaf == "ssm_out.weight":
            x = vheads_reorder(x, 1, n_k, n_v, dv, True)
    if leaf == "ssm_conv1d.weight":
        x = x[:, None, :]
    return x


# --- tensor types -----------------------------------------------------------------------------

_KQUANT = {QT.Q4_K: kquant.quantize_q4_k, QT.Q5_K: kquant.quantize_q5_k,
           QT.Q6_K: kquant.quantize_q6_k}


def _use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's choice of layers that get more bits in *_K_M mixes."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_type_mix(name: str, n_blocks: int, tied: bool) -> QT:
    """Q4_K_M-like type of a 2-D tensor: output (or the tied embedding) Q6_K; attn_v, ffn_down
    and ssm_out Q6_K in llama.cpp's more-bits layers, else Q4_K; attn_qkv and attn_k Q5_K;
    attn_output F16 (so the mix carries a float matrix type too); the rest Q4_K."""
    leaf = name.split(".", 2)[-1] if name.startswith("blk.") else name
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        return QT.Q6_K
    if leaf in ("attn_v.weight", "ffn_down.weight", "ssm_out.weight"):
        return QT.Q6_K if _use_more_bits(int(name.split(".")[1]), n_blocks) else QT.Q4_K
    if leaf in ("attn_qkv.weight", "attn_k.weight"):
        return QT.Q5_K
    if leaf == "attn_output.weight":
        return QT.F16
    return QT.Q4_K


def tensor_type(name: str, x: np.ndarray, outtype: str, n_blocks: int, tied: bool) -> QT:
    if x.ndim <= 1 or not name.endswith(".weight") or name.endswith("ssm_conv1d.weight"):
        return QT.F32
    want = OUTTYPES[outtype][0]
    if outtype == "q4_k_m":
        want = tensor_type_mix(name, n_blocks, tied)
    block = gguf.GGML_QUANT_SIZES[want][0]
    if x.shape[-1] % block == 0:
        return want
    return QT.Q8_0 if x.shape[-1] % 32 == 0 else QT.F16


def tensor_encode(x: np.ndarray, qtype: QT) -> np.ndarray:
    if qtype == QT.F32:
        return x.astype(np.float32)
    if qtype == QT.F16:
        return x.astype(np.float16)
    if qtype in _KQUANT:
        return _KQUANT[qtype](x)
    return gguf.quants.quantize(x.astype(np.float32), qtype)  # BF16, Q8_0


# --- tokenizer ----------------------------------------------------------------------------------

def _looks_special(text: str) -> bool:
    return text.startswith("<|") and text.endswith("|>")


def tokenizer_write(w: gguf.GGUFWriter, model_dir: pathlib.Path, cfg: dict, pre: str) -> None:
    """tokenizer.ggml.* and tokenizer.chat_template from tokenizer.json/tokenizer_config.json."""
    try:
        tj = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConvertError(f"tokenizer.json: {e}") from None
    tc_path = model_dir / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text(encoding="utf-8")) if tc_path.is_file() else {}
    model = tj.get("model") or {}
    if model.get("type") != "BPE":
        raise ConvertError("tokenizer.json: only byte-level BPE (model type BPE) is supported")
    n_vocab = cfg["vocab_size"]
    tokens = [f"[PAD{i}]" for i in range(n_vocab)]
    types = [gguf.TokenType.UNUSED] * n_vocab
    for text, i in model["vocab"].items():
        if i >= n_vocab:
            raise ConvertError(f"token id {i} >= vocab_size {n_vocab}")
        tokens[i], types[i] = text, gguf.TokenType.NORMAL
    ids = {}
    for a in tj.get("added_tokens", []):
        i = a["id"]
        if i >= n_vocab:
            raise ConvertError(f"added token id {i} >= vocab_size {n_vocab}")
        tokens[i] = a["content"]
        special = a.get("special") or _looks_special(a["content"])
        types[i] = gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED
        ids[a["content"]] = i
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([int(t) for t in types])
    w.add_token_merges(merges)

    def token_id(key: str) -> int | None:
        tok = tc.get(key)
        if isinstance(tok, dict):
            tok = tok.get("content")
        if tok in ids:
            return ids[tok]
        v = cfg.get(f"{key}_id")
        return v[0] if isinstance(v, list) else v

    for key, add in (("bos_token", w.add_bos_token_id), ("eos_token", w.add_eos_token_id),
                     ("pad_token", w.add_pad_token_id)):
        if (i := token_id(key)) is not None:
            add(int(i))
    w.add_add_bos_token(bool(tc.get("add_bos_token", False)))
    template = tc.get("chat_template")
    jinja = model_dir / "chat_template.jinja"
    if template is None and jinja.is_file():
        template = jinja.read_text(encoding="utf-8")
    if isinstance(template, str):
        w.add_chat_template(template)


# --- conversion ---------------------------------------------------------------------------------

def block_order(name: str) -> tuple:
    """Sort key: token_embd, blocks in order, output_norm, output."""
    if name.startswith("blk."):
        return (1, int(name.split(".")[1]), name)
    return (0 if name.startswith("token_embd") else 2, 0, name)


def convert(model_dir: str | pathlib.Path, outfile: str | pathlib.Path, outtype: str,
            name: str | None = None, pre: str | None = None) -> None:
    model_dir = pathlib.Path(model_dir)
    if outtype not in OUTTYPES:
        raise ConvertError(f"unknown --outtype {outtype!r} (one of {', '.join(OUTTYPES)})")
    cfg = config_load(model_dir)
    arch = cfg["_arch"]
    w = gguf.GGUFWriter(str(outfile), arch)
    n_blocks = metadata_write(w, cfg, OUTTYPES[outtype][1], name or model_dir.name)
    tied = bool(cfg.get("tie_word_embeddings"))
    stored = {}
    for hf, x in checkpoint_read(model_dir).items():
        g = gguf_name(hf, cfg)
        if g is not None:
            stored[g] = tensor_transform(g, x, cfg)
    if "token_embd.weight" not in stored:
        raise ConvertError("checkpoint has no model.embed_tokens.weight")
    if stored["token_embd.weight"].shape[0] != cfg["vocab_size"]:
        raise ConvertError("embedding rows differ from config vocab_size")
    for g in sorted(stored, key=block_order):
        x = stored[g]
        qtype = tensor_type(g, x, outtype, n_blocks, tied)
        w.add_tensor(g, tensor_encode(x, qtype), raw_dtype=qtype)
    tokenizer_write(w, model_dir, cfg, pre or ("qwen35" if arch == "qwen35" else "qwen2"))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--outfile", required=True)
    ap.add_argument("--outtype", default="f16", choices=sorted(OUTTYPES))
    ap.add_argument("--name", help="general.name (default: the directory name)")
    ap.add_argument("--tokenizer-pre", help="tokenizer.ggml.pre (default: qwen2 / qwen35)")
    args = ap.parse_args(argv)
    try:
        convert(args.model_dir, args.outfile, args.outtype, args.name, args.tokenizer_pre)
    except ConvertError as e:
        print(f"convert_hf_to_gguf: {e}", file=sys.stderr)
        return 1
    except KeyError as e:   # a required config.json key or tensor is absent
        print(f"convert_hf_to_gguf: missing {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
