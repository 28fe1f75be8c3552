#!/usr/bin/env python3
"""Step 2 of the demo pair: trains the target, a small Qwen3_5ForCausalLM text model.

    python3 scripts/train/train_target.py WORK OUT --deadline EPOCH_S [--smoke]

Reads WORK/train.npy and WORK/eval.npy (prepare_data.py). Random windows of `ctx` + 1 tokens
from the training stream, next-token cross-entropy, bf16 autocast (f32 master weights), AdamW
(betas 0.9/0.95; weight decay on matrices only), linear warm-up then cosine decay to
`min_lr_frac`. The number of steps is fixed after the first steps have been timed, so that the
cosine schedule ends at the deadline. A checkpoint (bf16 safetensors shards + config.json) is
written to OUT/target about every 90 s and at the end, so a failure later in the run keeps it;
convert_target.py makes it the GGUF the drafter learns from.

Writes OUT/target/model-*.safetensors (bf16, Hugging Face names) and WORK/meta/target/config.json
(+ WORK/meta/target_metrics.json).
"""
from __future__ import annotations

import argparse
import math
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

STEP = "target"
SHARD_BYTES = 12_000_000   # checkpoint shards stay well under the 16 MB a returned file may have
CKPT_EVERY = 90.0          # seconds between checkpoints


def hf_config(s: dict):
    """The target's Qwen3_5TextConfig (DESIGN section 5, scaled down)."""
    import transformers
    cfg = transformers.Qwen3_5TextConfig(
        vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["ffn"],
        num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
        num_key_value_heads=s["kv_heads"], head_dim=s["head_dim"], rms_norm_eps=1e-6,
        max_position_embeddings=4 * s["ctx"], tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=S.token_id(s, S.EOS),
        pad_token_id=S.token_id(s, S.EOS), initializer_range=0.02,
        rope_parameters={"rope_type": "default", "rope_theta": s["rope_theta"],
                         "partial_rotary_factor": s["rotary"],
                         "mrope_section": s["mrope_section"], "mrope_interleaved": True},
        linear_conv_kernel_dim=4, linear_key_head_dim=s["ssm_dim"],
        linear_value_head_dim=s["ssm_dim"], linear_num_key_heads=s["k_heads"],
        linear_num_value_heads=s["v_heads"], full_attention_interval=s["interval"])
    cfg.architectures = ["Qwen3_5ForCausalLM"]
    return cfg


def model_build(s: dict, device: str):
    import transformers
    cfg = hf_config(s)
    cfg._attn_implementation = "sdpa"
    model = transformers.Qwen3_5ForCausalLM(cfg)
    return model.to(device)


def batch_sample(tokens: np.ndarray, rng: np.random.Generator, batch: int, ctx: int,
                 device: str) -> torch.Tensor:
    starts = rng.integers(0, len(tokens) - ctx - 1, size=batch)
    idx = starts[:, None] + np.arange(ctx + 1)[None, :]
    return torch.from_numpy(tokens[idx].astype(np.int64)).to(device, non_blocking=True)


def loss_of(model, x: torch.Tensor, amp: bool) -> torch.Tensor:
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=amp):
        logits = model(input_ids=x[:, :-1]).logits
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))


@torch.no_grad()
def eval_loss(model, tokens: np.ndarray, s: dict, device: str, amp: bool, n_batches: int) -> float:
    model.eval()
    rng = np.random.default_rng(1234)
    losses = [loss_of(model, batch_sample(tokens, rng, s["batch"], s["ctx"], device), amp).item()
              for _ in range(n_batches)]
    model.train()
    return float(np.mean(losses))


def export(model, s: dict, out: pathlib.Path, meta: pathlib.Path) -> list[str]:
    (out / "target").mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu", torch.bfloat16) for k, v in model.state_dict().items()}
    names = util.safetensors_write_sharded(state, out / "target", "model", SHARD_BYTES)
    util.json_write(meta / "target" / "config.json", model.config.to_dict())
    return names


