#!/usr/bin/env python3
"""Step 5 of the demo pair, on this machine after the GPU run: the GGUF target, models/demo and
the evaluation. finish.sh builds `tandem` and calls this.

    python3 scripts/train/finish.py OUTDIR --tandem BUILD/tandem [--dest models/demo]
        [--target F.gguf] [--results scripts/train/RESULTS.md] [--prompts 50] [-n 128]
        [--smoke] [--force]

OUTDIR is what run_all.sh wrote: meta.tar (configs, vocabulary, evaluation prompts, metrics,
the GGUF target's name and sha256), drafter/model.safetensors unless the run stopped after the
target, and demo.gguf when it trained the target.
1. The target: the GGUF the drafter was trained for, found by name in OUTDIR (a from-scratch
   run converted its target there), else in DEST, or the file --target names (the two-command
   form: `finish.sh OUT2 --target OUT/demo.gguf`); refused unless its sha256 is the one the run
   recorded. A run whose conversion did not happen left the bf16 checkpoint (target/ shards):
   it is converted here by convert_target.gguf_convert, the rule the run uses (the first of
   q8_0, q6_k, q4_k_m whose file is at most 16 MB). The target goes to DEST/demo.gguf; a
   DEST/drafter trained for the demo.gguf it replaces is removed with it.
2. Checks: the GGUF's top-1 token at every position of a held-out prompt (`tandem logits`)
   agrees with the PyTorch target the drafter's features came from (the GGUF dequantised by
   gguf_target.py, or the bf16 checkpoint); the training module of the drafter gives the same
   logits as scripts/dflash_ref.py (the reference tandem's C drafter is tested against) on the
   exported weights.
3. Evaluation on held-out code prefixes: `tandem generate ... -n N --ignore-eos` with and
   without the drafter (greedy): acceptance length (bar: mean >= 4), tokens/s of both, and
   whether both outputs are identical (they must be: speculative decoding is lossless); and
   the acceptance length when generation stops at <|endoftext|> as a user's would.
   Results go to RESULTS (with --smoke: DEST/RESULTS.md unless --results names a file); a few
   continuations are printed. The drafter is evaluated from a
   staging folder and goes to DEST/drafter/ only when it passes (bar met, outputs identical,
   reference check), or with --smoke or --force.
An OUTDIR of `run_all.sh --stop-after target` has no drafter: the target is checked (top-1
agreement at least AGREE) and installed, one plain continuation is printed, the drafter's
evaluation is skipped and RESULTS is left as it is. RESULTS describes the target's training
when OUTDIR's meta.tar (or that of the --stop-after run whose demo.gguf --target names)
holds its metrics.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

import numpy as np
import torch

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from convert_target import LIMIT, NAME, gguf_convert  # noqa: E402
import pair_speed  # noqa: E402

BAR = 4.0                   # mean acceptance length the drafter must reach
AGREE = 0.95                # least top-1 agreement of a target installed without a drafter


def say(msg: str) -> None:
    print(f"finish: {msg}", flush=True)


def stage(outdir: pathlib.Path, tmp: pathlib.Path) -> pathlib.Path:
    """Unpacks meta.tar and assembles the Hugging Face checkpoint folder tmp/meta/target when
    the run trained a target."""
    meta = tmp / "meta"
    with tarfile.open(outdir / "meta.tar") as tf:
        tf.extractall(meta, filter="data")
    if (outdir / "target").is_dir():
        for f in sorted((outdir / "target").iterdir()):
            if f.name.endswith((".safetensors", ".safetensors.index.json")):
                shutil.copyfile(f, meta / "target" / f.name)
    return meta


def target_find(want: dict, outdir: pathlib.Path, given: str | None,
                dest: pathlib.Path) -> pathlib.Path:
    """The GGUF file the run trained for: `given`, else OUTDIR/<name>, else DEST/<name>;
    refused unless its sha256 is the one the run recorded."""
    places = [pathlib.Path(given)] if given else [outdir / want["file"], dest / want["file"]]
    src = next((f for f in places if f.is_file()), None)
    if src is None:
        raise SystemExit(f"finish: the drafter was trained for {want['file']}; no such file at "
                         f"{' or '.join(map(str, places))} (--target names it)")
    got = hashlib.sha256(src.read_bytes()).hexdigest()
    if got != want["sha256"]:
        raise SystemExit(f"finish: {src} is not the GGUF the run trained for (sha256 "
                         f"{got[:16]}..., want {want['sha256'][:16]}...)")
    return src


def target_install(src: pathlib.Path, dest: pathlib.Path) -> pathlib.Path:
    """src as DEST/demo.gguf. A drafter in DEST that was trained for another demo.gguf goes:
    DEST never holds a pair that does not belong together."""
    out = dest / NAME
    if out.exists() and out.samefile(src):
        return out
    if out.exists() and out.read_bytes() != src.read_bytes() and (dest / "drafter").exists():
        shutil.rmtree(dest / "drafter")
        say(f"removed {dest / 'drafter'}: it was trained for the {NAME} replaced now")
    shutil.copyfile(src, out)
    return out


def target_run(outdir: pathlib.Path, meta: pathlib.Path, gguf_src: pathlib.Path,
               sha256: str) -> tuple[dict, dict, bool] | None:
    """(target_metrics, data, whether that is another run's) of the run that trained the
    target: this OUTDIR's, or that of the `--stop-after target` OUTDIR the GGUF came from (its
    meta.tar next to it); None for a target trained elsewhere (the shipped one)."""
    if (meta / "target_metrics.json").is_file():
        return (json.loads((meta / "target_metrics.json").read_text()),
                json.loads((meta / "data.json").read_text()), False)
    tar = gguf_src.parent / "meta.tar"
    if gguf_src.parent.resolve() == outdir.resolve() or not tar.is_file():
        return None
    with tarfile.open(tar) as tf:
        names = {m.name.removeprefix("./"): m for m in tf.getmembers()}
        if "target_metrics.json" not in names or "data.json" not in names:
            return None
        got = [json.load(tf.extractfile(names[n])) for n in ("target_metrics.json", "data.json")]
    return (*got, True) if (got[1].get("target") or {}).get("sha256") == sha256 else None


def gguf_qtype(path: pathlib.Path) -> str:
    """The type of the file's matrices, from general.file_type (e.g. q8_0)."""
    import gguf
    r = gguf.GGUFReader(str(path))
    ft = int(r.fields["general.file_type"].contents())
    return gguf.LlamaFileType(ft).name.removeprefix("MOSTLY_").removeprefix("ALL_").lower()


