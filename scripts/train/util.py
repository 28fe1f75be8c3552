"""Small helpers shared by the training steps: progress lines with the elapsed time, the
wall-clock deadline each step works to, and writing checkpoints under the output folder so that
a later failure never loses them."""
from __future__ import annotations

import json
import os
import pathlib
import sys
import time

T_START = float(os.environ.get("TRAIN_T0", time.time()))  # run_all.sh start (epoch seconds)


def log(step: str, msg: str) -> None:
    print(f"[{time.time() - T_START:7.1f}s] {step}: {msg}", flush=True)


def until(seconds_from_start: float) -> float:
    """The absolute time (epoch seconds) that lies `seconds_from_start` after the run began."""
    return T_START + seconds_from_start


def left(deadline: float) -> float:
    return deadline - time.time()


def json_write(path: pathlib.Path, obj) -> None:
    """Writes through a temporary name so a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def safetensors_write_sharded(tensors: dict, folder: pathlib.Path, stem: str,
                              max_bytes: int) -> list[str]:
    """Saves tensors as stem-0000i-of-0000n.safetensors files of at most max_bytes each (one
    file named stem.safetensors when they fit in one), plus stem.safetensors.index.json for
    several, the layout Hugging Face uses. Returns the file names written."""
    from safetensors.torch import save_file
    shards, cur, size = [], {}, 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        n = t.numel() * t.element_size()
        if cur and size + n > max_bytes:
            shards.append(cur)
            cur, size = {}, 0
        cur[name], size = t, size + n
    shards.append(cur)
    names = ([f"{stem}.safetensors"] if len(shards) == 1 else
             [f"{stem}-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    for old in folder.glob(f"{stem}*.safetensors"):   # an earlier checkpoint may be split otherwise
        if old.name not in names:
            old.unlink()
    weight_map = {}
    for fname, shard in zip(names, shards):
        tmp = folder / (fname + ".tmp")
        save_file(shard, str(tmp), metadata={"format": "pt"})
        os.replace(tmp, folder / fname)
        weight_map.update({k: fname for k in shard})
    index = folder / f"{stem}.safetensors.index.json"
    if len(shards) > 1:
        json_write(index, {"metadata": {"total_size": sum(
            t.numel() * t.element_size() for t in tensors.values())}, "weight_map": weight_map})
    elif index.exists():
        index.unlink()
    return names


def fail(step: str, msg: str) -> None:
    log(step, f"FAILED: {msg}")
    sys.exit(1)
