"""A `qwen35` GGUF file (the demo target as tandem runs it) back as a transformers model and a
`tokenizers` tokenizer, with numpy, torch, transformers and tokenizers only: the GPU machine
that trains the drafter has no `gguf` package, and the drafter must imitate the exact target
tandem verifies with (its Q8_0 weights dequantised), not the bf16 checkpoint it came from.

    python3 scripts/train/gguf_target.py models/demo/demo.gguf [--tandem BUILD/tandem]
        (prints the model's greedy continuation of a prompt; with --tandem, compares its
        logits and tokenisation with `tandem logits` / `tandem tokenize`)

The reader understands GGUF v2/v3 with tensors in F32, F16, BF16 and Q8_0 (what the converter
writes for the demo model); any other type, or a file that is not well-formed, is a GGUFError
with a message. The stored conventions of scripts/convert_hf_to_gguf.py are undone here
(tests/py/test_gguf_target.py checks the result against that converter's own inverse):
norms stored as 1 + w, ssm_a = -exp(A_log), value heads tiled instead of grouped by key head,
conv1d [C, K] instead of [C, 1, K].
"""
from __future__ import annotations

import argparse
import pathlib
import struct
import sys

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

GGUF_MAGIC = b"GGUF"
# ggml type id -> (name, weights per block, bytes per block)
TYPES = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 8: ("Q8_0", 32, 34), 30: ("BF16", 1, 2)}
# GGUF metadata value types (id -> struct format); 8 string, 9 array are handled apart
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
           10: "<Q", 11: "<q", 12: "<d"}
TOKEN_CONTROL, TOKEN_USER_DEFINED = 3, 4   # tokenizer.ggml.token_type values of added tokens

# GGUF name inside blk.N -> Hugging Face name inside model.layers.N (qwen35)
LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "attn_qkv.weight": "linear_attn.in_proj_qkv.weight",
    "attn_gate.weight": "linear_attn.in_proj_z.weight",
    "ssm_beta.weight": "linear_attn.in_proj_b.weight",
    "ssm_alpha.weight": "linear_attn.in_proj_a.weight",
    "ssm_conv1d.weight": "linear_attn.conv1d.weight",
    "ssm_dt.bias": "linear_attn.dt_bias",
    "ssm_a": "linear_attn.A_log",
    "ssm_norm.weight": "linear_attn.norm.weight",
    "ssm_out.weight": "linear_attn.out_proj.weight",
}
TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
             "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}


class GGUFError(ValueError):
    """The file is not a GGUF file this reader can load; the message says why."""


class _Cursor:
    """Bounds-checked little-endian reads from the file's bytes."""

    def __init__(self, buf: memoryview, path: str):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            raise GGUFError(f"{self.path}: truncated at byte {self.pos} (wanted {n} more)")
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def scalar(self, fmt: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        raw = bytes(self.take(self.scalar("<Q")))
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise GGUFError(f"{self.path}: a string before byte {self.pos} is not UTF-8") from None

    def value(self, vtype: int):
        if vtype in SCALARS:
            return self.scalar(SCALARS[vtype])
        if vtype == 8:
            return self.string()
        if vtype == 9:
            etype, n = self.scalar("<I"), self.scalar("<Q")
            if n > len(self.buf):
                raise GGUFError(f"{self.path}: array of {n} items is longer than the file")
            if etype in SCALARS and etype != 7:
                fmt = SCALARS[etype]
                a = np.frombuffer(self.take(n * struct.calcsize(fmt)), dtype=np.dtype(fmt))
                return a.tolist()
            return [self.value(etype) for _ in range(n)]
        raise GGUFError(f"{self.path}: unknown metadata value type {vtype}")


def _dequantise(raw: memoryview, type_id: int, count: int) -> np.ndarray:
    """`count` weights of one tensor as float32 (Q8_0: 34-byte blocks, f16 scale d then 32
    int8 q, y = d * q)."""
    if type_id == 0:
        return np.frombuffer(raw, dtype="<f4").astype(np.float32)
    if type_id == 1:
        return np.frombuffer(raw, dtype="<f2").astype(np.float32)
    if type_id == 30:
        return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    blocks = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 34)
    d = blocks[:, :2].copy().view("<f2").astype(np.float32)           # [n_blocks, 1]
    q = blocks[:, 2:].view(np.int8).astype(np.float32)                # [n_blocks, 32]
    return (d * q).reshape(count)


