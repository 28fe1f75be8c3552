#!/usr/bin/env python3
"""Step 4 of the demo pair: trains the DFlash drafter on the target's own greedy outputs.

    python3 scripts/train/train_drafter.py WORK OUT --deadline EPOCH_S --target F.gguf [--smoke]

The target is a GGUF file dequantised into transformers (gguf_target.py): the one trained and
converted in steps 2-3 (OUT/demo.gguf) or an existing one (the shipped models/demo/demo.gguf).
These are the very weights tandem verifies with, so the drafter learns to predict what it will
be checked against.

1. Greedy continuations: the prompts of prepare_data.py (WORK/prompts.npz: code prefixes
   ending at a line end, as the evaluation's) are continued greedily by the target in float32
   for `gen_new` tokens, on past <|endoftext|> as `tandem generate --ignore-eos` does, batched
   by prompt length (a batch's prompts lose leading tokens down to its shortest). The
   validation prompts (held-out files) come first; training prompts follow until
   `gguf_gen_share` of the step's time or `feat_gb` of features.
2. Features: the target runs once over each generated batch; the outputs of the tap layers
   (`taps`, residual stream after the layer, before any final norm) are kept in bf16.
3. Training, the DFlash recipe (block size 16, paper Eq. 4 loss decay): per sequence
   `anchors` distinct random anchor positions a inside the continuation; the block
   [token a, MASK x 15] at positions a..a+15 sees the fused features of positions < a and its
   own block; slot k predicts token a+k (the target's greedy choice, so a correct draft is an
   accepted one); cross-entropy weighted by exp(-(k-1)/gamma); the target's embedding and LM
   head are shared and frozen. AdamW, warm-up + cosine to the deadline, bf16 autocast.

Validation measures what `tandem generate` will report: on each held-out continuation the
drafter drafts at every position (teacher-forced), and the speculative loop is replayed over
the first EVAL_TOKENS generated tokens (start after the prompt, accept the leading correct
drafts, continue after the target's own next token): acceptance length = tokens / steps.
The mean over all anchors ("teacher-forced") is logged too; it is not the same number: the
loop visits the positions where the drafter's runs end, which are harder than average.

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
from train_target import lr_at  # noqa: E402

STEP = "drafter"
CKPT_EVERY = 60.0
EVAL_TOKENS = 128    # tokens finish.py has `tandem generate` produce per prompt
VAL_BATCH = 64       # validation prompts per generate call


def target_open(path: str, s: dict, device: str):
    """(target in float32, eval mode, frozen; s with the target's shapes and token ids)."""
    from gguf_target import target_load
    model, gm = target_load(path, device)
    tokens = gm["tokenizer.ggml.tokens"]
    if S.MASK not in tokens:
        util.fail(STEP, f"{path} has no {S.MASK} token for the drafter's blocks")
    c = model.config
    s = S.sizes_for_target(s, c.hidden_size, c.num_hidden_layers, c.vocab_size,
                           int(gm["tokenizer.ggml.eos_token_id"]), tokens.index(S.MASK))
    model = model.float().eval()
    model.generation_config.eos_token_id = None   # generate on past <|endoftext|>
    for p in model.parameters():
        p.requires_grad_(False)
    return model, s


class Rows:
    """Continuations and their tap features, one after another: toks [n_pos] token ids,
    feats [n_pos, n_taps * H] bf16 on the device; row i spans off[i] .. off[i] + length[i],
    its prompt the first plen[i] positions."""

    def __init__(self, n_pos: int, width: int, device: str):
        self.toks = torch.empty(n_pos, dtype=torch.long, device=device)
        self.feats = torch.empty(n_pos, width, dtype=torch.bfloat16, device=device)
        self.off, self.length, self.plen = [], [], []
        self.used = 0

    def room(self, n: int) -> bool:
        return self.used + n <= self.toks.shape[0]

    def add(self, toks: torch.Tensor, feats: torch.Tensor, plen: int) -> None:
        """toks [B, T], feats [B, T, width]: B rows of T positions with plen prompt tokens."""
        B, T = toks.shape
        n = B * T
        self.toks[self.used:self.used + n] = toks.reshape(-1)
        self.feats[self.used:self.used + n] = feats.reshape(n, -1).to(torch.bfloat16)
        self.off += [self.used + i * T for i in range(B)]
        self.length += [T] * B
        self.plen += [plen] * B
        self.used += n

    def arrays(self, device: str):
        """(off, length, plen) as int64 tensors on the device."""
        return tuple(torch.tensor(x, dtype=torch.long, device=device)
                     for x in (self.off, self.length, self.plen))


@torch.no_grad()
def taps_run(target, toks: torch.Tensor, taps: list[int], chunk: int) -> torch.Tensor:
    """The tap layers' outputs over toks [B, T], concatenated: [B, T, n_taps * H]."""
    got = {}
    hooks = [target.model.layers[l].register_forward_hook(
        lambda m, a, o, l=l: got.__setitem__(l, o[0] if isinstance(o, tuple) else o))
        for l in taps]
    try:
        parts = []
        for i in range(0, toks.shape[0], chunk):
            target(input_ids=toks[i:i + chunk], logits_to_keep=1)
            parts.append(torch.cat([got[l] for l in taps], dim=-1).to(torch.bfloat16))
    finally:
        for h in hooks:
            h.remove()
    return torch.cat(parts)


def batches_of(ids: np.ndarray, off: np.ndarray, size: int, rng) -> list[list[np.ndarray]]:
    """Prompts (rows of ids between offsets) in batches of `size` of similar length, the
    batches in random order; a batch's prompts are cut on the left to its shortest."""
    rows = [ids[off[i]:off[i + 1]] for i in range(len(off) - 1)]
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    batches = [[rows[i] for i in order[j:j + size]] for j in range(0, len(order), size)]
    perm = rng.permutation(len(batches)) if rng is not None else range(len(batches))
    out = []
    for b in (batches[k] for k in perm):
        m = min(len(r) for r in b)
        out.append([r[len(r) - m:] for r in b])
    return out


@torch.no_grad()
def greedy(target, prompts: torch.Tensor, s: dict) -> torch.Tensor:
    """prompts [B, P] followed by their `gen_new` greedy tokens: [B, P + gen_new]."""
    out = target.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts),
                          max_new_tokens=s["gen_new"], do_sample=False, pad_token_id=s["eos_id"])
    if out.shape[1] != prompts.shape[1] + s["gen_new"]:
        util.fail(STEP, f"generate stopped after {out.shape[1] - prompts.shape[1]} of "
                  f"{s['gen_new']} tokens")
    return out


