#!/usr/bin/env bash
# Trains tandem's demo pair: a small Qwen3.5-architecture target and its DFlash drafter, on the
# Python source files of the machine's own Python installation (no download); or, with
# --target FILE.gguf, only the drafter, for that existing target (the shipped demo.gguf).
#
#   scripts/train/run_all.sh OUTDIR [--target FILE.gguf] [--smoke] [--budget SECONDS]
#                                   [--work DIR]
#
# Full run: one CUDA GPU, about 9 minutes (--budget, default 540 s, bounds the whole run:
# every step works to a deadline and is killed shortly after it). --smoke: tiny sizes on the
# CPU in about 5 minutes, to try the whole flow anywhere. Needs torch, transformers (qwen3_5),
# tokenizers, safetensors and numpy; not gguf (the GGUF target is read by gguf_target.py; a
# trained target is converted afterwards by finish.sh).
#
# OUTDIR receives at most 6 files, each under 16 MB, written as the run goes so that a failing
# step keeps what the earlier ones made:
#   run.log                      everything printed
#   meta.tar                     drafter/config.json, data.json (file counts, evaluation
#                                prompts, the GGUF target's sha256), *_metrics.json; from
#                                scratch also target/{config.json, tokenizer.json,
#                                tokenizer_config.json, chat_template.jinja}
#   target/model-*.safetensors   from scratch: the target (bf16, Hugging Face names, 12 MB
#                                shards) + index
#   drafter/model.safetensors    the drafter (bf16)
# Then, on a machine with this repository and gguf: scripts/train/finish.sh OUTDIR.
set -u -o pipefail

usage() {
    echo "usage: $0 OUTDIR [--target FILE.gguf] [--smoke] [--budget SECONDS] [--work DIR]" >&2
    exit 2
}
[ $# -ge 1 ] || usage
OUT=$1; shift
SMOKE=""; BUDGET=""; WORK=""; TARGET=""
while [ $# -gt 0 ]; do
    case $1 in
        --smoke) SMOKE=--smoke ;;
        --target) TARGET=${2:?}; shift ;;
        --budget) BUDGET=${2:?}; shift ;;
        --work) WORK=${2:?}; shift ;;
        *) usage ;;
    esac
    shift
done

HERE=$(cd "$(dirname "$0")" && pwd)
if [ -n "$TARGET" ]; then
    [ -f "$TARGET" ] || { echo "$0: no GGUF target at $TARGET" >&2; exit 2; }
    TARGET=$(cd "$(dirname "$TARGET")" && pwd)/$(basename "$TARGET")
fi
PY=${PYTHON:-python3}
export TRAIN_T0=$(date +%s)
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
export TOKENIZERS_PARALLELISM=true PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
mkdir -p "$OUT" || exit 1
OUT=$(cd "$OUT" && pwd)
if [ -z "$WORK" ]; then
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/tandem-train.XXXXXX") || exit 1
fi
mkdir -p "$WORK/meta"

elapsed() { echo $(( $(date +%s) - TRAIN_T0 )); }
say() { echo "[$(printf '%5d' "$(elapsed)").0s] run_all: $*"; }

# Packs the small files into OUTDIR/meta.tar (replaced whole, never half-written).
pack() {
    tar -C "$WORK/meta" -cf "$OUT/meta.tar.tmp" . && mv "$OUT/meta.tar.tmp" "$OUT/meta.tar"
}

# Runs one step, killed 30 s after its deadline (seconds from the start) if it has not ended.
step() {
    local name=$1 until=$2; shift 2
    local left=$(( until - $(elapsed) + 30 ))
    [ $left -gt 10 ] || left=10
    say "$name: starting (deadline ${until}s from the start)"
    local t0=$(date +%s)
    timeout --kill-after=10 "$left" "$@"
    local rc=$?
    say "$name: exit $rc after $(( $(date +%s) - t0 ))s"
    pack
    return $rc
}

VERSIONS='import platform, sys, torch, transformers, tokenizers
gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, transformers "
      f"{transformers.__version__}, tokenizers {tokenizers.__version__}, GPU {gpu}, "
      f"{platform.machine()}")'

main() {
    read -r PREP_UNTIL TARGET_UNTIL DRAFT_UNTIL < <("$PY" "$HERE/sizes.py" $SMOKE \
        ${TARGET:+--gguf} $BUDGET) || exit 1
    say "out $OUT, work $WORK, budget ${DRAFT_UNTIL}s ${SMOKE:+(smoke)}${TARGET:+, target $TARGET}"
    "$PY" -c "$VERSIONS"

    step prepare "$PREP_UNTIL" "$PY" "$HERE/prepare_data.py" "$WORK" \
        --deadline $(( TRAIN_T0 + PREP_UNTIL )) $SMOKE ${TARGET:+--target "$TARGET"} || {
        say "no training data; stopping"; exit 1; }
    rc_target=0
    if [ -z "$TARGET" ]; then
        step target "$TARGET_UNTIL" "$PY" "$HERE/train_target.py" "$WORK" "$OUT" \
            --deadline $(( TRAIN_T0 + TARGET_UNTIL )) $SMOKE
        rc_target=$?
        if ! ls "$OUT"/target/model*.safetensors >/dev/null 2>&1; then
            say "no target checkpoint; stopping"; exit 1
        fi
    fi
    step drafter "$DRAFT_UNTIL" "$PY" "$HERE/train_drafter.py" "$WORK" "$OUT" \
        --deadline $(( TRAIN_T0 + DRAFT_UNTIL )) $SMOKE ${TARGET:+--target "$TARGET"}
    rc_drafter=$?

    find "$OUT" -name '*.tmp' -delete
    say "outputs:"
    (cd "$OUT" && find . -type f ! -name run.log -printf '%10s  %p\n' | sort -k2)
    rm -f "$WORK/train.npy" "$WORK/eval.npy" "$WORK/prompts.npz"
    say "done in $(elapsed)s (target exit $rc_target, drafter exit $rc_drafter)"
    [ $rc_target -eq 0 ] && [ $rc_drafter -eq 0 ]
}

main 2>&1 | tee -a "$OUT/run.log"
exit "${PIPESTATUS[0]}"
