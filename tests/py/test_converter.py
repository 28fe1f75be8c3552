"""The GGUF converter and the committed test models (numpy + gguf only, no torch).

The golden files were made by transformers (scripts/make_golden.py); here an independent NumPy
forward pass written from the design (scripts/gguf_numpy_ref.py) must reproduce them from the
GGUF tensors, which checks the converter's stored conventions end to end.
"""
import json
import pathlib
import sys

import numpy as np
import pytest

import gguf
from gguf import GGMLQuantizationType as QT

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import convert_hf_to_gguf as conv  # noqa: E402
import gguf_numpy_ref as ref  # noqa: E402
import kquant  # noqa: E402

MODELS = ROOT / "tests" / "data" / "models"
GOLDEN = ROOT / "tests" / "data" / "golden"
MODEL_FILES = sorted(p.name for p in MODELS.glob("*.gguf"))


def test_every_model_file_has_a_golden_file():
    assert len(MODEL_FILES) == 8
    for name in MODEL_FILES:
        assert (GOLDEN / name).is_file(), name


def expected_shapes(meta: dict) -> dict[str, tuple]:
    """Every tensor a qwen3 / qwen35 file must hold, with its numpy shape (reverse of ne)."""
    a = meta["general.architecture"]
    H, F = meta[f"{a}.embedding_length"], meta[f"{a}.feed_forward_length"]
    nh, nkv = meta[f"{a}.attention.head_count"], meta[f"{a}.attention.head_count_kv"]
    hd = meta[f"{a}.attention.key_length"]
    n_blk = meta[f"{a}.block_count"]
    n_main = n_blk - meta.get(f"{a}.nextn_predict_layers", 0)
    out = {"token_embd.weight": (512, H), "output_norm.weight": (H,)}
    for l in range(n_blk):
        p = f"blk.{l}."
        out.update({p + "attn_norm.weight": (H,), p + "ffn_gate.weight": (F, H),
                    p + "ffn_up.weight": (F, H), p + "ffn_down.weight": (H, F)})
        out[p + ("post_attention_norm.weight" if a == "qwen35" else "ffn_norm.weight")] = (H,)
        if a == "qwen3" or (l + 1) % meta[f"{a}.full_attention_interval"] == 0 or l >= n_main:
            q_rows = nh * hd * (2 if a == "qwen35" else 1)   # qwen35: query + gate per head
            out.update({p + "attn_q.weight": (q_rows, H), p + "attn_k.weight": (nkv * hd, H),
                        p + "attn_v.weight": (nkv * hd, H),
                        p + "attn_output.weight": (H, nh * hd),
                        p + "attn_q_norm.weight": (hd,), p + "attn_k_norm.weight": (hd,)})
        else:
            nk, nv = meta[f"{a}.ssm.group_count"], meta[f"{a}.ssm.time_step_rank"]
            dk, inner = meta[f"{a}.ssm.state_size"], meta[f"{a}.ssm.inner_size"]
            C = 2 * nk * dk + inner
            out.update({p + "attn_qkv.weight": (C, H), p + "attn_gate.weight": (inner, H),
                        p + "ssm_beta.weight": (nv, H), p + "ssm_alpha.weight": (nv, H),
                        p + "ssm_conv1d.weight": (C, meta[f"{a}.ssm.conv_kernel"]),
                        p + "ssm_dt.bias": (nv,), p + "ssm_a": (nv,),
                        p + "ssm_norm.weight": (inner // nv,), p + "ssm_out.weight": (H, inner)})
        if l >= n_main:
            out.update({p + "nextn.eh_proj.weight": (H, 2 * H), p + "nextn.enorm.weight": (H,),
                        p + "nextn.hnorm.weight": (H,), p + "nextn.shared_head_norm.weight": (H,)})
    return out


# Tensor types of the Q4_K_M-like mix of qwen3-tied (2 layers, rows of 256 except
# attn_output and ffn_down, whose rows of 64 cannot hold K-quant blocks).
MIX_TYPES = {"token_embd.weight": QT.Q6_K, "output_norm.weight": QT.F32}
for _l, _v in ((0, QT.Q4_K), (1, QT.Q6_K)):
    MIX_TYPES.update({f"blk.{_l}.{k}": t for k, t in {
        "attn_norm.weight": QT.F32, "ffn_norm.weight": QT.F32, "attn_q_norm.weight": QT.F32,
        "attn_k_norm.weight": QT.F32, "attn_q.weight": QT.Q4_K, "attn_k.weight": QT.Q5_K,
        "attn_v.weight": _v, "attn_output.weight": QT.F16, "ffn_gate.weight": QT.Q4_K,
        "ffn_up.weight": QT.Q4_K, "ffn_down.weight": QT.Q8_0}.items()})


def expected_type(file: str, name: str, shape: tuple) -> QT:
    kind = file.rsplit("-", 1)[1].removesuffix(".gguf")
    if kind == "q4_k_m":
        return MIX_TYPES[name]
    if len(shape) == 1 or not name.endswith(".weight") or "ssm_conv1d" in name:
        return QT.F32
    want = {"f32": QT.F32, "bf16": QT.BF16, "q8_0": QT.Q8_0, "q4_k": QT.Q4_K,
            "q5_k": QT.Q5_K, "q6_k": QT.Q6_K}[kind]
    if want in (QT.Q4_K, QT.Q5_K, QT.Q6_K) and shape[-1] % 256:
        return QT.Q8_0
    return want


@pytest.mark.parametrize("file", MODEL_FILES)
def test_model_file_tensor_names_shapes_and_types(file):
    r = gguf.GGUFReader(str(MODELS / file))
    meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.")}
    want = expected_shapes(meta)
    if "tied" not in file:
        want["output.weight"] = want["token_embd.weight"]
    got = {t.name: tuple(int(n) for n in reversed(t.shape)) for t in r.tensors}
    assert got == want
    for t in r.tensors:
        assert t.tensor_type == expected_type(file, t.name, got[t.name]), t.name


def test_qwen35_metadata_keys():
    r = gguf.GGUFReader(str(MODELS / "qwen35-tiny-f32.gguf"))
    meta = {k: f.contents() for k, f in r.fields.items()}
    assert meta["general.architecture"] == "qwen35"
    want = {"block_count": 9, "nextn_predict_layers": 1, "embedding_length": 32,
            "feed_forward_length": 64, "attention.head_count": 4,
            "attention.head_count_kv": 2, "attention.key_length": 16,
            "attention.value_length": 16, "full_attention_interval": 4,
            "rope.dimension_count": 4, "rope.dimension_sections": [1, 1, 0, 0],
            "rope.freq_base": 1e7, "ssm.conv_kernel": 4, "ssm.inner_size": 96,
            "ssm.state_size": 16, "ssm.time_step_rank": 6, "ssm.group_count": 2}
    assert {k: meta[f"qwen35.{k}"] for k in want} == want
    assert meta["qwen35.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-6)
    assert meta["general.file_type"] == 0


@pytest.mark.parametrize("file,pre,template", [
    ("qwen3-tiny-f32.gguf", "qwen2", "chat-template-qwen3.jinja"),
    ("qwen35-tiny-f32.gguf", "qwen35", "chat-template-qwen35.jinja"),
])
def test_tokenizer_metadata_matches_tokenizer_json(file, pre, template):
    r = gguf.GGUFReader(str(MODELS / file))
    meta = {k: f.contents() for k, f in r.fields.items()}
    tj = json.loads((MODELS / "tokenizer.json").read_text(encoding="utf-8"))
    assert meta["tokenizer.ggml.model"] == "gpt2"
    assert meta["tokenizer.ggml.pre"] == pre
    tokens = meta["tokenizer.ggml.tokens"]
    assert len(tokens) == 512
    assert {t: i for i, t in enumerate(tokens[:504])} == tj["model"]["vocab"]
    assert tokens[504:] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>",
                            "</think>", "<tool_call>", "</tool_call>", "<|mask|>"]
    assert meta["tokenizer.ggml.token_type"][500:] == [1] * 4 + [3, 3, 3, 4, 4, 4, 4, 3]
    assert meta["tokenizer.ggml.merges"] == [" ".join(m) for m in tj["model"]["merges"]]
    assert meta["tokenizer.ggml.merges"][:3] == ["Ġ Ġ", "i n", "Ġ t"]
    assert (meta["tokenizer.ggml.bos_token_id"], meta["tokenizer.ggml.eos_token_id"],
            meta["tokenizer.ggml.padding_token_id"]) == (504, 506, 504)
    assert meta["tokenizer.ggml.add_bos_token"] is False
    assert meta["tokenizer.chat_template"] == (MODELS / template).read_text(encoding="utf-8")


@pytest.mark.parametrize("file", MODEL_FILES)
def test_numpy_reference_reproduces_golden_outputs(file):
    errs = ref.golden_compare(MODELS / file, GOLDEN / file)
    limits = {"logits": 3e-4, "hidden": 1.5e-3, "prefix": 3e-4, "cont.logits": 3e-4,
              "cont.hidden": 1.5e-3}
    assert all(errs[k] < limits[k] for k in limits), errs


@pytest.mark.parametrize("file", MODEL_FILES)
def test_golden_logits_are_far_from_flat(file):
    _, gold = ref.gguf_read(GOLDEN / file)
    assert gold["tokens"].shape == (24,)
    assert gold["logits"].shape == (24, 512) and gold["cont.logits"].shape == (8, 512)
    assert gold["logits"].std() > 1.0
    assert len(set(gold["logits"].argmax(-1).tolist())) >= 12
    np.testing.assert_allclose(gold["cont.logits"], gold["logits"][16:], atol=2e-4)


def test_value_heads_go_from_grouped_to_tiled_order():
    hf = np.arange(6)                     # key head k owns HF value heads 3k..3k+2
    tiled = conv.vheads_reorder(hf, 0, n_k=2, n_v=6, width=1)
    assert tiled.tolist() == [0, 3, 1, 4, 2, 5]   # GGUF head h uses key head h mod 2
    assert conv.vheads_reorder(tiled, 0, 2, 6, 1, inverse=True).tolist() == hf.tolist()
    cols = conv.vheads_reorder(np.arange(12)[None, :], 1, 2, 4, 3)
    assert cols[0].tolist() == [0, 1, 2, 6, 7, 8, 3, 4, 5, 9, 10, 11]


# --- a small synthetic Qwen3.5 checkpoint through the converter ---------------------------------

def safetensors_write(path, tensors: dict[str, np.ndarray], bf16=()):
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        if name in bf16:
            raw = (np.asarray(a, np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
            dtype = "BF16"
        else:
            raw, dtype = np.asarray(a, np.float32).tobytes(), "F32"
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    path.write_bytes(len(h).to_bytes(8, "little") + h + b"".join(blobs))


def tiny_qwen35_dir(tmp_path, **over):
    H, F, nh, nkv, hd, nk, nv, d = 8, 8, 2, 1, 4, 2, 4, 2
    cfg = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
           "text_config": {"vocab_size": 512, "hidden_size": H, "intermediate_size": F,
                           "num_hidden_layers": 4, "num_attention_heads": nh,
                           "num_key_value_heads": nkv, "head_dim": hd, "rms_norm_eps": 1e-6,
                           "linear_num_key_heads": nk, "linear_num_value_heads": nv,
                           "linear_key_head_dim": d, "linear_value_head_dim": d,
                           "linear_conv_kernel_dim": 4, "full_attention_interval": 4,
                           "mtp_num_hidden_layers": 1, "tie_word_embeddings": False,
                           "rope_parameters": {"rope_type": "default", "rope_theta": 1e7,
                                               "partial_rotary_factor": 0.5}}}
    cfg.update(over)
    rng = np.random.default_rng(0)
    t = {"model.language_model.embed_tokens.weight": rng.normal(size=(512, H)),
         "model.language_model.norm.weight": rng.normal(size=H), "lm_head.weight": rng.normal(size=(512, H)),
         "model.visual.blocks.0.attn.qkv.weight": rng.normal(size=(6, 2))}
    C = 2 * nk * d + nv * d

    def layer(p, attention):
        t.update({p + "input_layernorm.weight": rng.normal(size=H),
                  p + "post_attention_layernorm.weight": rng.normal(size=H),
                  p + "mlp.gate_proj.weight": rng.normal(size=(F, H)),
                  p + "mlp.up_proj.weight": rng.normal(size=(F, H)),
                  p + "mlp.down_proj.weight": rng.normal(size=(H, F))})
        if attention:
            t.update({p + "self_attn.q_proj.weight": rng.normal(size=(2 * nh * hd, H)),
                      p + "self_attn.k_proj.weight": rng.normal(size=(nkv * hd, H)),
                      p + "self_attn.v_proj.weight": rng.normal(size=(nkv * hd, H)),
                      p + "self_attn.o_proj.weight": rng.normal(size=(H, nh * hd)),
                      p + "self_attn.q_norm.weight": rng.normal(size=hd),
                      p + "self_attn.k_norm.weight": rng.normal(size=hd)})
        else:
            t.update({p + "linear_attn.in_proj_qkv.weight": rng.normal(size=(C, H)),
                      p + "linear_attn.in_proj_z.weight": rng.normal(size=(nv * d, H)),
                      p + "linear_attn.in_proj_b.weight": rng.normal(size=(nv, H)),
                      p + "linear_attn.in_proj_a.weight": rng.normal(size=(nv, H)),
                      p + "linear_attn.conv1d.weight": rng.normal(size=(C, 1, 4)),
                      p + "linear_attn.dt_bias": rng.normal(size=nv),
                      p + "linear_attn.A_log": rng.normal(size=nv),
                      p + "linear_attn.norm.weight": rng.normal(size=d),
                      p + "linear_attn.out_proj.weight": rng.normal(size=(H, nv * d))})
    for l in range(4):
        layer(f"model.language_model.layers.{l}.", l == 3)
    layer("mtp.layers.0.", True)
    t.update({"mtp.fc.weight": rng.normal(size=(H, 2 * H)), "mtp.norm.weight": rng.normal(size=H),
              "mtp.pre_fc_norm_embedding.weight": rng.normal(size=H),
              "mtp.pre_fc_norm_hidden.weight": rng.normal(size=H)})
    t = {k: v.astype(np.float32) for k, v in t.items()}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    bf16 = {k for k in t if k.endswith("in_proj_qkv.weight")}
    safetensors_write(tmp_path / "model.safetensors", t, bf16=bf16)
    (tmp_path / "tokenizer.json").write_bytes((MODELS / "tokenizer-qwen35.json").read_bytes())
    return t


def test_converter_writes_qwen35_stored_conventions(tmp_path):
    t = tiny_qwen35_dir(tmp_path)
    out = tmp_path / "out.gguf"
    conv.convert(tmp_path, out, "f32")
    meta, g = ref.gguf_read(out)
    assert meta["qwen35.block_count"] == 5 and meta["qwen35.nextn_predict_layers"] == 1
    assert meta["qwen35.rope.dimension_count"] == 2
    assert meta["qwen35.rope.dimension_sections"] == [11, 11, 10, 0]
    assert not any(k.startswith("v.") or "visual" in k for k in g)
    hf = lambda n: t["model.language_model." + n].astype(np.float64)  # noqa: E731
    p = "layers.0.linear_attn."
    # 2 key heads x 2 value heads: HF value head 2k+j (grouped) is GGUF head 2j+k (tiled)
    perm = [0, 2, 1, 3]
    np.testing.assert_allclose(g["blk.0.ssm_a"], -np.exp(hf(p + "A_log"))[perm], rtol=1e-6)
    np.testing.assert_array_equal(g["blk.0.ssm_dt.bias"], hf(p + "dt_bias")[perm])
    np.testing.assert_array_equal(g["blk.0.ssm_alpha.weight"], hf(p + "in_proj_a.weight")[perm])
    np.testing.assert_array_equal(g["blk.0.ssm_beta.weight"], hf(p + "in_proj_b.weight")[perm])
    rows = np.arange(8).reshape(4, 2)[perm].ravel()           # value heads of width 2
    np.testing.assert_array_equal(g["blk.0.attn_gate.weight"], hf(p + "in_proj_z.weight")[rows])
    np.testing.assert_array_equal(g["blk.0.ssm_out.weight"], hf(p + "out_proj.weight")[:, rows])
    conv_w = hf(p + "conv1d.weight")[:, 0]                     # q, k channels 0..7 stay
    np.testing.assert_array_equal(g["blk.0.ssm_conv1d.weight"],
                                  np.concatenate([conv_w[:8], conv_w[8:][rows]]))
    # ssm_norm is not offset, every other norm is 1 + w
    np.testing.assert_array_equal(g["blk.0.ssm_norm.weight"], hf(p + "norm.weight"))
    np.testing.assert_allclose(g["blk.0.attn_norm.weight"],
                               hf("layers.0.input_layernorm.weight") + 1, rtol=1e-6)
    np.testing.assert_allclose(g["blk.3.attn_q_norm.weight"],
                               hf("layers.3.self_attn.q_norm.weight") + 1, rtol=1e-6)
    np.testing.assert_allclose(g["output_norm.weight"], hf("norm.weight") + 1, rtol=1e-6)
    np.testing.assert_allclose(g["blk.4.nextn.enorm.weight"],
                               t["mtp.pre_fc_norm_embedding.weight"] + 1, rtol=1e-6)
    np.testing.assert_array_equal(g["blk.4.nextn.eh_proj.weight"], t["mtp.fc.weight"])
    np.testing.assert_array_equal(g["blk.4.attn_q.weight"],
                                  t["mtp.layers.0.self_attn.q_proj.weight"])
    # bf16 input: the stored value is the bf16-rounded weight, v rows re-ordered
    qkv = t["model.language_model.layers.0.linear_attn.in_proj_qkv.weight"]
    rounded = ((qkv.view(np.uint32) >> 16) << 16).view(np.float32)
    np.testing.assert_array_equal(g["blk.0.attn_qkv.weight"],
                                  np.concatenate([rounded[:8], rounded[8:][rows]]))
    np.testing.assert_array_equal(g["output.weight"], t["lm_head.weight"])


def test_converter_refuses_unsupported_architecture_with_a_message(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert conv.main([str(tmp_path), "--outfile", str(tmp_path / "x.gguf")]) == 1
    err = capsys.readouterr().err
    assert "LlamaForCausalLM" in err and "not supported" in err


def test_converter_refuses_a_truncated_safetensors_file(tmp_path):
    tiny_qwen35_dir(tmp_path)
    raw = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(raw[:len(raw) // 2])
    with pytest.raises(conv.ConvertError, match="data_offsets|past the end"):
        conv.convert(tmp_path, tmp_path / "x.gguf", "f32")


def test_converter_names_a_missing_config_key(tmp_path, capsys):
    tiny_qwen35_dir(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["text_config"]["linear_num_value_heads"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert conv.main([str(tmp_path), "--outfile", str(tmp_path / "x.gguf")]) == 1
    assert "linear_num_value_heads" in capsys.readouterr().err
    assert not (tmp_path / "x.gguf").exists()


def test_converter_refuses_a_non_periodic_layer_pattern(tmp_path):
    tiny_qwen35_dir(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["text_config"]["layer_types"] = ["linear_attention", "full_attention",
                                         "linear_attention", "full_attention"]
    cfg["text_config"].pop("full_attention_interval")
    cfg["text_config"]["layer_types"][3] = "linear_attention"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(conv.ConvertError, match="periodic"):
        conv.convert(tmp_path, tmp_path / "x.gguf", "f32")


@pytest.mark.parametrize("qtype,fn,nbytes,tol", [
    (QT.Q4_K, kquant.quantize_q4_k, 144, 0.07), (QT.Q5_K, kquant.quantize_q5_k, 176, 0.035),
    (QT.Q6_K, kquant.quantize_q6_k, 210, 0.02)])
def test_kquant_blocks_decode_close_to_their_input(qtype, fn, nbytes, tol):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((5, 512)) * rng.uniform(0.01, 5, (5, 1))).astype(np.float32)
    x[0, :256] = 0.0
    q = fn(x)
    assert q.dtype == np.uint8 and q.shape == (5, 2 * nbytes)
    y = gguf.quants.dequantize(q, qtype)
    assert np.all(y[0, :256] == 0.0)
    rel = np.abs(y - x).max(-1) / np.abs(x).max(-1)
    assert rel.max() < tol, rel
    with pytest.raises(ValueError):
        fn(np.zeros((2, 100), np.float32))
