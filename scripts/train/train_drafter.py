#!/usr/bin/env python3
"""Step 3 of the demo pair: trains the DFlash drafter on the target's own greedy outputs.

    python3 scripts/train/train_drafter.py WORK OUT --deadline EPOCH_S [--smoke]

1. Greedy continuations: random windows of the training stream (prompt lengths `gen_prompt`)
   are continued greedily by the trained target (bf16 weights as exported) for `gen_new`
   tokens; a row ends at its first <|endoftext|>. This takes `gen_share` of the step's time.
2. Features: the target runs once over every sequence (prompt + continuation); the outputs of
   the tap layers (`taps`, residual stream after the layer, before any final norm) are kept.
3. Training, the DFlash recipe (block size 16, paper Eq. 4 loss decay): per sequence
   `anchors` random anchor positions a inside the continuation; the block [token a, MASK x 15]
   at positions a..a+15 sees the fused features of positions < a and its own block; slot k
   predicts token a+k (the target's greedy choice, so a correct draft is an accepted one);
   cross-entropy weighted by exp(-(k-1)/gamma); the target's embedding and LM head are shared
   and frozen. AdamW, warm-up + cosine, bf16 autocast. Logged besides the loss: the
   teacher-forced acceptance length 1 + E[leading correct slots], on held-out continuations.

Writes OUT/drafter/model.safetensors (bf16) and WORK/meta/drafter/config.json (checkpointed
about every 60 s), WORK/meta/drafter_metrics.json.
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import sizes as S  # noqa: E402
import util  # noqa: E402
from drafter import Drafter, config_json  # noqa: E402
from train_target import lr_at, model_load  # noqa: E402

STEP = "drafter"
CKPT_EVERY = 60.0
MAX_ROWS = 32768     # continuations kept: their features stay on the GPU (about 1 MB each)


@torch.no_grad()
def continuations(target, train: np.ndarray, s: dict, until: float, device: str):
    """Greedy continuations of random training windows until `until` (epoch seconds).
    Returns token rows (list of int64 arrays), their prompt lengths and valid lengths."""
    eos = S.token_id(s, S.EOS)
    rng = np.random.default_rng(1)
    rows, prompt_len, valid_len = [], [], []
    n_gen, t0, last = 0, time.time(), 0.0
    while (time.time() + 1.2 * last < until and len(rows) < MAX_ROWS) or not rows:
        t = time.time()
        P = int(rng.integers(s["gen_prompt"][0], s["gen_prompt"][1] + 1))
        starts = rng.integers(0, len(train) - P - 1, size=s["gen_batch"])
        prompts = torch.from_numpy(train[starts[:, None] + np.arange(P)].astype(np.int64))
        prompts = prompts.to(device)
        out = target.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts),
                              max_new_tokens=s["gen_new"], do_sample=False,
                              eos_token_id=eos, pad_token_id=eos)
        out = out.cpu().numpy()
        for r in out:
            gen = r[P:]
            hit = np.nonzero(gen == eos)[0]
            n = int(hit[0]) + 1 if len(hit) else len(gen)
            if n >= 2:
                rows.append(r[:P + n].astype(np.int64))
                prompt_len.append(P)
                valid_len.append(P + n)
                n_gen += n
        last = time.time() - t
        util.log(STEP, f"generated {len(rows)} continuations, {n_gen / 1e6:.2f}M tokens "
                 f"({n_gen / (time.time() - t0) / 1e3:.1f}k tok/s; batch of {len(out)} x "
                 f"{out.shape[1] - P} after {P}-token prompts in {last:.1f}s)")
    return rows, np.array(prompt_len), np.array(valid_len)


@torch.no_grad()
def features(target, rows, s: dict, device: str, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Tap-layer outputs of the target over every row: [n, S_max, n_taps * H] and the padded
    token rows [n, S_max] (padding is <|endoftext|>; it is never a label nor a context)."""
    n, smax = len(rows), max(len(r) for r in rows)
    toks = np.full((n, smax), S.token_id(s, S.EOS), dtype=np.int64)
    for i, r in enumerate(rows):
        toks[i, :len(r)] = r
    toks = torch.from_numpy(toks)
    H, taps = s["hidden"], s["taps"]
    feats = torch.empty(n, smax, len(taps) * H, dtype=dtype, device=device)
    got = {}
    hooks = [target.model.layers[l].register_forward_hook(
        lambda m, a, o, l=l: got.__setitem__(l, o[0] if isinstance(o, tuple) else o))
        for l in taps]
    try:
        chunk = 256 if device == "cuda" else 8
        for i in range(0, n, chunk):
            target(input_ids=toks[i:i + chunk].to(device), logits_to_keep=1)
            feats[i:i + chunk] = torch.cat([got[l] for l in taps], dim=-1).to(dtype)
    finally:
        for h in hooks:
            h.remove()
    return feats, toks.to(device)