@torch.no_grad()
def continue_into(rows: Rows, target, batches, s: dict, until: float, device: str,
                  tag: str) -> int:
    """Greedy continuations of prompt batches (with their features) into rows until
    `until` (epoch seconds) or rows are full; at least one batch. Returns tokens generated."""
    n_gen, t0, last, t_log = 0, time.time(), 0.0, 0.0
    chunk = 256 if device == "cuda" else 8
    for i, b in enumerate(batches):
        P = len(b[0])
        if i and (time.time() + 1.3 * last > until or not rows.room(len(b) * (P + s["gen_new"]))):
            break
        t = time.time()
        prompts = torch.from_numpy(np.stack(b).astype(np.int64)).to(device)
        try:
            parts = [greedy(target, prompts, s)]
        except torch.cuda.OutOfMemoryError:     # half batches from here on
            torch.cuda.empty_cache()
            util.log(STEP, f"{tag}: out of GPU memory with {len(b)} rows; halves from now on")
            batches[i + 1:] = [h for x in batches[i + 1:] for h in (x[:len(x) // 2],
                                                                    x[len(x) // 2:]) if h]
            parts = [greedy(target, h, s) for h in prompts.split(max(1, len(b) // 2))]
        for out in parts:
            if not rows.room(out.numel()):
                break
            rows.add(out, taps_run(target, out, s["taps"], chunk), P)
            n_gen += out.shape[0] * s["gen_new"]
        last = time.time() - t
        if time.time() - t_log > 5.0:
            util.log(STEP, f"{tag}: {len(rows.off)} rows, {n_gen / 1e6:.2f}M tokens generated "
                     f"({n_gen / (time.time() - t0) / 1e3:.1f}k tok/s; {len(b)} x "
                     f"{s['gen_new']} after {P}-token prompts in {last:.1f}s)")
            t_log = time.time()
    util.log(STEP, f"{tag}: {len(rows.off)} rows, {n_gen / 1e6:.2f}M tokens generated in "
             f"{time.time() - t0:.1f}s")
    return n_gen


def block_batch(rows: Rows, arr, idx: torch.Tensor, n_anchor: int, embed: torch.Tensor,
                s: dict, gen: torch.Generator | None):
    """One batch of blocks for rows idx [B]: features [B, S, F], block embeddings
    [B, N, K, H], anchors [B, N], labels [B, N, K-1] and their validity. With gen, N =
    n_anchor distinct random anchors per row in its continuation; without, every
    continuation position P .. P + EVAL_TOKENS - 2 in order (validation, N may be less)."""
    off, length, plen = (a[idx] for a in arr)
    K, dev = s["block"], rows.toks.device
    smax = int(length.max())
    pos = torch.arange(smax, device=dev)
    gidx = (off[:, None] + pos).clamp(max=rows.used - 1)                 # [B, S]
    f, t = rows.feats[gidx], rows.toks[gidx]
    span = length - 1 - plen                                             # anchors per row
    if gen is None:
        n = int(min(span.min(), EVAL_TOKENS - 1))
        anchors = plen[:, None] + torch.arange(n, device=dev)
    else:
        # distinct positions: the ranks of random keys, kept among each row's valid span
        keys = torch.rand(len(idx), int(span.max()), generator=gen, device=dev)
        keys = keys.masked_fill(torch.arange(keys.shape[1], device=dev) >= span[:, None], 2.0)
        pick = keys.argsort(dim=1)[:, :n_anchor]
        anchors = plen[:, None] + torch.minimum(pick, span[:, None] - 1)
    ids = torch.full((*anchors.shape, K), s["mask_id"], dtype=torch.long, device=dev)
    ids[:, :, 0] = torch.gather(t, 1, anchors)
    lpos = anchors[:, :, None] + torch.arange(1, K, device=dev)                # label positions
    valid = lpos < length[:, None, None]
    labels = torch.gather(t, 1, lpos.clamp(max=smax - 1).view(len(idx), -1)).view_as(lpos)
    return f, embed[ids].float(), anchors, labels, valid


def block_loss(drafter, head, batch, gamma: float, amp: bool):
    """(decayed cross-entropy, correct [B, N, K-1] drafts) of one batch."""
    f, emb, anchors, labels, valid = batch
    if not amp:
        f = f.float()          # features are kept in bf16
    with torch.autocast(f.device.type, dtype=torch.bfloat16, enabled=amp):
        hid = drafter(f, emb, anchors)[:, :, 1:]
        logits = hid @ head.T.to(hid.dtype)
    K1 = labels.shape[-1]
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1),
                         reduction="none").view_as(labels)
    decay = torch.exp(-torch.arange(K1, device=f.device, dtype=torch.float32) / gamma)  # k-1
    w = valid.float() * decay
    loss = (ce * w).sum() / w.sum().clamp(min=1e-6)
    ok = (logits.argmax(-1) == labels) & valid
    return loss, ok


def runs_of(ok: torch.Tensor) -> torch.Tensor:
    """Leading correct drafts of each block: ok [..., K-1] -> [...]."""
    return torch.cumprod(ok.int(), dim=-1).sum(-1)


def loop_acceptance(run: list[int]) -> float:
    """Tokens per target pass of the speculative loop over a continuation whose block at
    continuation position j has run[j] leading correct drafts: the first token comes with the
    prompt's pass, each step commits the accepted drafts and the target's next token."""
    j, steps, n = 0, 0, len(run) + 1
    while j < n - 1:
        j += run[j] + 1
        steps += 1
    return (n - 1) / steps


@torch.no_grad()
def validate(drafter, head, rows: Rows, arr, val_idx: np.ndarray, embed, s: dict, amp: bool,
             chunk: int) -> tuple[float, float]:
    """(mean acceptance length of the replayed speculative loop, mean over all anchors
    of 1 + leading correct drafts) on the validation rows."""
    loop, tf = [], []
    drafter.eval()
    for i in range(0, len(val_idx), chunk):
        idx = torch.as_tensor(val_idx[i:i + chunk], device=rows.toks.device)
        b = block_batch(rows, arr, idx, 0, embed, s, None)
        run = runs_of(block_loss(drafter, head, b, s["gamma"], amp)[1]).cpu()
        tf.append(1.0 + run.float().mean().item())
        loop += [loop_acceptance(r.tolist()) for r in run]
    drafter.train()
    return float(np.mean(loop)), float(np.mean(tf))


@torch.no_grad()
def init_from_target(drafter, target) -> list[int]:
    """Starts drafter layer i from target layer L_i, spread from the first full-attention
    layer to the last layer: its MLP and norms, and the attention of the nearest
    full-attention layer at or below L_i (query rows only: the drafter has no output gate);
    the final norm from the target's. The drafter works in the target's residual space
    (its embeddings in, its LM head out), so it starts from circuits that already read and
    write that space. Qwen3.5 norms apply 1 + w, the drafter's plain w. Parts whose shapes
    differ keep their random start. Returns the L_i."""
    c, layers = target.config, target.model.layers
    full = [l for l, t in enumerate(c.layer_types) if t == "full_attention"]
    n = len(drafter.layers)
    lo, hi = (full[0] if full else 0), len(layers) - 1
    picks = [round(lo + (hi - lo) * i / max(1, n - 1)) for i in range(n)]

    def put(dst, src, plus_one=False):
        if dst.shape == src.shape:
            dst.copy_(src + 1 if plus_one else src)

    for d, l in zip(drafter.layers, picks):
        t = layers[l]
        put(d.input_layernorm.weight, t.input_layernorm.weight, True)
        put(d.post_attention_layernorm.weight, t.post_attention_layernorm.weight, True)
        for name in ("gate_proj", "up_proj", "down_proj"):
            put(getattr(d.mlp, name).weight, getattr(t.mlp, name).weight)
        below = [f for f in full if f <= l]
        if not below:
            continue
        ta, da = layers[below[-1]].self_attn, d.self_attn
        q = ta.q_proj.weight.view(c.num_attention_heads, 2 * c.head_dim, -1)[:, :c.head_dim]
        put(da.q_proj.weight, q.reshape(-1, q.shape[-1]))
        for name in ("k_proj", "v_proj", "o_proj"):
            put(getattr(da, name).weight, getattr(ta, name).weight)
        put(da.q_norm.weight, ta.q_norm.weight, True)
        put(da.k_norm.weight, ta.k_norm.weight, True)
    put(drafter.norm.weight, target.model.norm.weight, True)
    return picks


def export(drafter, s: dict, out: pathlib.Path, meta: pathlib.Path) -> None:
    from safetensors.torch import save_file
    (out / "drafter").mkdir(parents=True, exist_ok=True)
    (meta / "drafter").mkdir(parents=True, exist_ok=True)
    tmp = out / "drafter" / "model.safetensors.tmp"
    save_file(drafter.export_state(), str(tmp), metadata={"format": "pt"})
    tmp.replace(out / "drafter" / "model.safetensors")
    util.json_write(meta / "drafter" / "config.json", config_json(s))


def optimiser(drafter, s: dict, device: str):
    decay = [p for p in drafter.parameters() if p.ndim >= 2]
    rest = [p for p in drafter.parameters() if p.ndim < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                              {"params": rest, "weight_decay": 0.0}],
                             lr=s["d_lr"], betas=(0.9, 0.95), fused=device == "cuda")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("work")
    ap.add_argument("out")
    ap.add_argument("--deadline", type=float, required=True, help="epoch seconds to finish by")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--target", required=True, help="the GGUF target")
    args = ap.parse_args()
    s = S.sizes(args.smoke)
    work, out = pathlib.Path(args.work), pathlib.Path(args.out)
    meta = work / "meta"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    amp = device == "cuda"
    torch.manual_seed(0)
    margin = 15.0 if device == "cuda" else 5.0
    t_begin = time.time()

    target, s = target_open(args.target, s, device)
    pr = np.load(work / "prompts.npz")
    gen_until = t_begin + s["gguf_gen_share"] * (args.deadline - margin - t_begin)
    width = len(s["taps"]) * s["hidden"]
    rows = Rows(int(s["feat_gb"] * 1e9 / (2 * width + 8)), width, device)
    rng = np.random.default_rng(1)
    # small batches: a batch's prompts are cut to its shortest, and these few should keep
    # the lengths of the evaluation's prompts
    continue_into(rows, target, batches_of(pr["val_ids"], pr["val_off"],
                                           min(VAL_BATCH, s["gen_batch"]), None),
                  s, float("inf"), device, "validation")
    n_val = len(rows.off)
    n_gen = continue_into(rows, target, batches_of(pr["train_ids"], pr["train_off"],
                                                   s["gen_batch"], rng),
                          s, gen_until, device, "training")
    arr = rows.arrays(device)
    embed = target.model.embed_tokens.weight.detach()
    head = target.lm_head.weight.detach()
    drafter = Drafter(s).to(device)
    picks = init_from_target(drafter, target) if s["d_init_from_target"] else None
    del target
    if device == "cuda":
        torch.cuda.empty_cache()

    val_idx, train_idx = np.arange(n_val), np.arange(n_val, len(rows.off))
    if len(train_idx) == 0:
        util.fail(STEP, "no training continuations")
    n_params = sum(p.numel() for p in drafter.parameters())
    util.log(STEP, f"drafter: {s['d_layers']} layers"
             + (f" (started from target layers {picks})" if picks else "")
             + f", {n_params / 1e6:.2f}M parameters, taps {s['taps']}, block {s['block']}; "
             f"{len(train_idx)} training / {n_val} held-out continuations, features "
             f"{rows.used * width * 2 / 1e9:.2f} GB")
    opt = optimiser(drafter, s, device)
    hp = dict(s, lr=s["d_lr"], warmup=s["d_warmup"])
    gen = torch.Generator(device=device).manual_seed(2)
    end = args.deadline - margin - (10.0 if device == "cuda" else 3.0)   # final validation
    total, timed_from, step = None, None, 0
    t_log = t_ckpt = t_train = time.time()
    logged = 0
    blk_tokens = s["d_batch"] * s["anchors"] * s["block"]      # drafter positions per step
    perm, pi = rng.permutation(train_idx), 0
    history = []
    vchunk = 8 if device == "cuda" else 1

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
            n_ckpt = (end - time.time()) / CKPT_EVERY                 # validations on the way
            total = step + int(max(0.0, end - time.time() - 5.0 - 4.0 * n_ckpt) / per * 0.97)
            util.log(STEP, f"{per * 1e3:.0f} ms/step -> {total} steps "
                     f"({total * s['d_batch'] / len(train_idx):.1f} passes over the continuations, "
                     f"{blk_tokens / per / 1e3:.0f}k block positions/s)")
        if pi + s["d_batch"] > len(perm):
            perm, pi = rng.permutation(train_idx), 0
        idx = torch.as_tensor(perm[pi:pi + s["d_batch"]], device=device)
        pi += s["d_batch"]
        lr = lr_at(step, total, t_train, end, hp)
        for g in opt.param_groups:
            g["lr"] = lr
        batch = block_batch(rows, arr, idx, s["anchors"], embed, s, gen)
        loss, ok = block_loss(drafter, head, batch, s["gamma"], amp)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        step += 1
        if time.time() - t_log > (15.0 if device == "cuda" else 10.0):
            tau = 1.0 + runs_of(ok).float().mean().item()
            acc1 = ok[..., 0].float().sum().item() / max(1.0, batch[4][..., 0].sum().item())
            history.append((step, loss.item(), tau))
            rate = blk_tokens * (step - logged) / (time.time() - t_log)
            util.log(STEP, f"step {step}/{total or '?'} loss {loss.item():.3f} slot-1 accuracy "
                     f"{acc1:.3f} acceptance (teacher-forced, batch) {tau:.2f} lr {lr:.2e} "
                     f"{rate / 1e3:.0f}k block tok/s")
            logged, t_log = step, time.time()
        if time.time() - t_ckpt > CKPT_EVERY:
            export(drafter, s, out, meta)
            loop, tf = validate(drafter, head, rows, arr, val_idx, embed, s, amp, vchunk)
            util.log(STEP, f"checkpoint at step {step}; held-out acceptance {loop:.2f} "
                     f"(speculative loop), {tf:.2f} (teacher-forced, all anchors)")
            history.append((step, None, tf, loop))
            t_ckpt = time.time()
    export(drafter, s, out, meta)
    metrics = {"params": n_params, "steps": step, "continuations": len(train_idx),
               "validation_continuations": n_val, "generated_tokens": n_gen,
               "target": pathlib.Path(args.target).name,
               "heldout_acceptance_loop": None, "heldout_acceptance_teacher_forced": None,
               "history": history}
    util.json_write(meta / "drafter_metrics.json", metrics)  # in case validation is cut off
    loop, tf = validate(drafter, head, rows, arr, val_idx, embed, s, amp, vchunk)
    metrics.update(heldout_acceptance_loop=loop, heldout_acceptance_teacher_forced=tf)
    util.json_write(meta / "drafter_metrics.json", metrics)
    util.log(STEP, f"done: {step} steps; held-out acceptance length {loop:.2f} (speculative "
             f"loop over {min(EVAL_TOKENS, s['gen_new'])} tokens), {tf:.2f} (teacher-forced, "
             "all anchors)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
