#!/usr/bin/env bash
# Trains tandem's demo pair: a small Qwen3.5-architecture target, converted to the GGUF file
# tandem runs, and its DFlash drafter, trained against that GGUF; on the Python source files of
# the machine's own Python installation (no download). With --target FILE.gguf only the
# drafter, for that existing target (the shipped demo.gguf).
#
#   scripts/train/run_all.sh OUTDIR [--target FILE.gguf | --stop-after target] [--smoke]
#                                   [--budget SECONDS] [--work DIR]
#
# One CUDA GPU. From scratch: data until 105 s, target until 345 s, its GGUF until 375 s,
# then the drafter step with the 480 s a --target run gives it: 855 s in all (--budget scales
# every share; each step works to its deadline and is killed shortly after it).
# --stop-after target ends after OUTDIR/demo.gguf (375 s), for machines that allow 10 minutes a
# command: `run_all.sh OUT --stop-after target`, then `run_all.sh OUT2 --target OUT/demo.gguf`
# trains the same drafter (a --target run: default budget 540 s). --smoke: tiny sizes on the
# CPU (from scratch about 6 minutes, --target 5). Needs torch, transformers (qwen3_5),
# tokenizers, safetensors, numpy and, from scratch, the `gguf` package (pure Python, checked
# before any training): `pip install gguf`, or PYTHONPATH or GGUF_PY_PATH naming an unpacked
# gguf wheel or the .whl file itself (Python imports from it as from a zip). It also needs
# pyyaml and tqdm, which transformers brings.
#
# OUTDIR receives at most 7 files, each under 16 MB, written as the run goes so that a failing
# step keeps what the earlier ones made:
#   run.log                      everything printed
#   meta.tar                     drafter/config.json, data.json (file counts, evaluation
#                                prompts, the GGUF target's name and sha256), *_metrics.json;
#                                from scratch also target/{config.json, tokenizer.json,
#                                tokenizer_config.json, chat_template.jinja}
#   demo.gguf                    from scratch: the trained target (q8_0)
#   target/model-*.safetensors   from scratch, only until demo.gguf is written (then they move
#                                to WORK/target): the target (bf16, Hugging Face names, 12 MB
#                                shards) + index
#   drafter/model.safetensors    the drafter (bf16)
# Then, on a machine with this repository and gguf: scripts/train/finish.sh OUTDIR.
set -u -o pipefail

usage() {
    echo "usage: $0 OUTDIR [--target FILE.gguf | --stop-after target] [--smoke]" \
         "[--budget SECONDS] [--work DIR]" >&2
    exit 2
}
[ $# -ge 1 ] || usage
OUT=$1; shift
SMOKE=""; BUDGET=""; WORK=""; TARGET=""; STOP=""
while [ $# -gt 0 ]; do
    case $1 in
        --smoke) SMOKE=--smoke ;;
        --target) TARGET=${2:?}; shift ;;
        --stop-after) STOP=${2:?}; shift; [ "$STOP" = target ] || usage ;;
        --budget) BUDGET=${2:?}; shift ;;
        --work) WORK=${2:?}; shift ;;
        *) usage ;;
    esac
    shift
done

[ -z "$TARGET" ] || [ -z "$STOP" ] || usage

HERE=$(cd "$(dirname "$0")" && pwd)
if [ -n "${GGUF_PY_PATH:-}" ]; then
    export PYTHONPATH=$GGUF_PY_PATH${PYTHONPATH:+:$PYTHONPATH}
fi
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
    read -r PREP_UNTIL TARGET_UNTIL CONVERT_UNTIL DRAFT_UNTIL < <("$PY" "$HERE/sizes.py" \
        $SMOKE ${TARGET:+--gguf} $BUDGET) || exit 1
    [ -n "$STOP" ] && END=$CONVERT_UNTIL || END=$DRAFT_UNTIL
    local what="budget ${DRAFT_UNTIL}s${SMOKE:+ (smoke)}"
    what+="${STOP:+, stopping after the target at ${END}s}${TARGET:+, target $TARGET}"
    say "out $OUT, work $WORK, $what"
    "$PY" -c "$VERSIONS"
    if [ -z "$TARGET" ] && ! err=$("$PY" -c "import gguf" 2>&1); then
        say "python cannot import gguf, which converts the trained target in this run" \
            "(${err##*$'\n'}): pip install gguf, or set PYTHONPATH or GGUF_PY_PATH to an" \
            "unpacked gguf wheel or the .whl file; stopping"
        exit 1
    fi

    step prepare "$PREP_UNTIL" "$PY" "$HERE/prepare_data.py" "$WORK" \
        --deadline $(( TRAIN_T0 + PREP_UNTIL )) $SMOKE ${TARGET:+--target "$TARGET"} || {
        say "no training data; stopping"; exit 1; }
    rc_target=0 rc_drafter=0
    if [ -z "$TARGET" ]; then
        step target "$TARGET_UNTIL" "$PY" "$HERE/train_target.py" "$WORK" "$OUT" \
            --deadline $(( TRAIN_T0 + TARGET_UNTIL )) $SMOKE
        rc_target=$?
        if ! ls "$OUT"/target/model*.safetensors >/dev/null 2>&1; then
            say "no target checkpoint; stopping"; exit 1
        fi
        # the drafter learns from the GGUF tandem will run, as in a --target run
        step convert "$CONVERT_UNTIL" "$PY" "$HERE/convert_target.py" "$WORK" "$OUT" || {
            say "no GGUF target; stopping (the checkpoint stays in $OUT/target)"; exit 1; }
        TARGET=$OUT/demo.gguf
    fi
    if [ -z "$STOP" ]; then
        step drafter "$DRAFT_UNTIL" "$PY" "$HERE/train_drafter.py" "$WORK" "$OUT" \
            --deadline $(( TRAIN_T0 + DRAFT_UNTIL )) $SMOKE --target "$TARGET"
        rc_drafter=$?
    else
        say "stopping after the target (--stop-after target); its drafter: $0 OUT2 --target $TARGET"
    fi

    find "$OUT" -name '*.tmp' -delete
    say "outputs:"
    (cd "$OUT" && find . -type f ! -name run.log -printf '%10s  %p\n' | sort -k2)
    rm -f "$WORK/train.npy" "$WORK/eval.npy" "$WORK/prompts.npz"
    [ -n "$STOP" ] && drafter="not trained" || drafter="exit $rc_drafter"
    say "done in $(elapsed)s (target exit $rc_target, drafter $drafter)"
    [ $rc_target -eq 0 ] && [ $rc_drafter -eq 0 ]
}

main 2>&1 | tee -a "$OUT/run.log"
exit "${PIPESTATUS[0]}"