def hf_target(ckpt: pathlib.Path):
    import transformers
    from safetensors.torch import load_file
    cfg = transformers.Qwen3_5TextConfig.from_dict(
        json.loads((ckpt / "config.json").read_text()))
    cfg._attn_implementation = "eager"
    model = transformers.Qwen3_5ForCausalLM(cfg)
    state = {}
    for f in sorted(ckpt.glob("model*.safetensors")):
        state.update(load_file(str(f)))
    model.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    return model.eval()


@torch.no_grad()
def taps_of(model, ids: list[int], taps: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits [T, V] and the tap-layer outputs [T, n_taps, H] of the HF target."""
    got = {}
    hooks = [model.model.layers[l].register_forward_hook(
        lambda m, a, o, l=l: got.__setitem__(l, o[0] if isinstance(o, tuple) else o))
        for l in taps]
    try:
        logits = model(input_ids=torch.tensor([ids])).logits[0]
    finally:
        for h in hooks:
            h.remove()
    return logits, torch.stack([got[l][0] for l in taps], dim=1)


def drafter_check(model, drafter_dir: pathlib.Path, ids: list[int]) -> float:
    """Largest |difference| between the training module's logits and scripts/dflash_ref.py's
    for one block after len(ids) - 1 committed tokens, relative to the logits' spread."""
    import dflash_ref
    from drafter import Drafter, sizes_from_config
    from safetensors.torch import load_file
    raw = json.loads((drafter_dir / "config.json").read_text())
    weights = load_file(str(drafter_dir / "model.safetensors"))
    s = sizes_from_config(raw)
    n_ctx = len(ids) - 1
    _, feats = taps_of(model, ids[:n_ctx], s["taps"])
    embed = model.model.embed_tokens.weight.detach().double()
    head = model.lm_head.weight.detach().double()
    block = [ids[n_ctx]] + [s["mask"]] * (s["block"] - 1)
    ref = dflash_ref.Drafter(dflash_ref.dflash_config(raw, len(model.model.layers)), weights)
    want = ref.draft(ref.fuse(feats), n_ctx, block, embed, head)
    mine = Drafter(s).double()
    mine.load_state_dict({k: v.double() for k, v in weights.items()}, strict=True)
    with torch.no_grad():
        hid = mine(feats.reshape(1, n_ctx, -1).double(), embed[torch.tensor(block)][None, None],
                   torch.tensor([[n_ctx]]))
        got = hid[0, 0, 1:] @ head.T
    return float((got - want).abs().max() / want.std())


def tandem(binary: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=900)


def logits_check(binary: str, gguf: pathlib.Path, model, ids: list[int]) -> float:
    """Fraction of positions where the GGUF's top-1 token equals the checkpoint's."""
    r = tandem(binary, "logits", "--model", str(gguf), "--tokens", ",".join(map(str, ids)),
               "--top", "1")
    if r.returncode != 0:
        raise SystemExit(f"finish: tandem logits failed: {r.stderr.strip()}")
    top = [int(line.split()[1].split("(")[0]) for line in r.stdout.splitlines() if ":" in line]
    want, _ = taps_of(model, ids, [0])
    want = want.argmax(-1).tolist()
    return float(np.mean([a == b for a, b in zip(top, want)])) if len(top) == len(want) else 0.0


def generate(binary: str, gguf: pathlib.Path, draft: pathlib.Path | None, prompt: str,
             n: int, ignore_eos: bool = True) -> dict:
    """`tandem generate` on the CPU (pair_speed.generate), greedy, with or without a drafter."""
    return pair_speed.generate(binary, str(gguf), str(draft) if draft else "", prompt, n, "cpu",
                               ignore_eos)


def num(d: dict, key: str, fmt: str, scale: float = 1.0) -> str:
    """d[key] / scale formatted, or "n/a" when the run did not get to write it."""
    return "n/a" if d.get(key) is None else format(d[key] / scale if scale != 1 else d[key], fmt)


def training_text(r: dict) -> str:
    """The training section of RESULTS.md: what the GPU run(s) did."""
    d, dm = r["data"], r["drafter_metrics"]
    drafter = f"""- Drafter: DFlash, {num(dm, 'params', '.2f', 1e6)}M parameters, {num(dm, 'steps', 'd')} steps on
  {num(dm, 'continuations', 'd')} greedy continuations
  ({num(dm, 'generated_tokens', '.2f', 1e6)}M tokens) of the target, from
  {d.get('drafter_prompts', 'n/a')} prompts cut from training files; held-out acceptance length
  {num(dm, 'heldout_acceptance_loop', '.2f')} (the speculative loop replayed over
  {num(dm, 'validation_continuations', 'd')} continuations of held-out files),
  {num(dm, 'heldout_acceptance_teacher_forced', '.2f')} averaged over all anchors."""
    t = d.get("target")
    if t and not r["target_run"]:
        return f"""- Target: `{t['file']}` as shipped (sha256 `{t['sha256'][:16]}...`,
  {r['target_params'] / 1e6:.2f}M parameters), not trained in this run: the drafter learnt from
  its greedy continuations and tap features computed by the file's own weights, dequantised into
  transformers (`scripts/train/gguf_target.py`).
- Data: {d['train_files']} training files of Python source from Python {d['python']}'s standard
  library and site-packages; {d['held_out_files']} files held out (the evaluation prompts below
  and the drafter's validation prompts come from them).
""" + drafter
    tm, td, separate = r["target_run"] or (r["target_metrics"], d, False)
    text = f"""- Data: {td['train_files']} training files of Python source ({td['train_chars'] / 1e6:.1f} MB,
  {td['train_tokens'] / 1e6:.1f}M tokens) from Python {td['python']}'s standard library and
  site-packages; {td['held_out_files']} files held out (evaluation prompts below come from them).
- Target: Qwen3_5ForCausalLM, {num(tm, 'params', '.2f', 1e6)}M parameters,
  {num(tm, 'steps', 'd')} steps, {num(tm, 'tokens', '.0f', 1e6)}M tokens seen, held-out loss
  {num(tm, 'heldout_loss', '.3f')} nats/token.
"""
    if t:
        where = ("by `run_all.sh --stop-after target` (the drafter: a `--target` run)"
                 if separate else "in the same run")
        text += f"""  Converted {where} to {r['qtype']} (`{t['file']}`, sha256
  `{t['sha256'][:16]}...`): the drafter learnt from the greedy continuations and tap features
  of that file's own weights, dequantised into transformers (`scripts/train/gguf_target.py`).
"""
    return text + drafter


def results_write(path: pathlib.Path, r: dict) -> None:
    rows = "\n".join(
        f"| {i + 1} | `{e['file']}` | {e['n_prompt']} | {e['tau']:.2f} | {e['tau_eos']:.2f} "
        f"({e['n_eos']}) | {e['tok_s_draft']:.1f} | {e['tok_s_plain']:.1f} | "
        f"{'yes' if e['same'] else 'NO'} |"
        for i, e in enumerate(r["evals"]))
    taus = [e["tau"] for e in r["evals"]]
    verdict = "pass" if np.mean(taus) >= BAR else "FAIL"
    same = sum(e["same"] for e in r["evals"])
    eos_steps = sum(e["steps_eos"] for e in r["evals"])
    eos_tokens = sum(e["n_eos"] - 1 for e in r["evals"])
    text = f"""# Demo pair: results

Written by `scripts/train/finish.sh` on {time.strftime('%Y-%m-%d')}; do not edit by hand.

## Training (GPU run, `scripts/train/run_all.sh`)

{training_text(r)}

## Files (`models/demo/`)

- `demo.gguf`: {r['qtype']}, {r['gguf_bytes'] / 1e6:.2f} MB
- `drafter/model.safetensors`: bf16, {r['drafter_bytes'] / 1e6:.2f} MB; `drafter/config.json`

## Checks

- Drafter training module vs `scripts/dflash_ref.py` on the exported weights: largest logit
  difference {r['drafter_check']:.2e} of the logits' standard deviation.
- GGUF top-1 token (`tandem logits`) vs the PyTorch target the drafter learnt from,
  teacher-forced over a held-out prompt of {r['logits_check_tokens']} tokens:
  {100 * r['logits_check']:.1f}% of positions agree.

## Evaluation: {len(taus)} held-out code prefixes, greedy, {r['n']} tokens each

`tandem generate --model models/demo/demo.gguf [--draft models/demo/drafter] --prompt P
-n {r['n']} --ignore-eos` on the CPU ({r['machine']}).

| | value |
|---|---|
| mean acceptance length (bar: >= {BAR:g}) | **{np.mean(taus):.2f}** ({verdict}) |
| median / min / max acceptance length | {np.median(taus):.2f} / {min(taus):.2f} / {max(taus):.2f} |
| acceptance length stopping at `<\\|endoftext\\|>` (all tokens / all steps) | {eos_tokens / max(1, eos_steps):.2f} |
| tokens/s with the drafter (total tokens / total time) | {r['tok_s_draft']:.1f} |
| tokens/s without the drafter | {r['tok_s_plain']:.1f} |
| speed-up | {r['tok_s_draft'] / r['tok_s_plain']:.2f}x |
| median speed-up of a prompt | {np.median([e['tok_s_draft'] / e['tok_s_plain'] for e in r['evals']]):.2f}x |
| outputs identical with and without the drafter | {same} of {len(taus)} |

Tokens/s excludes the prompt's prefill (tandem's own figure); the CPU backend runs on one thread,
and other work on the machine moves these figures (both runs of a prompt follow each other).
The column "stop at EOS" is the acceptance length of the same prompt when generation ends at
the first `<|endoftext|>` (tokens generated in brackets), as `tandem generate` does without
`--ignore-eos`.

| # | held-out file | prompt tokens | acceptance | stop at EOS | tok/s draft | tok/s plain | same output |
|---|---|---|---|---|---|---|---|
{rows}

## Examples

""" + "\n".join(f"### `{x['file']}`\n\n```python\n{x['prompt_tail']}\n# ---- generated ----\n"
                f"{x['text']}\n```\n" for x in r["examples"])
    path.write_text(text, encoding="utf-8")


def target_of(outdir: pathlib.Path, meta: pathlib.Path, data: dict, given: str | None,
              dest: pathlib.Path, tmp: pathlib.Path):
    """(the GGUF target's file, the PyTorch target the drafter learnt from, its tokenizer,
    target_run's account of the run that trained it or None)."""
    if data.get("target"):
        from gguf_target import target_load, tokenizer_of
        src = target_find(data["target"], outdir, given, dest)
        model, gmeta = target_load(src, attn="eager")
        return (src, model, tokenizer_of(gmeta),
                target_run(outdir, meta, src, data["target"]["sha256"]))
    from tokenizers import Tokenizer        # the run did not convert it: the bf16 checkpoint
    if not (meta / "target" / "config.json").is_file():
        raise SystemExit(f"finish: {outdir} has neither a GGUF target nor a trained one")
    qtype = gguf_convert(meta / "target", tmp, say)
    say(f"converted the checkpoint in {outdir / 'target'} to {qtype}")
    return (tmp / NAME, hf_target(meta / "target"),
            Tokenizer.from_file(str(meta / "target" / "tokenizer.json")), None)


def target_only(args, src: pathlib.Path, dest: pathlib.Path, model, tok, data: dict) -> int:
    """An OUTDIR without a drafter (`run_all.sh --stop-after target`): checks the target and
    installs it when its top-1 tokens agree with the PyTorch target's."""
    p = data["prompts"][0]
    ids = tok.encode(p["prompt"], add_special_tokens=False).ids
    agree = logits_check(args.tandem, src, model, ids)
    g = generate(args.tandem, src, None, p["prompt"], args.n)
    print(f"\n==== {p['file']} ====\n" + "\n".join(p["prompt"].rstrip("\n").split("\n")[-6:])
          + f"\n---- generated ----\n{tok.decode(g['ids'], skip_special_tokens=False)}")
    say(f"{src} ({gguf_qtype(src)}, {src.stat().st_size / 1e6:.2f} MB): GGUF top-1 agreement "
        f"{100 * agree:.1f}% over {len(ids)} tokens (at least {100 * AGREE:g}% installs it); "
        f"{g['tok_s']:.1f} tok/s greedy")
    say(f"no drafter in {args.outdir} (a run_all.sh --stop-after target run): the drafter's "
        f"evaluation is skipped and {args.results} is left as it is; its drafter: run_all.sh "
        f"OUT2 --target {src}, then finish.sh OUT2 --target that file")
    if agree < AGREE and not args.force:
        say(f"the target is not installed in {dest} (--force installs it)")
        return 1
    say(f"installed the target as {target_install(src, dest)}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--tandem", required=True)
    ap.add_argument("--dest", default=str(ROOT / "models" / "demo"))
    ap.add_argument("--target", help="the GGUF the run trained for (default: in OUTDIR, DEST)")
    ap.add_argument("--results", help="default: scripts/train/RESULTS.md; with --smoke "
                    "DEST/RESULTS.md, so that a trial run leaves the real results alone")
    ap.add_argument("--prompts", type=int, default=50)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--smoke", action="store_true", help="tiny models: report, do not hold the bar")
    ap.add_argument("--force", action="store_true",
                    help="install the drafter in DEST even when it misses the bar (a target "
                         "without a drafter: even when its top-1 agreement is below AGREE)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    outdir, dest = pathlib.Path(args.outdir), pathlib.Path(args.dest)
    args.results = args.results or str(dest / "RESULTS.md" if args.smoke else HERE / "RESULTS.md")
    dest.mkdir(parents=True, exist_ok=True)
    work = tempfile.TemporaryDirectory()     # meta.tar unpacked, the drafter under evaluation
    tmp = pathlib.Path(work.name)
    meta = stage(outdir, tmp)
    data = json.loads((meta / "data.json").read_text())
    src, model, tok, run = target_of(outdir, meta, data, args.target, dest, tmp)
    if src.stat().st_size > LIMIT:
        raise SystemExit(f"finish: {src} is larger than {LIMIT} bytes")
    if not (outdir / "drafter" / "model.safetensors").is_file():
        rc = target_only(args, src, dest, model, tok, data)
        work.cleanup()
        return rc
    gguf_path = target_install(src, dest)
    qtype = gguf_qtype(gguf_path)
    draft = tmp / "drafter"
    draft.mkdir()
    shutil.copyfile(meta / "drafter" / "config.json", draft / "config.json")
    shutil.copyfile(outdir / "drafter" / "model.safetensors", draft / "model.safetensors")
    if (draft / "model.safetensors").stat().st_size > LIMIT:
        raise SystemExit(f"finish: {outdir / 'drafter'} is larger than {LIMIT} bytes")
    metrics = {k: json.loads((meta / f"{k}.json").read_text())
               if (meta / f"{k}.json").is_file() else {}
               for k in ("target_metrics", "drafter_metrics")}
    prompts = data["prompts"][:args.prompts]
    ids0 = tok.encode(prompts[0]["prompt"], add_special_tokens=False).ids
    r = {"qtype": qtype, "gguf_bytes": gguf_path.stat().st_size,
         "drafter_bytes": (draft / "model.safetensors").stat().st_size,
         "data": data, "n": args.n, **metrics, "target_run": run,
         "target_params": sum(p.numel() for p in model.parameters()),
         "drafter_check": drafter_check(model, draft, ids0[:64]),
         "logits_check": logits_check(args.tandem, gguf_path, model, ids0),
         "logits_check_tokens": len(ids0),
         "machine": f"{platform.machine()}, {os.cpu_count()} cores, load "
                    f"{os.getloadavg()[0]:.1f} at the start"}
    say(f"drafter vs reference: {r['drafter_check']:.2e}; GGUF top-1 agreement "
        f"{100 * r['logits_check']:.1f}%")
    evals, examples = [], []
    t_d = t_p = n_d = n_p = 0.0
    for i, p in enumerate(prompts):
        d = generate(args.tandem, gguf_path, draft, p["prompt"], args.n)
        q = generate(args.tandem, gguf_path, None, p["prompt"], args.n)
        e_ = generate(args.tandem, gguf_path, draft, p["prompt"], args.n, False)
        t_d, n_d = t_d + d["seconds"], n_d + d["n"] - 1
        t_p, n_p = t_p + q["seconds"], n_p + q["n"] - 1
        e = {"file": p["file"], "n_prompt": p["n_tokens"], "tau": d["tau"],
             "tau_eos": e_["tau"], "n_eos": e_["n"], "steps_eos": e_["steps"],
             "tok_s_draft": d["tok_s"], "tok_s_plain": q["tok_s"],
             "same": d["ids"] == q["ids"] and e_["ids"] == q["ids"][:len(e_["ids"])]}
        evals.append(e)
        say(f"[{i + 1}/{len(prompts)}] {p['file']}: acceptance {d['tau']:.2f} "
            f"({e_['tau']:.2f} stopping at EOS after {e_['n']}), {d['tok_s']:.1f} vs "
            f"{q['tok_s']:.1f} tok/s, same output: {e['same']}")
        if i < 3:
            examples.append({"file": p["file"],
                             "prompt_tail": "\n".join(p["prompt"].rstrip("\n").split("\n")[-6:]),
                             "text": tok.decode(d["ids"], skip_special_tokens=False)})
    r.update(evals=evals, examples=examples, tok_s_draft=n_d / t_d, tok_s_plain=n_p / t_p)
    results_write(pathlib.Path(args.results), r)
    for x in examples:
        print(f"\n==== {x['file']} ====\n{x['prompt_tail']}\n---- generated ----\n{x['text']}")
    tau = float(np.mean([e["tau"] for e in evals]))
    same = all(e["same"] for e in evals)
    say(f"mean acceptance length {tau:.2f} (bar {BAR:g}), {r['tok_s_draft']:.1f} tok/s with the "
        f"drafter, {r['tok_s_plain']:.1f} without; identical outputs: {same}; wrote {args.results}")
    ok = same and r["drafter_check"] <= 1e-3 and (args.smoke or tau >= BAR)
    if ok or args.force:
        shutil.rmtree(dest / "drafter", ignore_errors=True)
        shutil.copytree(draft, dest / "drafter")
        say(f"installed the drafter in {dest / 'drafter'}")
    else:
        say(f"the drafter is not installed in {dest / 'drafter'} (--force installs it)")
    work.cleanup()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
