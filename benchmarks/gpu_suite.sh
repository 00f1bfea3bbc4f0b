#!/usr/bin/env bash
# Every GPU measurement of the scorer and the trainers in one run, its logs under one folder.
#
#   benchmarks/gpu_suite.sh OUT [TABLE]
#
# On one H100 it is sized to finish in under 8 minutes (GPU time is lent by the quarter hour: plan
# one run of it). TABLE defaults to the fixture table ($SHARED_DATA_DIR or ../shared); the CSLM step
# reads the fixture n-best list there too (fixtures/hansard-enfr/nbest/dev.nbest.gz: carry it). Settings:
#   DEVICE=cuda      the device measured (the CPU check runs DEVICE=cpu TINY=1)
#   TINY=1           tiny sizes and a few thousand lines: the suite's own check on the CPU
#                    (tests/benchmarks/test_gpu_suite.py), so it is known to work before GPU time is spent
#   PYTHON=python3   the interpreter that has torch (the device image's), with this project installed
#   JOBS=N           worker processes of the end-to-end runs [default: the CPUs less 2]
# What it writes to OUT (one log per step, summary.txt the figures):
#   precision.log    model-only scoring, fp32 / TF32 / bf16 (python -m benchmarks.precision)
#   e2e.<p>.log, gpu-util.<p>.csv   end to end on the table, TF32 and fp32, GPU utilisation sampled;
#                    with -v's timeline: the fixed cost (command start to the first scored chunk)
#                    and the main thread's seconds per chunk, in summary.txt
#   e2e-copies.<p>.log   end to end on 10 copies of the table (TINY: 2) in the first precision: with
#                    the one-copy run, the steady lines/s and the fixed cost apart (summary.txt)
#   startup.log      command start to exit with a paper-size model (TINY: tiny) on 200 lines
#   cuda-tests.log   tests/neural/test_cuda_graphs.py, whose GPU tests run only there
#   train.log        training, paper size, 64 pairs per update: eager against the captured step
#   cslm.log         CSLM training (and n-best scoring) speed
#   nmt.log          the attention NMT model: training speed beside a torch peer, fp32 and bf16, n-best
#                    scoring and beam search (python -m benchmarks.nmt_speed); then `nmt train`,
#                    `nmt translate` and `nmt nbest` on the device from the command line, on the
#                    fixture's 400 tokenised dev and test pairs (50 sources translated; TINY: 10), so
#                    its CUDA path has run end to end
#   identity.log     a rerun byte-identical to the first run, and a run killed after two chunks and
#                    --resume'd byte-identical too (else what differs: lines, members, or members' bytes)
set -euo pipefail
OUT=${1:?usage: benchmarks/gpu_suite.sh OUT [TABLE]}
REPO=$(cd "$(dirname "$0")/.." && pwd)
TABLE=${2:-${SHARED_DATA_DIR:-$REPO/../shared}/fixtures/hansard-enfr/model/phrase-table.gz}
TABLE=$(cd "$(dirname "$TABLE")" && pwd)/$(basename "$TABLE")  # absolute: the benchmarks run from $REPO
DEVICE=${DEVICE:-cuda}
PYTHON=${PYTHON:-python3}
case $PYTHON in */*) PYTHON=$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON");; esac  # the bench steps cd
CPUS=$("$PYTHON" -c 'import os; print(len(os.sched_getaffinity(0)))')
JOBS=${JOBS:-$(( CPUS > 3 ? CPUS - 2 : 2 ))}
if [ -n "${TINY:-}" ]; then
  LINES=6000; PRECISION_LINES=2000; SIZE=tiny; STARTUP_SIZE=tiny; CHUNK=200; COPIES=2; PRECISIONS=fp32
  E2E_PRECISIONS=fp32
  TRAIN="--sizes small --vocab 50 --steps 1 --profile-steps 0 --train-step eager,static"
  CSLM="--sentences 5 --train-steps 2 --embedding 16 --hidden 32 --vocab 200 --train-step eager,static"
  NMT="--dim 32 --vocab 300 --batch 4 --steps 1 --sources 2 --hypotheses 5 --precision fp32"
  NMT_TRAIN="--embedding 16 --hidden 16 --alignment 16 --maxout 16 --vocab-size 400 --batch-size 8 --max-steps 4 --valid-every 2 --bleu-sentences 2"
  NMT_SOURCES=10
  export BENCHMARK_PEAK_SECONDS=${BENCHMARK_PEAK_SECONDS:-0.25}  # each yardstick timed 0.25 s, not 2
else
  LINES=0; PRECISION_LINES=0; SIZE=paper; STARTUP_SIZE=paper; CHUNK=100000; COPIES=10; PRECISIONS=fp32,tf32,bf16
  E2E_PRECISIONS="tf32 fp32"; NMT_SOURCES=50
  TRAIN="--sizes paper --batch-size 64 --steps 200 --profile-steps 0 --train-step eager,captured"
  CSLM="--sentences 50 --train-steps 200 --train-step eager,captured"
  NMT="--dim 512 --vocab 16000 --batch 80 --steps 20 --sources 50 --hypotheses 100 --precision fp32,bf16"
  NMT_TRAIN="--vocab-size 1000 --max-steps 300 --valid-every 100 --bleu-sentences 50"
fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
RESCORE=$(dirname "$(command -v "$PYTHON")")/rescore-phrase-table
[ -x "$RESCORE" ] || RESCORE="$PYTHON -m rescorer.cli rescore"
bench() { local name=$1; shift; (cd "$REPO" && "$PYTHON" -m "benchmarks.$name" "$@"); }  # as the docs run them
note() { echo "$*" | tee -a "$OUT/summary.txt"; }
failures=0
failed() { local status=$?; failures=$((failures + 1)); note "$1: FAILED (exit status $status); the suite goes on, see $1.log"; }
since() { "$PYTHON" -c 'import sys, time; print(f"{time.time() - float(sys.argv[1]):.2f}")' "$1"; }
: > "$OUT/summary.txt"
note "gpu_suite: $(date -u +%FT%TZ) device=$DEVICE table=$TABLE lines=${LINES/#0/all} size=$SIZE jobs=$JOBS"
"$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
  torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")' | tee -a "$OUT/summary.txt"

# The table: all of it, or its first LINES lines.
if [ "$LINES" = 0 ]; then IN=$TABLE; else
  IN=$WORK/in.gz
  "$PYTHON" - "$TABLE" "$IN" "$LINES" <<'EOF'
import gzip, itertools, sys
with gzip.open(sys.argv[1]) as src, gzip.open(sys.argv[2], "wb") as dst:
    dst.writelines(itertools.islice(src, int(sys.argv[3])))
EOF
fi
bench random_checkpoint "$IN" "$WORK/model.pt" --size "$SIZE" > /dev/null

# 1. Model-only scoring at each precision.
bench precision --table "$IN" --lines "$PRECISION_LINES" --model "$WORK/model.pt" --device "$DEVICE" \
  --precisions "$PRECISIONS" --cpu-lines 0 --small-budget 0 --chunk-lines "$CHUNK" > "$OUT/precision.log" 2>&1 \
  || failed precision
note "precision: $(grep -Ei 'pairs/s' "$OUT/precision.log" | tail -3 | tr '\n' ' ')"

# 2. End to end, GPU utilisation sampled every 0.5 s.
e2e() {  # e2e PRECISION OUTPUT [extra options]; exec: run in the background, its pid is the command's
  local precision=$1 output=$2; shift 2
  exec $RESCORE "${E2E_IN:-$IN}" "$output" --model "$WORK/model.pt" --device "$DEVICE" --precision "$precision" \
    -j "$JOBS" --chunk-lines "$CHUNK" -q -v "$@"
}
# A run's figures from its log: the summary line, and from -v's timeline the fixed cost (start to the
# first scored chunk), the main thread's seconds per chunk and the writing thread's.
figures() {
  echo "$(grep '^rescored' "$1" | tail -1); fixed cost (command start to first scored chunk)" \
    "$(grep -o 'first chunk scored [0-9.]*' "$1" | tail -1 | awk '{print $4}') s;" \
    "$(grep '^main thread over' "$1" | tail -1); $(grep '^writing thread' "$1" | tail -1)"
}
declare -A walls  # each precision's wall time of the end-to-end run on one copy of the table
for p in $E2E_PRECISIONS; do
  sampler=""
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -lms 500 > "$OUT/gpu-util.$p.csv" &
    sampler=$!
  fi
  start=$(date +%s.%N)
  (e2e "$p" "$WORK/e2e.$p.gz") > "$OUT/e2e.$p.log" 2>&1
  wall=$(since "$start")
  if [ -n "$sampler" ]; then kill "$sampler"; fi
  note "e2e $p: $(figures "$OUT/e2e.$p.log"); wall with start-up $wall s"
  walls[$p]=$wall
done

# 2b. The steady rate apart from the fixed cost: the same run on COPIES copies of the table end to
#     end (concatenated gzip members: a valid gzip), so that (L_k - L_1) / (T_k - T_1) is the rate
#     once started, and T_1 - L_1 / rate the fixed cost (start-up, first chunk, tail), which one copy
#     of the fixture (its chunks all fit in the prepared-chunk queue) cannot tell apart.
steady=$(echo "$E2E_PRECISIONS" | awk '{print $1}')
for _ in $(seq "$COPIES"); do cat "$IN"; done > "$WORK/copies.gz"
start=$(date +%s.%N)
(E2E_IN=$WORK/copies.gz e2e "$steady" "$WORK/copies.out.gz") > "$OUT/e2e-copies.$steady.log" 2>&1 \
  || failed "e2e-copies.$steady"
wall_k=$(since "$start")
rm -f "$WORK/copies.gz" "$WORK/copies.out.gz"
note "e2e $steady, $COPIES copies of the table: $(figures "$OUT/e2e-copies.$steady.log"); wall with start-up $wall_k s"
note "e2e $steady steady: $("$PYTHON" - "$IN" "$COPIES" "${walls[$steady]}" "$wall_k" <<'EOF'
import gzip, sys
lines = sum(1 for _ in gzip.open(sys.argv[1]))
copies, t1, tk = int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
if tk <= t1:
    print(f"{copies} copies took no longer than one ({tk:.2f} s against {t1:.2f} s): no steady rate")
else:
    rate = (copies - 1) * lines / (tk - t1)
    print(f"{rate:,.0f} lines/s = (L{copies} - L1) / (T{copies} - T1) with L1 = {lines:,} lines, "
          f"T1 = {t1:.2f} s, T{copies} = {tk:.2f} s; fixed cost T1 - L1 / rate = {t1 - lines / rate:.2f} s")
EOF
)"

# 3. Start-up: command start to exit, paper-size model (random weights; TINY: the tiny one), 200 lines.
if [ "$STARTUP_SIZE" = "$SIZE" ]; then cp "$WORK/model.pt" "$WORK/startup.pt"
else bench random_checkpoint "$IN" "$WORK/startup.pt" --size "$STARTUP_SIZE" > /dev/null; fi
"$PYTHON" - "$IN" "$WORK/head.gz" <<'EOF'
import gzip, itertools, sys
with gzip.open(sys.argv[1]) as src, gzip.open(sys.argv[2], "wb") as dst:
    dst.writelines(itertools.islice(src, 200))
EOF
start=$(date +%s.%N)
$RESCORE "$WORK/head.gz" "$WORK/head.out.gz" --model "$WORK/startup.pt" --device "$DEVICE" -q > "$OUT/startup.log" 2>&1
note "start-up ($STARTUP_SIZE size, 200 lines, start to exit): $(since "$start") s"

# 4. Training, paper size, 64 pairs per update: eager against the captured step (fp32, then TF32);
#    first the CUDA-graph tests that only a GPU runs (an XPASS: the capture works now; pytest needed).
if "$PYTHON" -c 'import pytest' 2> /dev/null; then
  (cd "$REPO" && "$PYTHON" -m pytest -q -p no:cacheprovider -rxXs tests/neural/test_cuda_graphs.py) \
    > "$OUT/cuda-tests.log" 2>&1 || failed cuda-tests
  note "cuda tests: $(tail -1 "$OUT/cuda-tests.log")"
else
  note "cuda tests: pytest not installed; skipped"
fi
bench train_speed --device "$DEVICE" $TRAIN > "$OUT/train.log" 2>&1 || failed train
if [ -z "${TINY:-}" ]; then
  bench train_speed --device "$DEVICE" $TRAIN --precision tf32 >> "$OUT/train.log" 2>&1 || failed train
fi
note "train: $(grep -Ei 'pairs/s' "$OUT/train.log" | tr '\n' ' ')"

# 5. CSLM training and n-best scoring.
bench cslm_speed --device "$DEVICE" $CSLM > "$OUT/cslm.log" 2>&1 || failed cslm
note "cslm: $(grep -Ei 'n-grams/s|hypotheses/s' "$OUT/cslm.log" | tr '\n' ' ')"

# 5b. The attention NMT model: speed, then its commands on the device (the fixture's tokenised text).
bench nmt_speed --device "$DEVICE" $NMT > "$OUT/nmt.log" 2>&1 || failed nmt
TEXT=${SHARED_DATA_DIR:-$REPO/../shared}/fixtures/hansard-enfr/data  # dev and test, tokenised: 400 pairs
if [ -f "$TEXT/dev.tok.tc.en" ]; then
  nmt_cli() { "$PYTHON" -m nmt.cli "$@"; }
  started=$(date +%s.%N)
  for lang in en fr; do cat "$TEXT/dev.tok.tc.$lang" "$TEXT/test.tok.tc.$lang" > "$WORK/nmt.$lang"; done
  { nmt_cli train "$WORK/nmt.en" "$WORK/nmt.fr" "$WORK/nmt.pt" --device "$DEVICE" --valid-lines 40 $NMT_TRAIN \
    && head -n "$NMT_SOURCES" "$WORK/nmt.en" > "$WORK/nmt.src" \
    && nmt_cli translate "$WORK/nmt.pt" "$WORK/nmt.src" "$WORK/nmt.out" --device "$DEVICE" --nbest 5 \
    && nmt_cli nbest "$WORK/nmt.pt" "$WORK/nmt.src" "$WORK/nmt.out" "$WORK/nmt.scored" --name NMT1 --device "$DEVICE"; } \
    >> "$OUT/nmt.log" 2>&1 || failed nmt
  note "nmt commands on $DEVICE: train, translate --nbest 5, nbest in $(since "$started") s;" \
    "$(wc -l < "$WORK/nmt.scored" 2> /dev/null || echo 0) n-best lines scored"
else
  note "nmt commands: no fixture text in $TEXT; skipped"
fi
note "nmt: $(grep -Ei 'units/s|hypotheses/s' "$OUT/nmt.log" | tr '\n' ' ')"

# 6. Identity: a rerun, and a run killed after two durable chunks then resumed, against the first.
same() {  # same FIRST OTHER WHAT: "WHAT: byte-identical", or what differs: lines, members, or members' bytes
  (cd "$REPO" && PYTHONPATH="$REPO/tests" "$PYTHON" - "$1" "$2" "$3") <<'EOF'
import sys
from pathlib import Path
from tests.rescore_runs import assert_same_output, gzip_members  # the tests' definition of the same output

first, other = (Path(p).read_bytes() for p in sys.argv[1:3])
try:
    assert_same_output(other, first)
except AssertionError as e:
    odd = ""
    if "compressed differently" in str(e):
        a, b = gzip_members(first), gzip_members(other)
        differ = [(i, len(x), len(y)) for i, ((x, _), (y, _)) in enumerate(zip(a, b)) if x != y]
        odd = f"; {len(differ)} of {len(a)} members encoded differently: {differ[:5]}"
    print(f"{sys.argv[3]}: NOT the same output: {e}{odd}")
else:
    print(f"{sys.argv[3]}: byte-identical")
EOF
}
first=$(echo "$E2E_PRECISIONS" | awk '{print $NF}')
{
  (e2e "$first" "$WORK/again.gz")
  same "$WORK/e2e.$first.gz" "$WORK/again.gz" rerun
  (e2e "$first" "$WORK/killed.gz") & run=$!
  progress="$WORK/.killed.gz.progress.json"
  until [ -f "$progress" ] && "$PYTHON" -c 'import json,sys; sys.exit(json.load(open(sys.argv[1]))["chunks_done"] < 2)' "$progress" 2> /dev/null; do
    kill -0 "$run" 2> /dev/null || break
    sleep 0.05
  done
  if kill -9 "$run" 2> /dev/null; then
    wait "$run" 2> /dev/null || true
    echo "killed after $("$PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1]))["chunks_done"])' "$progress") chunks"
    (e2e "$first" "$WORK/killed.gz" --resume)
  else
    echo "the run finished before it could be killed: no resume measured"
  fi
  same "$WORK/e2e.$first.gz" "$WORK/killed.gz" "kill + --resume"
} > "$OUT/identity.log" 2>&1
note "identity ($first): $(grep -c 'byte-identical' "$OUT/identity.log") of 2 byte-identical"
note "gpu_suite: done $(date -u +%FT%TZ), $failures failed step(s)"
[ "$failures" = 0 ]
