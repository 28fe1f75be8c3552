"""`tandem generate` and `tandem logits` on the tiny test models: greedy output with a DFlash
drafter prints exactly the tokens plain decoding prints, for several prompts, lengths and
drafters; the statistics line reports an acceptance length; bad input is a clear error."""
import os
import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(os.environ.get("TANDEM_SOURCE_DIR", pathlib.Path(__file__).parents[2]))
BUILD = pathlib.Path(os.environ.get("TANDEM_BUILD_DIR", ROOT / "build"))
TANDEM = BUILD / "tandem"
MODEL = ROOT / "tests/data/models/qwen35-tiny-f32.gguf"
DRAFTERS = [ROOT / "tests/data/drafter" / d for d in ("dflash-b16", "dflash-b8", "dflash-swa")]


def run(*args, check=True):
    p = subprocess.run([str(TANDEM), *map(str, args)], capture_output=True, text=True, timeout=120)
    if check and p.returncode != 0:
        raise AssertionError(f"tandem {' '.join(map(str, args))} failed: {p.stderr}")
    return p


def generate_ids(prompt, n, draft=None, extra=()):
    args = ["generate", "--model", MODEL, "--prompt", prompt, "-n", n, "--ids", "--ignore-eos", *extra]
    if draft:
        args += ["--draft", draft]
    p = run(*args)
    ids = [int(x) for x in p.stdout.strip().split(",")]
    return ids, p.stderr


PROMPTS = ["def fib(n):", "Hello, world", "<|im_start|>user\nhi<|im_end|>\n", "x = [1, 2, 3]\nfor"]


@pytest.mark.parametrize("draft", DRAFTERS, ids=lambda d: d.name)
@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_with_drafter_prints_the_plain_tokens(draft, prompt):
    for n in (1, 7, 40):
        plain, _ = generate_ids(prompt, n)
        spec, stats = generate_ids(prompt, n, draft)
        assert len(plain) == n
        assert spec == plain
        if n > 1:
            m = re.search(r"steps (\d+), acceptance length ([0-9.]+)", stats)
            assert m, stats
            steps, tau = int(m.group(1)), float(m.group(2))
            assert steps >= 1 and 1.0 <= tau <= 16.0


def test_seeded_sampling_is_reproducible():
    a, _ = generate_ids("import os", 20, DRAFTERS[0], ("--temp", "0.8", "--seed", "7"))
    b, _ = generate_ids("import os", 20, DRAFTERS[0], ("--temp", "0.8", "--seed", "7"))
    c, _ = generate_ids("import os", 20, DRAFTERS[0], ("--temp", "0.8", "--seed", "8"))
    assert a == b
    assert a != c


def test_logits_prints_top_tokens_per_position():
    p = run("logits", "--model", MODEL, "--tokens", "1,2,3", "--top", "3")
    lines = p.stdout.strip().split("\n")
    assert len(lines) == 3
    for i, line in enumerate(lines):
        assert re.fullmatch(rf"{i}:( \d+\(-?[0-9.]+\)){{3}}", line), line


def test_bad_input_is_a_clear_error():
    p = run("generate", "--model", MODEL, "--prompt-ids", "1,99999", "-n", "2", check=False)
    assert p.returncode == 1 and "outside the vocabulary" in p.stderr
    p = run("generate", "--model", ROOT / "tests/data/drafter/dflash-b16/config.json",
            "--prompt", "x", check=False)
    assert p.returncode == 1 and "cannot load the model" in p.stderr
    p = run("generate", "--model", MODEL, "--draft", ROOT / "tests/data/models", "--prompt", "x",
            check=False)
    assert p.returncode == 1 and "drafter" in p.stderr
    p = run("logits", "--model", MODEL, "--tokens", "1,x", check=False)
    assert p.returncode == 1 and "token ids" in p.stderr