def lr_at(step: int, total: int | None, t0: float, end: float, s: dict) -> float:
    """Linear warm-up, then cosine decay to min_lr_frac. The decay's progress is the larger of
    the step count's (once total is known) and the wall clock's between t0 and end, so the
    schedule finishes at the deadline even when steps get slower than when they were timed."""
    if step < s["warmup"]:
        return s["lr"] * (step + 1) / s["warmup"]
    p = (time.time() - t0) / max(1e-9, end - t0)
    if total is not None:
        p = max(p, (step - s["warmup"]) / max(1, total - s["warmup"]))
    p = min(1.0, p)
    return s["lr"] * (s["min_lr_frac"] + (1 - s["min_lr_frac"]) * 0.5 * (1 + math.cos(math.pi * p)))


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
    torch.manual_seed(0)
    train = np.load(work / "train.npy")
    held = np.load(work / "eval.npy")
    model = model_build(s, device)
    n_params = sum(p.numel() for p in model.parameters())
    util.log(STEP, f"Qwen3_5ForCausalLM, {n_params / 1e6:.2f}M parameters, layers "
             f"{model.config.layer_types}, on {device}"
             + (f" ({torch.cuda.get_device_name()})" if device == "cuda" else ""))
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": s["wd"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=s["lr"], betas=(0.9, 0.95), eps=1e-8,
                            fused=device == "cuda")
    rng = np.random.default_rng(0)
    export_margin = 20.0 if device == "cuda" else 5.0
    end = args.deadline - export_margin
    tok_per_step = s["batch"] * s["ctx"]
    total = None          # set once the first steps are timed
    timed_from = None
    step, t_ckpt, t_log, logged = 0, time.time(), time.time(), 0
    t_train = time.time()
    losses = []
    while True:
        now = time.time()
        if now >= end or (total is not None and step >= total):
            break
        if total is None and step == 5:
            if device == "cuda":
                torch.cuda.synchronize()
            timed_from = (time.time(), step)
        if total is None and timed_from and step == 25:
            if device == "cuda":
                torch.cuda.synchronize()
            per = (time.time() - timed_from[0]) / (step - timed_from[1])
            # leave room for the periodic checkpoints and evaluations
            total = step + int(max(0.0, end - time.time() - 8.0) / per * 0.97)
            util.log(STEP, f"{per * 1e3:.0f} ms/step -> {total} steps "
                     f"({total * tok_per_step / 1e6:.0f}M tokens, "
                     f"{total * tok_per_step / len(train):.1f} epochs of {len(train) / 1e6:.1f}M)")
        lr = lr_at(step, total, t_train, end, s)
        for g in opt.param_groups:
            g["lr"] = lr
        x = batch_sample(train, rng, s["batch"], s["ctx"], device)
        loss = loss_of(model, x, amp)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 10 == 0 or step <= 3:
            losses.append((step, loss.item()))
        if time.time() - t_log > (15.0 if device == "cuda" else 10.0):
            el = time.time() - t_log
            util.log(STEP, f"step {step}/{total or '?'} loss {loss.item():.3f} lr {lr:.2e} "
                     f"{tok_per_step * (step - logged) / el / 1e3:.0f}k tok/s")
            logged, t_log = step, time.time()
        if time.time() - t_ckpt > CKPT_EVERY:
            export(model, s, out, meta)
            util.log(STEP, f"checkpoint at step {step} (held-out loss "
                     f"{eval_loss(model, held, s, device, amp, 2):.3f})")
            t_ckpt = time.time()
    files = export(model, s, out, meta)
    metrics = {"params": n_params, "steps": step, "tokens": step * tok_per_step,
               "train_tokens": int(len(train)),
               "final_train_loss": losses[-1][1] if losses else None,
               "heldout_loss": None, "loss_curve": losses[::max(1, len(losses) // 50)]}
    util.json_write(meta / "target_metrics.json", metrics)   # in case the evaluation is cut off
    ev = metrics["heldout_loss"] = eval_loss(model, held, s, device, amp, 8 if amp else 1)
    util.json_write(meta / "target_metrics.json", metrics)
    util.log(STEP, f"done: {step} steps, {step * tok_per_step / 1e6:.1f}M tokens, held-out loss "
             f"{ev:.3f} ({math.exp(ev):.2f} ppl/token); wrote {', '.join(files)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
