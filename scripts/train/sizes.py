"""Every size and step setting of the demo pair, for the full run (one GPU) and the smoke run
(CPU, minutes). The other scripts read them from here and from nothing else.

The target is a Qwen3_5ForCausalLM text model with every tensor kind of Qwen3.5-27B: Gated
DeltaNet and gated attention layers in the 3:1 pattern, an output gate on attention, partial
RoPE, several value heads per key head, and an untied LM head (output.weight). It is sized so
that its Q8_0 GGUF stays under 16 MB: hidden 384 is not a multiple of 256, so K-quants would
fall back to Q8_0 anyway, and Q8_0 keeps the GGUF target's greedy choices close to the trained
one, which the drafter was trained to imitate.

The drafter always learns from a GGUF target, the very weights tandem verifies with. From
scratch, the trained target is converted in the run (convert_target.py) and the drafter step
then gets as much time as with `--target FILE.gguf`, where only the drafter is trained, against
that file's target (the shipped models/demo/demo.gguf): `budget - gguf_prepare_until` seconds.
So the from-scratch run takes `convert_until + budget - gguf_prepare_until` seconds
(deadlines()); `--stop-after target` ends it at `convert_until`.
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
    # drafter prompts: whole lines of source ending at a random line end, like the evaluation
    # prompts (which come from held-out files); training prompts come from training files
    train_prompts=65536,          # at most this many training prompts are cut
    prompt_every=3000,            # one prompt per this many characters of a file (at least 1)
    val_prompts=256,              # prompts of held-out files (not the evaluation's, but as
                                  # long as those: prompt_chars) to validate
    d_prompt_chars=(200, 1200),   # a drafter prompt's length in characters (min, max)
    # greedy continuations of those prompts by the target, past <|endoftext|> as the
    # evaluation (`tandem generate --ignore-eos`) generates
    # rows per generate call (a decode step costs about the same for 1 or 2048 rows: this
    # small model's step is kernel launches); tokens generated per prompt
    gen_batch=2048, gen_new=160,
    feat_gb=48.0,                 # GPU memory for the tap features of all rows (bf16)
    # drafter (DFlash, config.json + model.safetensors); attention and FFN shaped like the
    # target's so that each layer can start from one of the target's (d_init_from_target)
    d_layers=4, d_heads=6, d_kv_heads=2, d_head_dim=64, d_ffn=768,
    d_init_from_target=True,
    taps=[1, 4, 7],               # target layers whose outputs feed the drafter
    block=16, gamma=7.0,          # block size; loss weight exp(-(k-1)/gamma) of slot k
    # sequences per step; anchor positions per sequence: many sequences with few anchors each
    # give varied batches, and a block's queries are scored against every block of its
    # sequence (masked), so fewer blocks per sequence also waste less attention
    d_batch=128, anchors=32,
    d_lr=1.5e-3, d_warmup=100,
    # wall-clock shares of the run (seconds from the start of run_all.sh)
    budget=540,                   # --target FILE.gguf run (the device allows 600 s a command)
    gguf_prepare_until=60,        # --target FILE.gguf: prompts done by then, then the drafter
    gguf_gen_share=0.25,          # share of the drafter step's time spent generating
    prepare_until=105,            # from scratch: data + vocabulary + tokenising done by then
    target_until=345,             # target training (and its export) done by then
    convert_until=375,            # the target's GGUF written by then; the drafter step follows
                                  # with budget - gguf_prepare_until seconds
)

SMOKE = dict(
    FULL,
    train_bytes=1_500_000, tok_sample_bytes=600_000, eval_bytes=100_000,
    heldout_percent=5, n_prompts=12, prompt_chars=(120, 300),
    vocab=1024,
    hidden=64, layers=4, ffn=128, heads=2, kv_heads=1, head_dim=32,
    k_heads=1, v_heads=2, ssm_dim=32, mrope_section=[2, 1, 1],
    ctx=128, batch=8, lr=3e-3, warmup=10,
    train_prompts=512, val_prompts=8, d_prompt_chars=(120, 400),
    gen_batch=8, gen_new=48, feat_gb=1.0,
    d_layers=1, d_heads=2, d_kv_heads=1, d_head_dim=32, d_ffn=128, taps=[1, 3],
    d_batch=8, anchors=16, d_warmup=5,
    budget=300, gguf_prepare_until=90, prepare_until=60, target_until=150, convert_until=170,
)


def sizes(smoke: bool) -> dict:
    s = dict(SMOKE if smoke else FULL)
    s["eos_id"], s["mask_id"] = token_id(s, EOS), token_id(s, MASK)
    return s


def sizes_for_target(s: dict, hidden: int, layers: int, vocab: int, eos_id: int,
                     mask_id: int) -> dict:
    """s with the target's own shapes and token ids (from a GGUF file) in place of the ones
    the from-scratch target would have; the drafter's own sizes stay."""
    bad = [t for t in s["taps"] if not 0 <= t < layers]
    if bad:
        raise ValueError(f"tap layers {bad} do not exist in a target of {layers} layers")
    return dict(s, hidden=hidden, layers=layers, vocab=vocab, eos_id=eos_id, mask_id=mask_id)


def n_bpe(s: dict) -> int:
    """Byte alphabet + merges: the ids below the added tokens."""
    return s["vocab"] - len(ADDED)


def token_id(s: dict, text: str) -> int:
    return n_bpe(s) + [t for t, _ in ADDED].index(text)


def deadlines(s: dict, budget: float | None, gguf: bool = False
              ) -> tuple[float, float, float, float]:
    """Seconds from the start by which the data, the target's training, its GGUF conversion
    and the drafter are done. With a GGUF target nothing is trained or converted: those
    deadlines are the data's. All of them scale with a budget (the whole run's seconds) other
    than the default."""
    if gguf:
        k = (budget or s["budget"]) / s["budget"]
        p = k * s["gguf_prepare_until"]
        return p, p, p, k * s["budget"]
    total = scratch_seconds(s)
    k = (budget or total) / total
    return (k * s["prepare_until"], k * s["target_until"], k * s["convert_until"], k * total)


def scratch_seconds(s: dict) -> float:
    """The default length of the from-scratch run: the target's part, then the drafter step
    of a --target run."""
    return s["convert_until"] + s["budget"] - s["gguf_prepare_until"]


if __name__ == "__main__":
    # run_all.sh: `python3 sizes.py [--smoke] [--gguf] [BUDGET]` -> 4 deadlines
    import sys
    argv = [a for a in sys.argv[1:] if a not in ("--smoke", "--gguf")]
    d = deadlines(sizes("--smoke" in sys.argv), float(argv[0]) if argv else None,
                  "--gguf" in sys.argv)
    print(" ".join(str(int(x)) for x in d))