def gguf_read(path: str | pathlib.Path, tensors: bool = True) -> tuple[dict, dict]:
    """(metadata, tensors) of a GGUF file: metadata values by key (arrays as lists), tensors
    by name dequantised to float32 in numpy shape (the reverse of GGUF's ne); no tensors (an
    empty dict) when `tensors` is false."""
    path = str(path)
    try:
        data = pathlib.Path(path).read_bytes()
    except OSError as e:
        raise GGUFError(f"{path}: {e.strerror}") from None
    c = _Cursor(memoryview(data), path)
    if bytes(c.take(4)) != GGUF_MAGIC:
        raise GGUFError(f"{path}: not a GGUF file (bad magic)")
    version = c.scalar("<I")
    if version not in (2, 3):
        raise GGUFError(f"{path}: GGUF version {version} is not supported (2 or 3)")
    n_tensors, n_kv = c.scalar("<Q"), c.scalar("<Q")
    if n_tensors > len(data) or n_kv > len(data):
        raise GGUFError(f"{path}: header counts ({n_tensors} tensors, {n_kv} keys) exceed the "
                        "file")
    meta = {}
    for _ in range(n_kv):
        key = c.string()
        meta[key] = c.value(c.scalar("<I"))
    infos = []
    for _ in range(n_tensors):
        name = c.string()
        n_dims = c.scalar("<I")
        if n_dims > 4:
            raise GGUFError(f"{path}: tensor {name} has {n_dims} dimensions (at most 4)")
        ne = [c.scalar("<Q") for _ in range(n_dims)]
        infos.append((name, ne, c.scalar("<I"), c.scalar("<Q")))
    align = int(meta.get("general.alignment", 32))
    if align <= 0 or align & (align - 1):
        raise GGUFError(f"{path}: general.alignment {align} is not a power of two")
    base = (c.pos + align - 1) // align * align
    out = {}
    for name, ne, type_id, offset in infos if tensors else []:
        if type_id not in TYPES:
            raise GGUFError(f"{path}: tensor {name} has ggml type {type_id}; this reader knows "
                            f"{', '.join(t[0] for t in TYPES.values())}")
        _, per_block, block_bytes = TYPES[type_id]
        count = int(np.prod(ne, dtype=np.int64)) if ne else 1
        if count <= 0 or (ne and ne[0] % per_block):
            raise GGUFError(f"{path}: tensor {name}: shape {ne} does not fit "
                            f"{TYPES[type_id][0]} blocks")
        nbytes = count // per_block * block_bytes
        lo = base + offset
        if lo + nbytes > len(data):
            raise GGUFError(f"{path}: tensor {name} runs past the end of the file")
        a = _dequantise(memoryview(data)[lo:lo + nbytes], type_id, count)
        out[name] = a.reshape(tuple(reversed(ne)) if ne else ())
    return meta, out


# --- the transformers model ----------------------------------------------------------------------

def _arch(meta: dict) -> str:
    arch = meta.get("general.architecture")
    if arch != "qwen35":
        raise GGUFError(f"general.architecture is {arch!r}; only qwen35 targets are loaded here")
    return arch


def _key(meta: dict, key: str):
    if key not in meta:
        raise GGUFError(f"metadata key {key} is missing")
    return meta[key]


