#!/usr/bin/env python3
"""Step 1 of the demo pair: the training text, the vocabulary, the token streams and the
drafter's prompts.

    python3 scripts/train/prepare_data.py WORK [--deadline EPOCH_S] [--smoke] [--target F.gguf]

Data: the Python source files of this machine's Python installation (standard library and
site-packages, found through sysconfig and site), so the run needs no download. The file list
is deterministic for a given installation: every root is walked in sorted order without
following links, files are filtered (UTF-8, 200 B .. 400 KB, no line over 400 characters:
that drops generated tables and minified data), line ends become \\n, and exact duplicates are
dropped (the first in sorted order stays). A file is held out when its content hash falls in
the first `heldout_percent` of 100 buckets: held-out files give the evaluation prompts and the
validation text and never reach training (duplicates share a hash, so they share a side).
Training files are taken in content-hash order.

Vocabulary (from-scratch target): byte-level BPE trained with `tokenizers` on the first
`tok_sample_bytes` of the training text, with the qwen2 pre-tokeniser regex (DESIGN section 9)
and NFC, then the ADDED tokens of sizes.py (ChatML, <|endoftext|>, think/tool tags,
<|mask|>); the target's token streams are the training files up to `train_bytes`. With
`--target F.gguf` the vocabulary is the file's own (gguf_target.tokenizer_of) and there are no
streams: that target is not trained.

Drafter prompts: whole lines of source ending at a random line end, `d_prompt_chars` long,
about one per `prompt_every` characters of each training file (up to `train_prompts`), and one
per held-out file that gave no evaluation prompt (up to `val_prompts`, as long as evaluation
prompts: `prompt_chars`); the drafter step has them continued by the target.

With a deadline, the file walk and the tokenising stop early (logged) rather than overrun it.

Writes to WORK: prompts.npz (the drafter's prompts: train_ids/train_off, val_ids/val_off as
token ids and row offsets), train.npy and eval.npy (from scratch only: uint16 token streams,
each file followed by <|endoftext|>), and to WORK/meta: data.json (the file counts, the
target GGUF's name and sha256, which convert_target.py adds from scratch, the evaluation
prompts) and, from scratch,
target/tokenizer.json, target/tokenizer_config.json, target/chat_template.jinja.
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
from convert_target import gguf_describe  # noqa: E402
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


def prompts_cut(name: str, text: str, n: int, lo: int, hi: int) -> list[str]:
    """n code prefixes of a training file for the drafter's continuations: whole lines ending
    at a random line end (10% into the file or later, with at least 200 characters after it),
    between lo and hi characters long where the file allows; the cuts follow from the name,
    so the same files give the same prompts."""
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big"))
    out = []
    for _ in range(n):
        if len(text) < 400:
            break
        cut = text.find("\n", int(rng.integers(len(text) // 10, len(text) - 200)))
        if cut < 0:
            continue
        cut += 1
        want = int(rng.integers(lo, hi + 1))
        start = text.find("\n", cut - want) + 1 if cut > want else 0
        if text[start:cut].strip():
            out.append(text[start:cut])
    return out


def ids_pack(tok, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The texts tokenised: (all ids one after another as int32, offsets [n + 1])."""
    rows = [np.asarray(e.ids, dtype=np.int32)
            for e in tok.encode_batch(texts, add_special_tokens=False)]
    off = np.zeros(len(rows) + 1, dtype=np.int64)
    off[1:] = np.cumsum([len(r) for r in rows])
    return (np.concatenate(rows) if rows else np.zeros(0, np.int32)), off


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
    ap.add_argument("--target", help="GGUF target: its vocabulary, no BPE training, no streams")
    args = ap.parse_args()
    left = args.deadline - time.time()
    s = S.sizes(args.smoke)
    work = pathlib.Path(args.work)
    meta = work / "meta"
    (meta / "target").mkdir(parents=True, exist_ok=True)

    t0 = time.time()
    files = source_files(time.time() + max(10.0, (0.5 if args.target else 0.35) * left))
    train, held = [], []
    for name, text in files:
        (held if text_hash(text) % 100 < s["heldout_percent"] else train).append((name, text))
    train.sort(key=lambda f: text_hash(f[1]))
    held.sort(key=lambda f: f[0])
    util.log(STEP, f"{len(files)} source files ({sum(len(t) for _, t in files) / 1e6:.1f} MB "
             f"after de-duplication) under {', '.join(str(r) for _, r in roots())}; "
             f"{len(held)} held out; {time.time() - t0:.1f}s")
    if not train or not held:
        util.fail(STEP, "not enough Python source files found")

    prompts = []
    for name, text in held:
        p = prompt_of(name, text, *s["prompt_chars"])
        if p:
            prompts.append(p)
        if len(prompts) == s["n_prompts"]:
            break
    used = {p["file"] for p in prompts}
    val_texts = [t for name, text in held if name not in used
                 for t in prompts_cut(name, text, 1, *s["prompt_chars"])][:s["val_prompts"]]
    train_texts, n_prompt_files = [], 0
    for name, text in train:
        if len(train_texts) >= s["train_prompts"]:
            break
        n_prompt_files += 1
        train_texts += prompts_cut(name, text, max(1, len(text) // s["prompt_every"]),
                                   *s["d_prompt_chars"])
    train_texts = train_texts[:s["train_prompts"]]

    n_train_files, n_train_chars = n_prompt_files, sum(len(t) for t in train_texts)
    if args.target:
        from gguf_target import gguf_read, tokenizer_of
        target = pathlib.Path(args.target)
        tok = tokenizer_of(gguf_read(target, tensors=False)[0])
        util.log(STEP, f"vocabulary of {tok.get_vocab_size()} tokens from {target}")
    else:
        tok, n_train_files, n_train_chars = vocabulary_and_streams(s, work, meta, train, held,
                                                    args.deadline)
    t0 = time.time()
    tr_ids, tr_off = ids_pack(tok, train_texts)
    va_ids, va_off = ids_pack(tok, val_texts)
    np.savez(work / "prompts.npz", train_ids=tr_ids, train_off=tr_off, val_ids=va_ids,
             val_off=va_off)
    util.log(STEP, f"{len(train_texts)} training prompts ({len(tr_ids) / 1e6:.2f}M tokens), "
             f"{len(val_texts)} validation prompts for the drafter in {time.time() - t0:.1f}s")
    for p in prompts:
        p["n_tokens"] = len(tok.encode(p["prompt"], add_special_tokens=False).ids)
    manifest = {
        "python": sys.version.split()[0], "roots": [str(r) for _, r in roots()],
        "files": len(files), "held_out_files": len(held), "train_files": n_train_files,
        "train_chars": n_train_chars, "train_tokens": None, "eval_tokens": None,
        "drafter_prompts": len(train_texts), "drafter_val_prompts": len(val_texts),
        "file_list_sha256": hashlib.sha256("\n".join(f for f, _ in files).encode()).hexdigest(),
        "target": gguf_describe(pathlib.Path(args.target)) if args.target else None,
        "prompts": prompts,
    }
    if not args.target:
        manifest["train_tokens"] = int(len(np.load(work / "train.npy", mmap_mode="r")))
        manifest["eval_tokens"] = int(len(np.load(work / "eval.npy", mmap_mode="r")))
    util.json_write(meta / "data.json", manifest)
    util.log(STEP, f"{len(prompts)} evaluation prompts from held-out files "
             f"(mean {np.mean([p['n_tokens'] for p in prompts]):.0f} tokens)")
    return 0


def vocabulary_and_streams(s: dict, work: pathlib.Path, meta: pathlib.Path, train: list,
                           held: list, deadline: float):
    """The from-scratch target's data: its BPE vocabulary (tokenizer files under
    meta/target) and the token streams WORK/train.npy, WORK/eval.npy. Returns the tokenizer
    and the number and characters of the training files."""
    picked, n = [], 0
    for name, text in train:
        if n >= s["train_bytes"]:
            break
        picked.append(text)
        n += len(text)
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
    eos = s["eos_id"]
    train_ids = stream(tok, picked, eos, deadline - 8)
    eval_ids = stream(tok, eval_texts, eos)
    if min(len(train_ids), len(eval_ids)) <= s["ctx"] + 1:
        util.fail(STEP, f"{len(train_ids)} training and {len(eval_ids)} held-out tokens: not "
                  f"one window of {s['ctx'] + 1} (out of time; a larger --budget helps)")
    np.save(work / "train.npy", train_ids)
    np.save(work / "eval.npy", eval_ids)
    util.log(STEP, f"tokenised {n / 1e6:.1f} MB -> {len(train_ids) / 1e6:.2f}M training tokens "
             f"({n / max(1, len(train_ids)):.2f} chars/token), {len(eval_ids) / 1e6:.3f}M "
             f"held-out tokens in {time.time() - t0:.1f}s")
    return tok, len(picked), n


if __name__ == "__main__":
    sys.exit(main())
