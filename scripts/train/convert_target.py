#!/usr/bin/env python3
"""Step 3 of the demo pair from scratch: the trained target as the GGUF file tandem runs, so
that the drafter step learns from exactly those weights (as `run_all.sh --target F.gguf` does).

    python3 scripts/train/convert_target.py WORK OUT

Assembles the Hugging Face checkpoint (WORK/meta/target: config.json and the tokenizer files;
OUT/target: the bf16 safetensors shards train_target.py wrote) and converts it with
scripts/convert_hf_to_gguf.py to the first of QTYPES whose file is at most LIMIT bytes
(gguf_convert, which finish.py uses too) -> OUT/demo.gguf. Then records that file's name,
size and sha256 as the run's target in WORK/meta/data.json (finish.py refuses a drafter
trained for another file) and moves the shards to WORK/target: OUT keeps the GGUF only, so it
stays within the files a machine returns (they remain in WORK for a later look).

Needs numpy and the `gguf` package (run_all.sh checks for it before any training), not torch.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import shutil
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import util  # noqa: E402

STEP = "convert"
LIMIT = 16_000_000                   # bytes a file of models/demo may have
QTYPES = ["q8_0", "q6_k", "q4_k_m"]  # tried in this order; the first that fits is kept
NAME = "demo.gguf"


def gguf_convert(ckpt: pathlib.Path, dest: pathlib.Path, log=print) -> str:
    """Converts the checkpoint folder ckpt to dest/demo.gguf in the first of QTYPES whose file
    is at most LIMIT bytes (tokenizer pre `qwen2`: the regex the vocabulary was trained with).
    Returns that type; raises SystemExit when none fits (no demo.gguf is left then)."""
    import convert_hf_to_gguf as conv
    tmp = dest / (NAME + ".tmp")
    for qtype in QTYPES:
        conv.convert(ckpt, tmp, qtype, name="tandem-demo", pre="qwen2")
        size = tmp.stat().st_size
        log(f"{qtype}: {size / 1e6:.2f} MB")
        if size <= LIMIT:
            os.replace(tmp, dest / NAME)
            return qtype
    tmp.unlink()
    raise SystemExit(f"no output type gives a GGUF of at most {LIMIT} bytes")


def gguf_describe(path: pathlib.Path) -> dict:
    """What identifies a GGUF target: finish.py refuses a drafter trained for another file."""
    return {"file": path.name, "bytes": path.stat().st_size,
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def shards_of(folder: pathlib.Path) -> list[pathlib.Path]:
    """The checkpoint's safetensors shards and their index, sorted by name."""
    return sorted(f for f in folder.glob("model*") if f.name.endswith(
        (".safetensors", ".safetensors.index.json")))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("work")
    ap.add_argument("out")
    args = ap.parse_args()
    work, out = pathlib.Path(args.work), pathlib.Path(args.out)
    meta = work / "meta"
    shards = shards_of(out / "target")
    if not shards or not (meta / "target" / "config.json").is_file():
        util.fail(STEP, f"no trained target in {out / 'target'} and {meta / 'target'}")
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        ckpt = pathlib.Path(tmp)
        for f in list((meta / "target").iterdir()) + shards:
            shutil.copyfile(f, ckpt / f.name)
        try:
            qtype = gguf_convert(ckpt, out, lambda m: util.log(STEP, m))
        except SystemExit as e:
            util.fail(STEP, str(e))
    described = gguf_describe(out / NAME)
    data = json.loads((meta / "data.json").read_text(encoding="utf-8"))
    data["target"] = dict(described, trained=True, qtype=qtype)
    util.json_write(meta / "data.json", data)
    (work / "target").mkdir(exist_ok=True)
    for f in shards:
        shutil.move(str(f), work / "target" / f.name)
    shutil.rmtree(out / "target")   # what is left are partial writes of a killed checkpoint
    util.log(STEP, f"wrote {out / NAME} ({qtype}, {described['bytes'] / 1e6:.2f} MB, sha256 "
             f"{described['sha256'][:16]}...); the bf16 shards moved to {work / 'target'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