def hf_config(meta: dict):
    """The Qwen3_5TextConfig the file was converted from (what the GGUF metadata holds)."""
    import transformers
    a = _arch(meta)
    k = lambda name: _key(meta, f"{a}.{name}")  # noqa: E731
    n_layer = int(k("block_count")) - int(meta.get(f"{a}.nextn_predict_layers", 0))
    hd = int(k("attention.key_length"))
    n_v = int(k("ssm.time_step_rank"))
    sections = [int(x) for x in k("rope.dimension_sections")]
    eos = int(_key(meta, "tokenizer.ggml.eos_token_id"))
    cfg = transformers.Qwen3_5TextConfig(
        vocab_size=len(_key(meta, "tokenizer.ggml.tokens")),
        hidden_size=int(k("embedding_length")), intermediate_size=int(k("feed_forward_length")),
        num_hidden_layers=n_layer, num_attention_heads=int(k("attention.head_count")),
        num_key_value_heads=int(k("attention.head_count_kv")), head_dim=hd,
        rms_norm_eps=float(k("attention.layer_norm_rms_epsilon")),
        max_position_embeddings=int(k("context_length")), tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=eos,
        pad_token_id=int(meta.get("tokenizer.ggml.padding_token_id", eos)),
        rope_parameters={"rope_type": "default", "rope_theta": float(k("rope.freq_base")),
                         "partial_rotary_factor": int(k("rope.dimension_count")) / hd,
                         "mrope_section": sections[:3], "mrope_interleaved": True},
        linear_conv_kernel_dim=int(k("ssm.conv_kernel")),
        linear_key_head_dim=int(k("ssm.state_size")),
        linear_value_head_dim=int(k("ssm.inner_size")) // n_v,
        linear_num_key_heads=int(k("ssm.group_count")), linear_num_value_heads=n_v,
        full_attention_interval=int(k("full_attention_interval")))
    cfg.architectures = ["Qwen3_5ForCausalLM"]
    return cfg


def _vheads_untile(x: np.ndarray, axis: int, n_k: int, n_v: int, width: int) -> np.ndarray:
    """Value heads along `axis` from GGUF's tiled order (head j*n_k + k) back to grouped by key
    head (HF: head k*r + j), r = n_v / n_k, each head `width` wide."""
    r = n_v // n_k
    shape = list(x.shape)
    y = x.reshape(shape[:axis] + [r, n_k, width] + shape[axis + 1:])
    return np.swapaxes(y, axis, axis + 1).reshape(shape)


