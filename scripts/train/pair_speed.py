#!/usr/bin/env python3
"""Tokens/s of a target with and without its drafter on a device, over held-out prompts.

    python3 scripts/train/pair_speed.py --tandem build/tandem [--device cuda] [-n 256]
        [--model models/demo/demo.gguf] [--draft models/demo/drafter]
        [--prompts models/demo/eval_prompts.json] [--count 50] [--json OUT.json]

Runs `tandem generate --ignore-eos -n N --ids` per prompt, greedy, once with the drafter and
once without (outputs must be identical: speculative decoding is lossless; a difference is an
error), and prints per-prompt and total figures: tokens/s is tandem's own (prefill excluded);
the totals are total tokens / total seconds. Needs only the Python standard library.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import re
import statistics
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
STATS = re.compile(r"generated (\d+) tokens in ([\d.]+) s \(([\d.]+) tok/s\); steps (\d+), "
                   r"acceptance length ([\d.]+)")


def generate(binary: str, model: str, draft: str, prompt: str, n: int, device: str,
             ignore_eos: bool = True) -> dict:
    """One `tandem generate` run: generated ids, tokens, seconds, tok/s, steps, acceptance."""
    args = [binary, "generate", "--model", model, "--prompt", prompt, "-n", str(n), "--ids",
            "--draft", draft, "--device", device]
    if ignore_eos:
        args.append("--ignore-eos")
    r = subprocess.run(args, capture_output=True, text=True, timeout=900)
    m = STATS.search(r.stderr)
    if r.returncode != 0 or not m:
        raise SystemExit(f"tandem generate failed ({r.returncode}): {r.stderr.strip()}")
    return {"ids": [int(x) for x in r.stdout.strip().split(",") if x], "n": int(m.group(1)),
            "seconds": float(m.group(2)), "tok_s": float(m.group(3)), "steps": int(m.group(4)),
            "tau": float(m.group(5))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tandem", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default=str(ROOT / "models/demo/demo.gguf"))
    ap.add_argument("--draft", default=str(ROOT / "models/demo/drafter"))
    ap.add_argument("--prompts", default=str(ROOT / "models/demo/eval_prompts.json"))
    ap.add_argument("--count", type=int, default=50)
    ap.add_argument("-n", type=int, default=256)
    ap.add_argument("--json")
    a = ap.parse_args()
    prompts = json.loads(pathlib.Path(a.prompts).read_text())["prompts"][:a.count]
    rows, same = [], 0
    print(f"{'#':>3} {'tokens':>6} {'tau':>6} {'tok/s draft':>12} {'tok/s plain':>12} "
          f"{'speed-up':>8} same")
    for i, p in enumerate(prompts):
        d = generate(a.tandem, a.model, a.draft, p["prompt"], a.n, a.device)
        q = generate(a.tandem, a.model, "", p["prompt"], a.n, a.device)
        ok = d["ids"] == q["ids"]
        same += ok
        rows.append({"file": p.get("file"), "draft": d, "plain": q, "same": ok})
        print(f"{i + 1:>3} {d['n']:>6} {d['tau']:>6.2f} {d['tok_s']:>12.1f} {q['tok_s']:>12.1f} "
              f"{d['tok_s'] / q['tok_s']:>7.2f}x {'yes' if ok else 'NO'}", flush=True)
    td = sum(r["draft"]["n"] for r in rows) / sum(r["draft"]["seconds"] for r in rows)
    tq = sum(r["plain"]["n"] for r in rows) / sum(r["plain"]["seconds"] for r in rows)
    taus = [r["draft"]["tau"] for r in rows]
    summary = {"device": a.device, "prompts": len(rows), "n": a.n,
               "tok_s_draft": td, "tok_s_plain": tq, "speedup": td / tq,
               "tau_mean": statistics.mean(taus), "tau_median": statistics.median(taus),
               "identical": same}
    print(f"device {a.device}: {len(rows)} prompts x {a.n} tokens: {td:.1f} tok/s with the "
          f"drafter, {tq:.1f} without ({td / tq:.2f}x); acceptance mean "
          f"{summary['tau_mean']:.2f}, median {summary['tau_median']:.2f}; identical "
          f"{same}/{len(rows)}")
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps({"summary": summary, "rows": rows}))
    return 0 if same == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
