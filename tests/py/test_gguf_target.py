"""scripts/train/gguf_target.py: a qwen35 GGUF file back as a transformers model and a
`tokenizers` tokenizer without the `gguf` package (the drafter's training machine has none).

Independent references: the `gguf` package's reader and dequantiser, the converter's own
inverse of its stored conventions (scripts/convert_hf_to_gguf.py tensor_untransform), the
golden outputs transformers computed for the committed test models (scripts/make_golden.py),
and tandem itself (`tandem logits`, `tandem tokenize`) on the demo target.
"""
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import gguf

ROOT = pathlib.Path(os.environ.get("TANDEM_SOURCE_DIR") or pathlib.Path(__file__).parents[2])
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "scripts" / "train"))
import convert_hf_to_gguf as conv  # noqa: E402
import gguf_target as gt  # noqa: E402

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

MODELS = ROOT / "tests" / "data" / "models"
GOLDEN = ROOT / "tests" / "data" / "golden"
TINY = [MODELS / f"qwen35-tiny-{t}.gguf" for t in ("f32", "bf16", "q8_0")]
DEMO = ROOT / "models" / "demo" / "demo.gguf"
QWEN35_FILES = TINY + ([DEMO] if DEMO.is_file() else [])


def tandem_bin() -> str:
    build = os.environ.get("TANDEM_BUILD_DIR")
    path = (pathlib.Path(build) / "tandem" if build else ROOT / "build" / "tandem").resolve()
    if not path.is_file():
        pytest.skip(f"no tandem binary at {path} (set TANDEM_BUILD_DIR)")
    return str(path)


@pytest.mark.parametrize("path", QWEN35_FILES, ids=lambda p: p.name)
def test_tensors_and_metadata_read_as_the_gguf_package_reads_them(path):
    meta, tensors = gt.gguf_read(path)
    r = gguf.GGUFReader(str(path))
    assert sorted(tensors) == sorted(t.name for t in r.tensors)
    for t in r.tensors:
        want = gguf.quants.dequantize(t.data, t.tensor_type).reshape(
            tuple(int(n) for n in reversed(t.shape)))
        assert tensors[t.name].dtype == np.float32
        np.testing.assert_array_equal(tensors[t.name], want.astype(np.float32), err_msg=t.name)
    for key in ("qwen35.block_count", "qwen35.ssm.inner_size", "qwen35.rope.freq_base",
                "tokenizer.ggml.eos_token_id", "tokenizer.ggml.pre"):
        assert meta[key] == r.fields[key].contents(), key
    assert meta["tokenizer.ggml.tokens"] == r.fields["tokenizer.ggml.tokens"].contents()
    assert meta["tokenizer.ggml.merges"] == r.fields["tokenizer.ggml.merges"].contents()
    assert gt.gguf_read(path, tensors=False) == (meta, {})


@pytest.mark.parametrize("path", QWEN35_FILES, ids=lambda p: p.name)
def test_hf_state_undoes_exactly_what_the_converter_stored(path):
    meta, tensors = gt.gguf_read(path)
    state = gt.hf_state(meta, tensors)
    cfg = {**gt.hf_config(meta).to_dict(), "_arch": "qwen35"}
    n_main = cfg["num_hidden_layers"]
    assert all(not k.startswith("model.mtp") for k in state)
    stored = {k: v for k, v in tensors.items()
              if not (k.startswith("blk.") and int(k.split(".")[1]) >= n_main)}   # MTP
    assert len(state) == len(stored)
    for hf, x in state.items():
        g = conv.gguf_name(hf, cfg)
        want = conv.tensor_untransform(g, stored[g], cfg).astype(np.float32)
        np.testing.assert_array_equal(x, want, err_msg=hf)
        # and the converter's forward transform gives the stored values back
        np.testing.assert_allclose(conv.tensor_transform(g, x, cfg), stored[g], rtol=1e-6,
                                   atol=1e-6, err_msg=hf)


@pytest.mark.parametrize("path", TINY, ids=lambda p: p.name)
def test_model_reproduces_the_golden_logits_and_layer_outputs(path):
    model, _ = gt.target_load(path, attn="eager")
    model = model.double()
    r = gguf.GGUFReader(str(GOLDEN / path.name))
    golden = {t.name: np.asarray(t.data).reshape(tuple(int(n) for n in reversed(t.shape)))
              for t in r.tensors}
    ids = golden["tokens"].astype(np.int64)
    got = {}
    hooks = [layer.register_forward_hook(lambda m, a, o, l=l: got.__setitem__(
        l, (o[0] if isinstance(o, tuple) else o)[0])) for l, layer in
        enumerate(model.model.layers)]
    with torch.no_grad():
        logits = model(input_ids=torch.from_numpy(ids)[None]).logits[0].numpy()
    for h in hooks:
        h.remove()
    want = golden["logits"]
    assert np.abs(logits - want).max() <= 1e-6 * np.abs(want).max()
    for l in range(len(model.model.layers)):
        w = golden[f"hidden.{l}"]
        assert np.abs(got[l].numpy() - w).max() <= 1e-6 * np.abs(w).max(), l