def block_batch(idx, toks, feats, plen, vlen, embed, s, rng, device):
    """One training batch: features, block embeddings, anchors, labels and loss weights."""
    K, N = s["block"], s["anchors"]
    smax = int(vlen[idx].max())
    f = feats[idx, :smax]
    t = toks[idx, :smax]
    lo = torch.as_tensor(plen[idx] - 1, device=device)[:, None]           # anchor >= P - 1
    hi = torch.as_tensor(vlen[idx] - 2, device=device)[:, None]           # label a+1 < valid
    r = torch.from_numpy(rng.random((len(idx), N))).to(device)
    anchors = (lo + (r * (hi - lo + 1)).long()).clamp(max=smax - 1)
    ids = torch.full((len(idx), N, K), S.token_id(s, S.MASK), dtype=torch.long, device=device)
    ids[:, :, 0] = torch.gather(t, 1, anchors)
    pos = anchors[:, :, None] + torch.arange(1, K, device=device)         # label positions
    valid = pos < torch.as_tensor(vlen[idx], device=device)[:, None, None]
    labels = torch.gather(t, 1, pos.clamp(max=smax - 1).view(len(idx), -1)).view_as(pos)
    return f, embed[ids].float(), anchors, labels, valid   # f32 residual stream under autocast


def block_loss(drafter, head, batch, gamma: float, amp: bool, device: str):
    f, emb, anchors, labels, valid = batch
    with torch.autocast(device, dtype=torch.bfloat16, enabled=amp):
        hid = drafter(f, emb, anchors)[:, :, 1:]
        logits = hid @ head.T.to(hid.dtype)
    K1 = labels.shape[-1]
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1),
                         reduction="none").view_as(labels)
    decay = torch.exp(-torch.arange(K1, device=device, dtype=torch.float32) / gamma)  # k-1
    w = valid.float() * decay
    loss = (ce * w).sum() / w.sum().clamp(min=1e-6)
    with torch.no_grad():
        ok = (logits.argmax(-1) == labels) & valid
        run = torch.cumprod(ok.int(), dim=-1).sum(-1).float()              # leading correct
        tau = 1.0 + run.mean().item()
        acc1 = ok[..., 0].float().sum().item() / max(1.0, valid[..., 0].float().sum().item())
    return loss, tau, acc1