def hf_state(meta: dict, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Hugging Face name -> float32 value of every tensor of the main model (MTP blocks are
    not loaded: transformers does not run them)."""
    cfg = hf_config(meta)
    n_k, n_v = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    qk = 2 * n_k * dk
    out = {}
    for name, x in tensors.items():
        if name in TOP_NAMES:
            hf, leaf = TOP_NAMES[name], name
        else:
            parts = name.split(".", 2)
            if len(parts) != 3 or parts[0] != "blk" or not parts[1].isdigit():
                raise GGUFError(f"unknown tensor {name}")
            if int(parts[1]) >= cfg.num_hidden_layers:
                continue                          # an MTP block
            leaf = parts[2]
            if leaf not in LAYER_NAMES:
                raise GGUFError(f"unknown tensor {name}")
            hf = f"model.layers.{parts[1]}.{LAYER_NAMES[leaf]}"
        x = x.astype(np.float64)
        if leaf == "ssm_a":
            x = np.log(-x)
        elif leaf.endswith("norm.weight") and leaf != "ssm_norm.weight":
            x = x - 1.0
        if n_k != n_v:
            if leaf in ("attn_qkv.weight", "ssm_conv1d.weight"):
                x = np.concatenate([x[:qk], _vheads_untile(x[qk:], 0, n_k, n_v, dv)])
            elif leaf == "attn_gate.weight":
                x = _vheads_untile(x, 0, n_k, n_v, dv)
            elif leaf in ("ssm_beta.weight", "ssm_alpha.weight", "ssm_a", "ssm_dt.bias"):
                x = _vheads_untile(x, 0, n_k, n_v, 1)
            elif leaf == "ssm_out.weight":
                x = _vheads_untile(x, 1, n_k, n_v, dv)
        if leaf == "ssm_conv1d.weight":
            x = x[:, None, :]
        out[hf] = x.astype(np.float32)
    if "lm_head.weight" not in out:
        raise GGUFError("the file has no output.weight (tied LM heads are not loaded here)")
    return out


def target_load(path: str | pathlib.Path, device: str = "cpu", attn: str = "sdpa"):
    """(model, metadata): the file's target as a float32 Qwen3_5ForCausalLM in eval mode."""
    import torch
    import transformers
    meta, tensors = gguf_read(path)
    cfg = hf_config(meta)
    cfg._attn_implementation = attn
    model = transformers.Qwen3_5ForCausalLM(cfg)
    state = {k: torch.from_numpy(v) for k, v in hf_state(meta, tensors).items()}
    model.load_state_dict(state, strict=True)
    return model.to(device).eval(), meta


# --- the tokenizer ------------------------------------------------------------------------------

def tokenizer_of(meta: dict):
    """A `tokenizers` byte-level BPE with the file's tokens and merges and the qwen2/qwen35
    pre-tokeniser regex it names (DESIGN section 9): the ids tandem's own tokenizer gives."""
    from tokenizers import AddedToken, models
    from train_tokenizer import REGEX, tokenizer_build
    if _key(meta, "tokenizer.ggml.model") != "gpt2":
        raise GGUFError("tokenizer.ggml.model is not gpt2 (byte-level BPE)")
    pre = _key(meta, "tokenizer.ggml.pre")
    if pre not in REGEX:
        raise GGUFError(f"tokenizer.ggml.pre {pre!r} is not one of {', '.join(REGEX)}")
    tokens = _key(meta, "tokenizer.ggml.tokens")
    types = _key(meta, "tokenizer.ggml.token_type")
    merges = _key(meta, "tokenizer.ggml.merges")
    if len(types) != len(tokens):
        raise GGUFError("tokenizer.ggml.token_type and tokenizer.ggml.tokens differ in length")
    added = [i for i, t in enumerate(types) if t in (TOKEN_CONTROL, TOKEN_USER_DEFINED)]
    vocab = {t: i for i, t in enumerate(tokens) if i not in set(added)}
    pairs = []
    for m in merges:
        a, sep, b = m.partition(" ")
        if not sep:
            raise GGUFError(f"tokenizer.ggml.merges entry {m!r} is not two tokens")
        pairs.append((a, b))
    tok = tokenizer_build(pre)
    tok.model = models.BPE(vocab=vocab, merges=pairs, byte_fallback=False)
    for i in added:   # in id order, so that each lands on its own id
        special = types[i] == TOKEN_CONTROL
        t = AddedToken(tokens[i], special=special, normalized=False)
        (tok.add_special_tokens if special else tok.add_tokens)([t])
        if tok.token_to_id(tokens[i]) != i:
            raise GGUFError(f"added token {tokens[i]!r} does not follow the BPE ids (id {i})")
    return tok


# --- command line -------------------------------------------------------------------------------

def main() -> int:
    import subprocess
    import torch
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf")
    ap.add_argument("--prompt", default="import os\nimport sys\n\n\ndef main(argv):\n")
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("--tandem", help="a tandem binary to compare logits and tokens with")
    args = ap.parse_args()
    try:
        model, meta = target_load(args.gguf, attn="eager")
        tok = tokenizer_of(meta)
    except GGUFError as e:
        print(f"gguf_target: {e}", file=sys.stderr)
        return 1
    ids = tok.encode(args.prompt, add_special_tokens=False).ids
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([ids]), max_new_tokens=args.n,
                             do_sample=False, eos_token_id=None)[0, len(ids):].tolist()
    print(f"prompt {len(ids)} tokens; greedy: {out}\n{tok.decode(out)}")
    if args.tandem:
        r = subprocess.run([args.tandem, "tokenize", "--model", args.gguf, "--json", args.prompt],
                           capture_output=True, text=True)
        print(f"tandem tokenize: {r.stdout.strip()[:200]}")
        r = subprocess.run([args.tandem, "logits", "--model", args.gguf, "--tokens",
                            ",".join(map(str, ids)), "--top", "1"], capture_output=True, text=True)
        top = [int(line.split()[1].split("(")[0]) for line in r.stdout.splitlines() if ":" in line]
        with torch.no_grad():
            want = model(input_ids=torch.tensor([ids])).logits[0].argmax(-1).tolist()
        same = sum(a == b for a, b in zip(top, want))
        print(f"top-1 agreement with tandem logits: {same} of {len(want)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
