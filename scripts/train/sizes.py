"""Every size and step setting of the demo pair, for the full run (one GPU) and the smoke run
(CPU, minutes). The other scripts read them from here and from nothing else.

The target is a Qwen3_5ForCausalLM text model with every tensor kind of Qwen3.5-27B: Gated
DeltaNet and gated attention layers in the 3:1 pattern, an output gate on attention, partial
RoPE, several value heads per key head, and an untied LM head (output.weight). It is sized so
that its Q8_0 GGUF stays under 16 MB: hidden 384 is not a multiple of 256, so K-quants would
fall back to Q8_0 anyway, and Q8_0 keeps the GGUF target's greedy choices close to the trained
one, which the drafter was trained to imitate.
"""
from __future__ import annotations

# Special tokens after the BPE merges, in id order (the last is the drafter's mask token). The
# ChatML tokens and <|endoftext|> are Qwen's; the think/tool tags are added tokens that are not
# special, as in Qwen's tokenizer.json, so the Qwen3.5 chat template renders to known tokens.
ADDED = [  # (text, special)
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<think>", False),
    ("</think>", False),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|mask|>", True),
]
EOS = "<|endoftext|>"   # ends every training file; generation stops on it (and on <|im_end|>)
MASK = "<|mask|>"

FULL = dict(
    # data (bytes of Python source text)
    train_bytes=200_000_000,      # training text cap
    tok_sample_bytes=24_000_000,  # the BPE vocabulary is learnt from this much of it
    eval_bytes=4_000_000,         # held-out text for the validation loss
    heldout_percent=2,            # files whose content hash falls here are held out
    n_prompts=64,                 # held-out code prefixes written for the evaluation
    prompt_chars=(400, 900),      # a prompt's length in characters (min, max)
    # tokenizer
    vocab=4096,                   # BPE tokens + ADDED
    # target (Qwen3_5TextConfig)
    hidden=384, layers=8, ffn=768, heads=6, kv_heads=2, head_dim=64, rotary=0.25,
    k_heads=2, v_heads=6, ssm_dim=64, interval=4, rope_theta=1e7,
    mrope_section=[3, 3, 2],      # sums to head_dim * rotary / 2; all axes equal for text
    ctx=512,                      # training sequence length
    batch=128,                    # sequences per step
    lr=2.5e-3, warmup=150, wd=0.1, min_lr_frac=0.1,
    # greedy continuations of training prompts by the trained target
    gen_batch=1024, gen_prompt=(32, 224), gen_new=256,
    # drafter (DFlash, config.json + model.safetensors)
    d_layers=2, d_heads=6, d_kv_heads=2, d_head_dim=64, d_ffn=1024,
    taps=[1, 4, 7],               # target layers whose outputs feed the drafter
    block=16, gamma=7.0,          # block size; loss weight exp(-(k-1)/gamma) of slot k
    d_batch=32, anchors=128,      # sequences per step; anchor positions per sequence
    d_lr=1.5e-3, d_warmup=60,
    # wall-clock shares of the run (seconds from the start of run_all.sh)
    budget=540,                   # whole run (the device allows 600 s a command)
    prepare_until=105,            # data + vocabulary + tokenising done by then
    target_until=345,             # target training (and its export) done by then
    gen_share=0.30,               # share of the drafter step's time spent generating
)

SMOKE = dict(
    FULL,
    train_bytes=1_500_000, tok_sample_bytes=600_000, eval_bytes=100_000,
    heldout_percent=5, n_prompts=12, prompt_chars=(120, 300),
    vocab=1024,
    hidden=64, layers=4, ffn=128, heads=2, kv_heads=1, head_dim=32,
    k_heads=1, v_heads=2, ssm_dim=32, mrope_section=[2, 1, 1],
    ctx=128, batch=8, lr=3e-3, warmup=10,
    gen_batch=8, gen_prompt=(16, 48), gen_new=48,
    d_layers=1, d_heads=2, d_kv_heads=1, d_head_dim=32, d_ffn=128, taps=[1, 3],
    d_batch=8, anchors=16, d_warmup=5,
    budget=300, prepare_until=60, target_until=150,
)


def sizes(smoke: bool) -> dict:
    return dict(SMOKE if smoke else FULL)


def n_bpe(s: dict) -> int:
    """Byte alphabet + merges: the ids below the added tokens."""
    return s["vocab"] - len(ADDED)


def token_id(s: dict, text: str) -> int:
    return n_bpe(s) + [t for t, _ in ADDED].index(text)


def deadlines(s: dict, budget: float | None) -> tuple[float, float, float]:
    """Seconds from the start by which data, target and drafter are done; all shares of the
    run scale with a budget other than the default."""
    k = (budget or s["budget"]) / s["budget"]
    return k * s["prepare_until"], k * s["target_until"], k * s["budget"]


if __name__ == "__main__":   # run_all.sh: `python3 sizes.py [--smoke] [BUDGET]` -> 3 deadlines
    import sys
    argv = [a for a in sys.argv[1:] if a != "--smoke"]
    d = deadlines(sizes("--smoke" in sys.argv), float(argv[0]) if argv else None)
    print(" ".join(str(int(x)) for x in d))
