#!/usr/bin/env python3
"""Trains the small byte-level BPE vocabulary that the tiny test models use.

    python3 scripts/train_tokenizer.py          # rewrites tests/data/models/tokenizer*.json

Input: tests/data/models/tokenizer-corpus.txt (committed; about 75 KB of Python 3.11 standard
library docstrings, the Zen of Python, and a few lines of multilingual text, emoji, combining
marks, digits and code written for this purpose, so that every pre-tokeniser branch is hit).

Output, both with the same vocabulary and merges, shaped like Qwen's tokenizer.json files:
  tests/data/models/tokenizer.json          pre-tokeniser regex of `qwen2` (qwen3 models)
  tests/data/models/tokenizer-qwen35.json   pre-tokeniser regex of `qwen35` (adds \\p{M})

Layout: 256 byte-level symbols and merges up to N_BPE tokens (ids 0..N_BPE-1), then the
added tokens in ADDED order (ids N_BPE..). As in Qwen's files, <|endoftext|>, <|im_start|>,
<|im_end|> and <|mask|> are special; <think>, </think>, <tool_call>, </tool_call> are added
tokens that are not special (GGUF token type USER_DEFINED, not CONTROL). <|mask|> is the
DFlash drafters' mask token. Deterministic: the same corpus gives byte-identical files.
"""
import json
import pathlib
import sys

from tokenizers import Regex, Tokenizer, AddedToken, decoders, models, normalizers
from tokenizers import pre_tokenizers, processors, trainers

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "models"

# Pre-tokeniser regexes, exactly as DESIGN section 9 gives them.
REGEX = {
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen35": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}
N_BPE = 504  # byte alphabet + merges; with the 8 added tokens the vocabulary is 512
ADDED = [  # (text, special)
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<think>", False),
    ("</think>", False),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|mask|>", True),
]


def tokenizer_build(pre: str) -> Tokenizer:
    """An untrained tokenizer with Qwen's normaliser, pre-tokeniser and decoder."""
    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(REGEX[pre]), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False,
                                              use_regex=False)
    return tok


def tokenizer_train(corpus: str) -> Tokenizer:
    tok = tokenizer_build("qwen2")
    trainer = trainers.BpeTrainer(vocab_size=N_BPE, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus.split("\n\n"), trainer=trainer)
    assert tok.get_vocab_size() == N_BPE, tok.get_vocab_size()
    for text, special in ADDED:  # one at a time so that ids follow ADDED order
        added = AddedToken(text, special=special, normalized=False)
        (tok.add_special_tokens if special else tok.add_tokens)([added])
    return tok


def tokenizer_json(tok: Tokenizer, pre: str) -> str:
    """tok serialised with the pre-tokeniser regex of `pre`."""
    doc = json.loads(tok.to_str())
    doc["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {"Regex": REGEX[pre]}
    return json.dumps(doc, ensure_ascii=False, indent=2) + "\n"


def main() -> int:
    corpus = (DATA / "tokenizer-corpus.txt").read_text(encoding="utf-8")
    tok = tokenizer_train(corpus)
    for pre, name in (("qwen2", "tokenizer.json"), ("qwen35", "tokenizer-qwen35.json")):
        text = tokenizer_json(tok, pre)
        (DATA / name).write_text(text, encoding="utf-8")
        check = Tokenizer.from_str(text)
        assert check.get_vocab_size() == N_BPE + len(ADDED)
        for i, (t, _) in enumerate(ADDED):
            assert check.token_to_id(t) == N_BPE + i, t
    print(f"wrote {DATA}/tokenizer.json and tokenizer-qwen35.json ({N_BPE + len(ADDED)} tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
