#!/usr/bin/env python3
"""Step 1 of the demo pair: the training text, the vocabulary and the token streams.

    python3 scripts/train/prepare_data.py WORK [--deadline EPOCH_S] [--smoke]

Data: the Python source files of this machine's Python installation (standard library and
site-packages, found through sysconfig and site), so the run needs no download. The file list
is deterministic for a given installation: every root is walked in sorted order without
following links, files are filtered (UTF-8, 200 B .. 400 KB, no line over 400 characters:
that drops generated tables and minified data), line ends become \\n, and exact duplicates are
dropped (the first in sorted order stays). A file is held out when its content hash falls in
the first `heldout_percent` of 100 buckets: held-out files give the evaluation prompts and the
validation text and never reach training (duplicates share a hash, so they share a side).
Training files are taken in content-hash order up to `train_bytes`.

Vocabulary: byte-level BPE trained with `tokenizers` on the first `tok_sample_bytes` of the
training text, with the qwen2 pre-tokeniser regex (DESIGN section 9) and NFC, then the ADDED
tokens of sizes.py (ChatML, <|endoftext|>, think/tool tags, <|mask|>).

With a deadline, the file walk and the tokenising stop early (logged) rather than overrun it.

Writes to WORK: train.npy and eval.npy (uint16 token streams, each file followed by
<|endoftext|>), and to WORK/meta: target/tokenizer.json, target/tokenizer_config.json,
target/chat_template.jinja, data.json (the file counts and the evaluation prompts).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import shutil
import site
import sys
import sysconfig
import time

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import sizes as S  # noqa: E402
import util  # noqa: E402
from train_tokenizer import REGEX, tokenizer_build  # noqa: E402  (Qwen's pre-tokeniser etc.)

STEP = "prepare"
MAX_FILE, MIN_FILE, MAX_LINE = 400_000, 200, 400


def roots() -> list[tuple[str, pathlib.Path]]:
    """(label, folder) of every place Python source lives, stdlib first; no folder twice."""
    paths = sysconfig.get_paths()
    found = [("stdlib", paths["stdlib"]), ("purelib", paths["purelib"]),
             ("platlib", paths["platlib"])]
    found += [(f"site{i}", p) for i, p in enumerate(site.getsitepackages())]
    out, seen = [], set()
    for label, p in found:
        p = pathlib.Path(p)
        if p.is_dir() and p.resolve() not in seen:
            seen.add(p.resolve())
            out.append((label, p))
    return out


def source_files(stop_at: float = float("inf")) -> list[tuple[str, str]]:
    """(name, text) of every usable .py file, sorted by name, exact duplicates dropped. Walking
    stops at `stop_at` (epoch seconds) with what it has."""
    seen_paths, seen_text, out = set(), set(), []
    for label, root in roots():
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            if time.time() > stop_at:
                util.log(STEP, "file scan out of time: using the files found so far")
                return out
            dirnames.sort()
            for f in sorted(filenames):
                if not f.endswith(".py"):
                    continue
                p = pathlib.Path(dirpath) / f
                try:
                    rp = p.resolve()
                    if rp in seen_paths or not p.is_file():
                        continue
                    seen_paths.add(rp)
                    size = p.stat().st_size
                    if not MIN_FILE <= size <= MAX_FILE:
                        continue
                    text = p.read_bytes().decode("utf-8")
                except (OSError, UnicodeDecodeError):
                    continue
                text = text.replace("\r\n", "\n").replace("\r", "\n")
                if "\x00" in text or max(map(len, text.split("\n"))) > MAX_LINE:
                    continue
                h = hashlib.sha256(text.encode("utf-8")).digest()
                if h in seen_text:
                    continue
                seen_text.add(h)
                out.append((f"{label}/{p.relative_to(root).as_posix()}", text))
    return out


def text_hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


def prompt_of(name: str, text: str, lo: int, hi: int) -> dict | None:
    """A code prefix from the middle of a held-out file: whole lines ending at a point 30..70%
    into the file (chosen by the name's hash), at most `hi` characters, at least `lo`, with
    code after it; None when the file has no such place."""
    h = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big")
    cut = int(len(text) * (0.3 + 0.4 * (h % 1000) / 1000))
    cut = text.find("\n", cut)
    if cut < 0 or len(text) - cut < 200:
        return None
    cut += 1
    start = text.find("\n", max(0, cut - hi)) + 1 if cut > hi else 0
    prompt = text[start:cut]
    if len(prompt) < lo or not prompt.strip():
        return None
    return {"file": name, "prompt": prompt, "reference": text[cut:cut + 600]}


def vocabulary_train(s: dict, texts: list[str]):
    from tokenizers import AddedToken, pre_tokenizers, trainers
    tok = tokenizer_build("qwen2")
    trainer = trainers.BpeTrainer(vocab_size=S.n_bpe(s), min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    if tok.get_vocab_size() != S.n_bpe(s):
        util.fail(STEP, f"the BPE trainer made {tok.get_vocab_size()} tokens, not {S.n_bpe(s)} "
                  "(too little text for the vocabulary size)")
    for text, special in S.ADDED:  # one at a time so that ids follow ADDED order
        added = AddedToken(text, special=special, normalized=False)
        (tok.add_special_tokens if special else tok.add_tokens)([added])
    for text, _ in S.ADDED:
        assert tok.token_to_id(text) == S.token_id(s, text), text
    return tok


def stream(tok, texts: list[str], eos: int, stop_at: float = float("inf")) -> np.ndarray:
    """The texts tokenised, each followed by eos, as one uint16 array; stops early (with the
    files done so far) at `stop_at` (epoch seconds)."""
    parts = []
    step = 2000
    for i in range(0, len(texts), step):
        if time.time() > stop_at:
            util.log(STEP, f"tokenising out of time after {i} of {len(texts)} files")
            break
        for enc in tok.encode_batch(texts[i:i + step], add_special_tokens=False):
            parts.append(np.asarray(enc.ids, dtype=np.uint16))
            parts.append(np.asarray([eos], dtype=np.uint16))
    return np.concatenate(parts) if parts else np.zeros(0, np.uint16)


def tokenizer_config(s: dict) -> dict:
    return {"add_bos_token": False, "bos_token": None, "eos_token": S.EOS, "pad_token": S.EOS,
            "model_max_length": s["ctx"], "tokenizer_class": "Qwen2Tokenizer",
            "clean_up_tokenization_spaces": False}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("work")
    ap.add_argument("--deadline", type=float, default=float("inf"), help="epoch seconds")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    left = args.deadline - time.time()
    s = S.sizes(args.smoke)
    work = pathlib.Path(args.work)
    meta = work / "meta"
    (meta / "target").mkdir(parents=True, exist_ok=True)

    t0 = time.time()
    files = source_files(time.time() + 0.35 * left)
    train, held = [], []
    for name, text in files:
        (held if text_hash(text) % 100 < s["heldout_percent"] else train).append((name, text))
    train.sort(key=lambda f: text_hash(f[1]))
    held.sort(key=lambda f: f[0])
    util.log(STEP, f"{len(files)} source files ({sum(len(t) for _, t in files) / 1e6:.1f} MB "
             f"after de-duplication) under {', '.join(str(r) for _, r in roots())}; "
             f"{len(held)} held out; {time.time() - t0:.1f}s")
    picked, n = [], 0
    for name, text in train:
        if n >= s["train_bytes"]:
            break
        picked.append(text)
        n += len(text)
    if not picked or not held:
        util.fail(STEP, "not enough Python source files found")

    prompts = []
    for name, text in held:
        p = prompt_of(name, text, *s["prompt_chars"])
        if p:
            prompts.append(p)
        if len(prompts) == s["n_prompts"]:
            break
    eval_texts, m = [], 0
    for name, text in held:
        if m >= s["eval_bytes"]:
            break
        eval_texts.append(text)
        m += len(text)

    t0 = time.time()
    sample, k = [], 0
    for text in picked:
        if k >= s["tok_sample_bytes"]:
            break
        sample.append(text)
        k += len(text)
    tok = vocabulary_train(s, sample)
    util.log(STEP, f"BPE vocabulary of {tok.get_vocab_size()} tokens from {k / 1e6:.1f} MB in "
             f"{time.time() - t0:.1f}s")

    doc = json.loads(tok.to_str())
    assert doc["pre_tokenizer"]["pretokenizers"][0]["pattern"] == {"Regex": REGEX["qwen2"]}
    (meta / "target" / "tokenizer.json").write_text(
        json.dumps(doc, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    util.json_write(meta / "target" / "tokenizer_config.json", tokenizer_config(s))
    shutil.copyfile(HERE / "chat_template.jinja", meta / "target" / "chat_template.jinja")

    t0 = time.time()
    eos = S.token_id(s, S.EOS)
    train_ids = stream(tok, picked, eos, args.deadline - 8)
    eval_ids = stream(tok, eval_texts, eos)
    np.save(work / "train.npy", train_ids)
    np.save(work / "eval.npy", eval_ids)
    util.log(STEP, f"tokenised {n / 1e6:.1f} MB -> {len(train_ids) / 1e6:.2f}M training tokens "
             f"({n / max(1, len(train_ids)):.2f} chars/token), {len(eval_ids) / 1e6:.3f}M "
             f"held-out tokens in {time.time() - t0:.1f}s")
    for p in prompts:
        p["n_tokens"] = len(tok.encode(p["prompt"], add_special_tokens=False).ids)
    manifest = {
        "python": sys.version.split()[0], "roots": [str(r) for _, r in roots()],
        "files": len(files), "held_out_files": len(held), "train_files": len(picked),
        "train_chars": n, "train_tokens": int(len(train_ids)), "eval_tokens": int(len(eval_ids)),
        "file_list_sha256": hashlib.sha256("\n".join(f for f, _ in files).encode()).hexdigest(),
        "prompts": prompts,
    }
    util.json_write(meta / "data.json", manifest)
    util.log(STEP, f"{len(prompts)} evaluation prompts from held-out files "
             f"(mean {np.mean([p['n_tokens'] for p in prompts]):.0f} tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