@pytest.mark.skipif(not DEMO.is_file(), reason="no models/demo/demo.gguf")
def test_demo_target_gives_tandems_logits():
    tandem = tandem_bin()
    model, meta = gt.target_load(DEMO, attn="eager")
    tok = gt.tokenizer_of(meta)
    ids = tok.encode("class Stack:\n    def __init__(self):\n        self.items = []\n\n"
                     "    def push(self, item):\n", add_special_tokens=False).ids
    r = subprocess.run([tandem, "logits", "--model", str(DEMO), "--tokens",
                        ",".join(map(str, ids)), "--top", "5"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0]
    lines = r.stdout.strip().splitlines()
    assert len(lines) == len(ids)
    for line in lines:
        pos, rest = line.split(":", 1)
        pairs = [item.rstrip(")").split("(") for item in rest.split()]
        row = logits[int(pos)]
        assert [int(t) for t, _ in pairs] == row.topk(5).indices.tolist(), line
        for t, v in pairs:   # tandem prints 4 decimals
            assert abs(row[int(t)].item() - float(v)) < 1e-3, (line, row[int(t)].item())


TEXTS = [
    "import os\nimport sys\n\n\ndef main(argv):\n    return 0\n",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nok",
    "caf\u00e9 na\u0308ive \u00c5ngstr\u00f6m \u4f60\u597d \U0001f600 \t\r\n  x  ",
    "    x = {'a': 1, \"b\": [2.5, -3e10]}  # done<|endoftext|>tail",
]


@pytest.mark.skipif(not DEMO.is_file(), reason="no models/demo/demo.gguf")
@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_gives_tandems_token_ids(text):
    tandem = tandem_bin()
    tok = gt.tokenizer_of(gt.gguf_read(DEMO, tensors=False)[0])
    r = subprocess.run([tandem, "tokenize", "--model", str(DEMO), "--json", text],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    ids = tok.encode(text, add_special_tokens=False).ids
    assert ids == json.loads(r.stdout)
    assert tok.decode(ids, skip_special_tokens=False) == __import__("unicodedata").normalize(
        "NFC", text)


def test_tiny_vocabulary_matches_its_tokenizer_json():
    """The test models were converted from tests/data/models/tokenizer-qwen35.json: the
    rebuilt tokenizer encodes like that file does."""
    from tokenizers import Tokenizer
    want = Tokenizer.from_file(str(MODELS / "tokenizer-qwen35.json"))
    tok = gt.tokenizer_of(gt.gguf_read(TINY[0], tensors=False)[0])
    for text in TEXTS:
        assert tok.encode(text, add_special_tokens=False).ids == \
            want.encode(text, add_special_tokens=False).ids, text


def test_malformed_files_are_gguf_errors(tmp_path):
    raw = TINY[2].read_bytes()
    bad = tmp_path / "bad.gguf"
    for n in (0, 3, 10, 23, 100, 1000, len(raw) // 2, len(raw) - 1):
        bad.write_bytes(raw[:n])
        with pytest.raises(gt.GGUFError, match="truncated|past the end|bad magic|exceed"):
            gt.gguf_read(bad)
    bad.write_bytes(b"GGML" + raw[4:])
    with pytest.raises(gt.GGUFError, match="bad magic"):
        gt.gguf_read(bad)
    bad.write_bytes(raw[:4] + (7).to_bytes(4, "little") + raw[8:])
    with pytest.raises(gt.GGUFError, match="version 7"):
        gt.gguf_read(bad)
    bad.write_bytes(raw[:8] + (1 << 60).to_bytes(8, "little") + raw[16:])
    with pytest.raises(gt.GGUFError, match="exceed"):
        gt.gguf_read(bad)
    with pytest.raises(gt.GGUFError, match="No such file"):
        gt.gguf_read(tmp_path / "missing.gguf")


def test_unsupported_types_and_architectures_are_gguf_errors():
    with pytest.raises(gt.GGUFError, match="ggml type 12"):      # Q4_K
        gt.gguf_read(MODELS / "qwen3-tied-q4_k.gguf")
    meta, _ = gt.gguf_read(MODELS / "qwen3-tiny-f32.gguf")
    with pytest.raises(gt.GGUFError, match="only qwen35"):
        gt.hf_config(meta)
    meta, _ = gt.gguf_read(TINY[0])
    del meta["qwen35.ssm.state_size"]
    with pytest.raises(gt.GGUFError, match="qwen35.ssm.state_size is missing"):
        gt.hf_config(meta)
