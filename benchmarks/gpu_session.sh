#!/usr/bin/env bash
# Every GPU test and measurement of a session with a lent GPU (issues #25, #26), in parts that fit the device tool's
# 10-minute calls. Run from the repository root on the GPU machine, with what the part needs copied into .gpufix/
# (ignored by git) and carried:
#   part1 (carry .gpufix/shared = ../shared/fixtures/parity's A_*, C_* and D_* cases + README/index files, and
#          .gpufix/whl1 = the torchao wheel): the CUDA tests, the fused ops, the 1b backbone (alternating variants)
#   part2 (carry .gpufix/whl2 = PyAV, ezc3d, pygltflib, dataclasses-json, marshmallow 3, deprecated wheels):
#          pose with 6 people, mocap frames/s at 1080p
#   part3 (carry .gpufix/whl1): FP8 through torchao, compiled
# Each step has its own time limit and log and prints progress as it goes; a summary of every table is printed last.
# Logs go to $OUT (or ./gpu-out).
# The first try (2026-11-27, H100, 15 minutes of device time) ran part1 in 475 s and part2 in 245 s with shorter limits
# and finished only the tests and one op row: the step limits below are what the steps need, about 9 + 7 + 3 minutes,
# more than one session's 15 minutes: run the parts a session's time allows, in this order.
#   bash benchmarks/gpu_session.sh prepare      # here, before the first call: fills .gpufix/ (needs pip's registry)
#   bash benchmarks/gpu_session.sh part1        # there, through the device tool
set -u
PART=${1:-part1}
if [ "$PART" = prepare ]; then
  shared=${SAPIENS2_SHARED:-$(dirname "$PWD")/shared}
  mkdir -p .gpufix/shared/fixtures/parity .gpufix/whl1 .gpufix/whl2
  cp "$shared/README.md" .gpufix/shared/
  (cd "$shared/fixtures/parity" && cp -r A_backbone_bf16rope A_backbone_fp32rope C_seg C_normal C_pointmap C_albedo \
    C_pose D_seg_e2e D_normal_e2e D_pose_e2e D_pointmap_e2e D_albedo_e2e README.md cross_cpu.json index.json \
    "$OLDPWD/.gpufix/shared/fixtures/parity/")
  platforms=""
  for n in 17 24 27 28 31 34 35; do platforms="$platforms --platform manylinux_2_${n}_x86_64"; done
  get() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    $platforms --platform manylinux2014_x86_64 -d "$@"; }
  get .gpufix/whl1 torchao==0.17.0  # a torchao built for the device's torch (2.11 there in 2026-11)
  get .gpufix/whl2 av==18.1.0 ezc3d==1.7.2 pygltflib==1.16.5 dataclasses-json==0.6.7 "marshmallow<4" deprecated
  du -sh .gpufix/*
  exit 0
fi
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:/tmp/site SAPIENS2_SHARED=$PWD/.gpufix/shared
WHEELS=.gpufix/whl1
[ "$PART" = part2 ] && WHEELS=.gpufix/whl2
if ls $WHEELS/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    $WHEELS/*.whl >"$OUT/pip.log" 2>&1 || echo "wheel install failed (see pip.log)"
fi

step() {  # step NAME SECONDS COMMAND...: run with a limit, log to $OUT/NAME.log
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout --signal=INT --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc=$rc, $((SECONDS - start)) s" | tee -a "$OUT/steps.log"
}

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, \
'cudnn', torch.backends.cudnn.version())"
  python3 -c "import transformers; print('transformers', transformers.__version__)"
  lscpu | grep 'Model name'
} >"$OUT/machine.log" 2>&1
cat "$OUT/machine.log"

if [ "$PART" = part1 ]; then
  step tests 150 python3 -m pytest -q -p no:cacheprovider tests/test_fused_kernels.py \
    tests/test_fast_agreement.py tests/test_predictor_e2e.py tests/test_fast_mode.py -k cuda
  step ops 90 python3 benchmarks/fused_kernels.py --only ops --rounds 5 --iters 20
  step backbone 300 python3 benchmarks/bench_fast.py --device cuda --arch sapiens2_1b --resolution 1024 768 \
    --batch 8 --bf16 --compile --fused --no-official --no-fp32 --repeats 5 --warmup 2
elif [ "$PART" = part2 ]; then
  step pose 200 python3 benchmarks/bench_fast.py --device cuda --arch sapiens2_1b --resolution 1024 768 \
    --pose-people 6 --bf16 --compile --fused --no-official --no-fp32 --repeats 5
  step mocap 220 python3 benchmarks/mocap_fps.py --device cuda --archs sapiens2_0.4b sapiens2_1b --people 1 3 \
    --frames 48
else
  step fp8 170 python3 -m sapiens2 benchmark --model 1b --batch-size 8 --dtype bf16 --compile --quantize fp8 \
    --iters 10 --warmup 2
fi

echo "######## summary ($PART)"
for log in "$OUT"/*.log; do
  case $log in */pip.log | */machine.log | */steps.log) continue ;; esac
  echo "--- $(basename "$log")"
  grep -E '^\||passed|failed|error|Error|MFU|TFLOP|p50|warm-up|scenes' "$log" | tail -25
done
cat "$OUT/steps.log"
