#!/usr/bin/env python3
"""Writes a tokenizer-only GGUF from a Hugging Face byte-level BPE tokenizer.json, with the
keys and token types llama.cpp's converter (convert_hf_to_gguf.py, get_vocab_base and
gguf-py's SpecialVocab) writes for Qwen models:

  tokenizer.ggml.model = "gpt2", tokenizer.ggml.pre = "qwen2" | "qwen35",
  tokenizer.ggml.tokens / token_type (NORMAL; added tokens CONTROL when special or looking
  like <|...|>, else USER_DEFINED; ids without a token "[PAD<id>]" UNUSED),
  tokenizer.ggml.merges, special token ids and add_*_token flags from tokenizer_config.json
  and config.json beside tokenizer.json, tokenizer.chat_template when present.

    scripts/tokenizer_to_gguf.py DIR_OR_TOKENIZER_JSON OUT.gguf [--pre qwen35] [--vocab-size N]

The pre-tokeniser is recognised from the Split regex in tokenizer.json; any other regex is
refused unless --pre names one (the C tokenizer only implements these two).
"""
import argparse
import json
import os
import sys

import gguf

PATTERNS = {
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""": "qwen2",
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""": "qwen35",
}
ARCH_OF_PRE = {"qwen2": "qwen3", "qwen35": "qwen35"}


def detect_pre(tj):
    """The pre name of the Split regex in tokenizer.json, or None."""
    pt = tj.get("pre_tokenizer") or {}
    for p in pt.get("pretokenizers", [pt]):
        if p.get("type") == "Split":
            return PATTERNS.get((p.get("pattern") or {}).get("Regex"))
    return None


def looks_special(text):
    # llama.cpp's does_token_look_special, the cases that apply to byte-level BPE models.
    return (text.startswith("<|") and text.endswith("|>")) or (text.startswith("<｜") and text.endswith("｜>"))


def build(src, out, pre=None, vocab_size=None, arch=None):
    folder = src if os.path.isdir(src) else os.path.dirname(os.path.abspath(src))
    path = os.path.join(src, "tokenizer.json") if os.path.isdir(src) else src
    with open(path, encoding="utf-8") as f:
        tj = json.load(f)
    model = tj.get("model") or {}
    if model.get("type") != "BPE" or model.get("byte_fallback"):
        raise SystemExit(f"{path}: not a byte-level BPE tokenizer (model {model.get('type')!r})")
    if model.get("ignore_merges"):
        raise SystemExit(f"{path}: ignore_merges is set, which the qwen2/qwen35 tokenizers do not do")
    found = detect_pre(tj)
    if pre is None:
        if found is None:
            raise SystemExit(f"{path}: the pre-tokeniser regex is neither qwen2's nor qwen35's (use --pre to force)")
        pre = found

    vocab = dict(model["vocab"])
    added = {t["id"]: t for t in tj.get("added_tokens", [])}
    for i, t in added.items():
        vocab[t["content"]] = i
    reverse = {i: tok for tok, i in vocab.items()}
    n = max(vocab_size or 0, max(reverse) + 1)

    tokens, types = [], []
    for i in range(n):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in added:
            tokens.append(added[i]["content"])
            special = added[i].get("special") or looks_special(added[i]["content"])
            types.append(gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(reverse[i])
            types.append(gguf.TokenType.NORMAL)

    w = gguf.GGUFWriter(out, arch or ARCH_OF_PRE[pre])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    special = gguf.SpecialVocab(folder, load_merges=True, n_vocab=len(tokens))
    if not special.merges:
        raise SystemExit(f"{path}: no merges")
    special.add_to_gguf(w, quiet=True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return pre, len(tokens), len(special.merges)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", help="tokenizer.json, or the folder holding it")
    ap.add_argument("out", help="output .gguf")
    ap.add_argument("--pre", choices=sorted(set(PATTERNS.values())), help="override the detected pre-tokeniser")
    ap.add_argument("--vocab-size", type=int, help="pad with UNUSED tokens to this many (the model's embedding rows)")
    ap.add_argument("--arch", help="general.architecture (default: qwen35 for qwen35, qwen3 for qwen2)")
    a = ap.parse_args()
    pre, n, m = build(a.src, a.out, a.pre, a.vocab_size, a.arch)
    print(f"{a.out}: pre {pre}, {n} tokens, {m} merges", file=sys.stderr)


if __name__ == "__main__":
    main()
