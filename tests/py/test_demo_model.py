"""The trained demo pair in models/demo (scripts/train/run_all.sh on a GPU, then
scripts/train/finish.sh): the files load, speculative greedy decoding gives exactly the plain
greedy output, the drafter is worth running, `tandem generate` picks the pair by default, and a
Python prompt gets Python back.

Skipped while models/demo does not exist. TANDEM_DEMO_DIR points the test at another folder
laid out the same way (finish.sh --dest), to check a pair before it replaces the built-in one.
"""
import json
import os
import pathlib
import re
import subprocess

import pytest

import gguf

ROOT = pathlib.Path(os.environ.get("TANDEM_SOURCE_DIR") or pathlib.Path(__file__).parents[2])
DEMO = pathlib.Path(os.environ.get("TANDEM_DEMO_DIR") or ROOT / "models" / "demo")
MODEL, DRAFT = DEMO / "demo.gguf", DEMO / "drafter"
LIMIT = 16_000_000
STATS = re.compile(r"generated (\d+) tokens .*; steps (\d+), acceptance length ([\d.]+)")
PROMPTS = [
    "import os\nimport sys\n\n\ndef main(argv):\n    ",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "def parse_args(args=None):\n    parser = argparse.ArgumentParser(description=__doc__)\n",
]

pytestmark = pytest.mark.skipif(
    not (MODEL.is_file() and (DRAFT / "config.json").is_file()),
    reason=f"{DEMO} has no demo pair yet: scripts/train/run_all.sh on a GPU, then "
           "scripts/train/finish.sh, make it")


@pytest.fixture(scope="module")
def tandem():
    build = os.environ.get("TANDEM_BUILD_DIR")
    path = (pathlib.Path(build) / "tandem" if build else ROOT / "build" / "tandem").resolve()
    assert path.is_file(), f"no tandem binary at {path} (set TANDEM_BUILD_DIR)"
    return str(path)


def generate(tandem, prompt, n, *args, cwd=None):
    """(ids, steps) of a greedy run; -n tokens exactly (--ignore-eos)."""
    r = subprocess.run([tandem, "generate", "--prompt", prompt, "-n", str(n), "--ignore-eos",
                        "--ids", *args], capture_output=True, text=True, timeout=600, cwd=cwd)
    assert r.returncode == 0, r.stderr
    m = STATS.search(r.stderr)
    assert m, r.stderr
    ids = [int(x) for x in r.stdout.strip().split(",")]
    assert len(ids) == n == int(m.group(1))
    return ids, int(m.group(2))


def test_demo_files_have_the_layouts_tandem_loads():
    assert MODEL.stat().st_size <= LIMIT
    assert (DRAFT / "model.safetensors").stat().st_size <= LIMIT
    r = gguf.GGUFReader(str(MODEL))
    field = lambda k: r.fields[k].contents()  # noqa: E731
    assert field("general.architecture") == "qwen35"
    assert field("tokenizer.ggml.pre") == "qwen2"
    n_layer, hidden = field("qwen35.block_count"), field("qwen35.embedding_length")
    kinds = {t.name.split(".", 2)[-1] if t.name.startswith("blk.") else t.name for t in r.tensors}
    # every tensor kind of the real model: untied head, gated attention with q/k norms,
    # Gated DeltaNet with conv, gates, decay and output norm
    for k in ["token_embd.weight", "output_norm.weight", "output.weight", "attn_norm.weight",
              "post_attention_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight",
              "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
              "attn_q_norm.weight", "attn_k_norm.weight", "attn_qkv.weight", "attn_gate.weight",
              "ssm_conv1d.weight", "ssm_a", "ssm_dt.bias", "ssm_alpha.weight", "ssm_beta.weight",
              "ssm_norm.weight", "ssm_out.weight"]:
        assert k in kinds, k
    assert field("qwen35.full_attention_interval") == 4 and n_layer % 4 == 0
    assert field("qwen35.ssm.time_step_rank") > field("qwen35.ssm.group_count")  # v > k heads
    assert field("qwen35.rope.dimension_count") < field("qwen35.attention.key_length")
    tokens = r.fields["tokenizer.ggml.tokens"]
    vocab = [bytes(tokens.parts[i]).decode() for i in tokens.data]
    cfg = json.loads((DRAFT / "config.json").read_text())
    assert cfg["hidden_size"] == hidden and cfg["num_target_layers"] == n_layer
    assert cfg["block_size"] == 16
    assert vocab[cfg["dflash_config"]["mask_token_id"]] == "<|mask|>"
    assert all(0 <= t < n_layer for t in cfg["dflash_config"]["target_layer_ids"])
    raw = (DRAFT / "model.safetensors").read_bytes()
    header = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
    header.pop("__metadata__", None)
    assert header["fc.weight"]["shape"] == [hidden, hidden * len(
        cfg["dflash_config"]["target_layer_ids"])]
    assert {v["dtype"] for v in header.values()} == {"BF16"}


def test_greedy_output_is_the_same_with_and_without_the_drafter(tandem):
    steps = generated = 0
    for p in PROMPTS:
        plain, plain_steps = generate(tandem, p, 64, "--model", str(MODEL))
        spec, spec_steps = generate(tandem, p, 64, "--model", str(MODEL), "--draft", str(DRAFT))
        assert spec == plain, p
        assert plain_steps == 63
        steps, generated = steps + spec_steps, generated + 63
    # the drafter earns its keep: on average well over one token per target pass
    assert generated / steps >= 2.0, generated / steps


def test_generate_uses_the_demo_pair_by_default(tandem, tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "demo").symlink_to(DEMO.resolve())
    want, _ = generate(tandem, PROMPTS[0], 32, "--model", str(MODEL))
    got, steps = generate(tandem, PROMPTS[0], 32, cwd=tmp_path)
    assert got == want
    assert steps < 31          # the drafter came with the default model
    got, steps = generate(tandem, PROMPTS[0], 32, "--draft", "", cwd=tmp_path)
    assert got == want and steps == 31


def test_python_prompts_get_python_back(tandem):
    # A 14.6M-parameter model soon repeats itself under greedy decoding, so plausibility is
    # judged over the three prompts together: Python keywords and code lines, valid UTF-8.
    words, lines = set(), 0
    for p in PROMPTS:
        r = subprocess.run([tandem, "generate", "--model", str(MODEL), "--draft", str(DRAFT),
                            "--prompt", p, "-n", "96", "--ignore-eos"],
                           capture_output=True, timeout=600)
        assert r.returncode == 0, r.stderr
        text = r.stdout.decode("utf-8")          # strict: only valid UTF-8
        assert "\ufffd" not in text
        words |= set(re.findall(r"\b(def|return|self|if|for|in|not|None|else|import|is)\b", text))
        lines += text.count("\n")
    assert len(words) >= 3, words
    assert lines >= 9, lines                     # code lines, not run-on strings