def export(drafter, s: dict, out: pathlib.Path, meta: pathlib.Path) -> None:
    from safetensors.torch import save_file
    (out / "drafter").mkdir(parents=True, exist_ok=True)
    (meta / "drafter").mkdir(parents=True, exist_ok=True)
    tmp = out / "drafter" / "model.safetensors.tmp"
    save_file(drafter.export_state(), str(tmp), metadata={"format": "pt"})
    tmp.replace(out / "drafter" / "model.safetensors")
    util.json_write(meta / "drafter" / "config.json", config_json(s))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("work")
    ap.add_argument("out")
    ap.add_argument("--deadline", type=float, required=True, help="epoch seconds to finish by")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    s = S.sizes(args.smoke)
    work, out = pathlib.Path(args.work), pathlib.Path(args.out)
    meta = work / "meta"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    amp = device == "cuda"
    dtype = torch.bfloat16 if amp else torch.float32
    torch.manual_seed(0)
    margin = 15.0 if device == "cuda" else 5.0
    t_begin = time.time()

    target = model_load(s, meta, out, device).to(dtype).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    train = np.load(work / "train.npy")
    gen_until = t_begin + s["gen_share"] * (args.deadline - margin - t_begin)
    rows, plen, vlen = continuations(target, train, s, gen_until, device)
    t0 = time.time()
    feats, toks = features(target, rows, s, device, dtype)
    gb = feats.numel() * feats.element_size() / 1e9
    util.log(STEP, f"tap features {tuple(feats.shape)} ({gb:.2f} GB) in {time.time() - t0:.1f}s")
    embed = target.model.embed_tokens.weight.detach()
    head = target.lm_head.weight.detach()

    n = len(rows)
    n_val = max(1, n // 50)
    val_idx, train_idx = np.arange(n_val), np.arange(n_val, n)
    if len(train_idx) == 0:
        train_idx = val_idx
    drafter = Drafter(s).to(device)
    n_params = sum(p.numel() for p in drafter.parameters())
    util.log(STEP, f"drafter: {s['d_layers']} layers, {n_params / 1e6:.2f}M parameters, taps "
             f"{s['taps']}, block {s['block']}; {len(train_idx)} training / {n_val} held-out "
             "continuations")
    decay = [p for p in drafter.parameters() if p.ndim >= 2]
    rest = [p for p in drafter.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=s["d_lr"], betas=(0.9, 0.95), fused=device == "cuda")
    hp = dict(s, lr=s["d_lr"], warmup=s["d_warmup"])
    rng = np.random.default_rng(2)
    end = args.deadline - margin
    total, timed_from, step = None, None, 0
    t_log = t_ckpt = t_train = time.time()
    logged = 0
    blk_tokens = s["d_batch"] * s["anchors"] * s["block"]      # drafter positions per step
    perm, pi = rng.permutation(train_idx), 0
    history = []

    def validate() -> float:
        vr = np.random.default_rng(3)
        taus = []
        with torch.no_grad():
            for i in range(0, n_val, s["d_batch"]):
                b = block_batch(val_idx[i:i + s["d_batch"]], toks, feats, plen, vlen, embed, s,
                                vr, device)
                taus.append(block_loss(drafter, head, b, s["gamma"], amp, device)[1])
        return float(np.mean(taus))

    while True:
        if time.time() >= end or (total is not None and step >= total):
            break
        if total is None and step == 5:
            if device == "cuda":
                torch.cuda.synchronize()
            timed_from = (time.time(), step)
        if total is None and timed_from and step == 20:
            if device == "cuda":
                torch.cuda.synchronize()
            per = (time.time() - timed_from[0]) / (step - timed_from[1])
            total = step + int(max(0.0, end - time.time() - 5.0) / per * 0.97)
            util.log(STEP, f"{per * 1e3:.0f} ms/step -> {total} steps "
                     f"({total * s['d_batch'] / len(train_idx):.1f} passes over the continuations)")
        if pi + s["d_batch"] > len(perm):
            perm, pi = rng.permutation(train_idx), 0
        idx = perm[pi:pi + s["d_batch"]]
        pi += s["d_batch"]
        lr = lr_at(step, total, t_train, end, hp)
        for g in opt.param_groups:
            g["lr"] = lr
        batch = block_batch(idx, toks, feats, plen, vlen, embed, s, rng, device)
        loss, tau, acc1 = block_loss(drafter, head, batch, s["gamma"], amp, device)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        step += 1
        if time.time() - t_log > (15.0 if device == "cuda" else 10.0):
            history.append((step, loss.item(), tau))
            rate = blk_tokens * (step - logged) / (time.time() - t_log)
            util.log(STEP, f"step {step}/{total or '?'} loss {loss.item():.3f} slot-1 accuracy "
                     f"{acc1:.3f} acceptance (teacher-forced, batch) {tau:.2f} lr {lr:.2e} "
                     f"{rate / 1e3:.0f}k block tok/s")
            logged, t_log = step, time.time()
        if time.time() - t_ckpt > CKPT_EVERY:
            export(drafter, s, out, meta)
            util.log(STEP, f"checkpoint at step {step}; held-out acceptance {validate():.2f}")
            t_ckpt = time.time()
    export(drafter, s, out, meta)
    metrics = {"params": n_params, "steps": step, "continuations": n,
               "generated_tokens": int((vlen - plen).sum()),
               "heldout_acceptance_teacher_forced": None, "history": history}
    util.json_write(meta / "drafter_metrics.json", metrics)  # in case validation is cut off
    tau_val = metrics["heldout_acceptance_teacher_forced"] = validate()
    util.json_write(meta / "drafter_metrics.json", metrics)
    util.log(STEP, f"done: {step} steps; held-out teacher-forced acceptance length {tau_val:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
