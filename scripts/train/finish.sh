#!/usr/bin/env bash
# After run_all.sh: checks the GGUF target the run trained for (OUTDIR/demo.gguf from scratch,
# or --target F.gguf, or the one in DEST), evaluates the pair with `tandem generate` on the CPU
# and, when the drafter passes, writes models/demo/{demo.gguf, drafter/}; an OUTDIR of
# `run_all.sh --stop-after target` only gets its target checked and installed
# (scripts/train/finish.py says how).
#
#   scripts/train/finish.sh OUTDIR [finish.py options: --dest DIR --target F.gguf
#                                   --results FILE --prompts N -n N --smoke --force]
#
# Builds `tandem` in build-train/ unless TANDEM_BIN names one. Needs python3 with numpy, gguf,
# torch, transformers, tokenizers and safetensors. Exit status 1 when the drafter misses the
# acceptance bar (not with --smoke) or speculative decoding changed an output; the drafter is
# then not installed (unless --force). With --smoke the results go to DEST/RESULTS.md.
set -eu -o pipefail

[ $# -ge 1 ] || { echo "usage: $0 OUTDIR [--dest DIR] [--target F.gguf] [--results FILE] [--prompts N] [-n N] [--smoke] [--force]" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
if [ -z "${TANDEM_BIN:-}" ]; then
    cmake -S "$ROOT" -B "$ROOT/build-train" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
    ninja -C "$ROOT/build-train" -j"${JOBS:-2}" tandem >/dev/null
    TANDEM_BIN=$ROOT/build-train/tandem
fi
exec "${PYTHON:-python3}" "$HERE/finish.py" "$@" --tandem "$TANDEM_BIN"
