#!/usr/bin/env bash
# Every GPU figure of issue #38 in one run of at most 8 minutes on any CUDA machine, most important first:
#   1 tests     the CUDA agreement tests (fused kernels, fast mode, predictor, low precision)
#   2 backbone  1b bf16 batch 8 at 1024x768: eager, then compiled without and with the fused kernels (MFU), and
#               transformers' port where installed; its last line decides FUSED_KERNELS_ON_CUDA (models/fast.py)
#   3 pose      pose with 6 people on a 1080p image: fast bf16 (with and without the fused kernels) vs bf16 reference
#   4 mocap     mocap frames/s, 0.4b and 1b, 1080p, 1 and 3 people
#   5 fp8       FP8 (torchao) compiled, 1b batch 8 (against step 2's "compiled, without fused ops")
#   6 fp8-accuracy  FP8 against bf16 on the parity cases (D_seg/normal/pose_e2e)
#   7 ops       each fused op alone against Inductor's fusion of the same work
# Networks have random weights of the real architectures (the GPU machine cannot download the released ones; speed
# does not depend on the values). No max-autotune anywhere: compiles use CompiledBuckets' default mode.
#
# Each step runs under its own `timeout`, its log goes to $OUT/NN-STEP.log as it runs, its tables and decision lines
# to $OUT/NN-STEP.md when it ends, and both are appended to the running summary $OUT/summary.md at once. A global
# guard (GPU_SESSION_BUDGET_S, default 470 s from the start) gives each step at most what is left, and skips a step
# when less than its minimum is left, recording the skip and the command that runs the skipped steps later.
#
# Usage (from the repository root):
#   bash benchmarks/gpu_session.sh prepare         # here, once: fills .gpufix/ (fixtures, wheels; needs pip's registry)
#   then through the device tool, two calls (one call carries at most 64 MiB):
#     1. carry [".gpufix/whl2"], command "true"   (PyAV & co., ~37 MB: ignored build outputs stay for the next call)
#     2. carry [".gpufix/shared", ".gpufix/whl1"], command "bash benchmarks/gpu_session.sh", timeout_s 540
#   bash benchmarks/gpu_session.sh --steps fp8,ops # only these steps (e.g. the ones a run skipped)
#   bash benchmarks/gpu_session.sh --device cpu --tiny   # dry run on a CPU: tiny models, same control flow
set -u
DEVICE=cuda TINY=0 STEPS=all FLAGS=""
while [ $# -gt 0 ]; do
  case $1 in
    prepare) MODE=prepare ;;
    --device) DEVICE=$2; FLAGS="$FLAGS --device $2"; shift ;;
    --tiny) TINY=1; FLAGS="$FLAGS --tiny" ;;
    --steps) STEPS=$2; shift ;;
    *) echo "gpu_session.sh: unknown argument $1 (prepare, --device D, --tiny, --steps a,b)" >&2; exit 2 ;;
  esac
  shift
done
if [ "${MODE:-run}" = prepare ]; then
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
BUDGET=${GPU_SESSION_BUDGET_S:-470}
mkdir -p "$OUT"
SUMMARY=$OUT/summary.md
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
[ -d .gpufix/shared ] && export SAPIENS2_SHARED=$PWD/.gpufix/shared
PY=${GPU_SESSION_PYTHON:-python3}
for wheels in .gpufix/whl1 .gpufix/whl2; do
  if ls $wheels/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      $wheels/*.whl >>"$OUT/pip.log" 2>&1 || echo "wheel install from $wheels failed (see pip.log)"
  fi
done

{
  echo "# GPU session $(date -u '+%Y-%m-%d %H:%M UTC'): device $DEVICE$([ $TINY = 1 ] && echo ', tiny dry run'), budget $BUDGET s"
  echo
  echo '```'
  [ "$DEVICE" = cpu ] || nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', \
torch.backends.cudnn.version())"
  $PY -c "import triton; print('triton', triton.__version__)" 2>&1 | tail -1
  $PY -c "import transformers; print('transformers', transformers.__version__)" 2>&1 | tail -1
  lscpu | grep 'Model name'
  echo '```'
} >"$SUMMARY" 2>&1
cat "$SUMMARY"

NUMBER=0 SKIPPED=""
step() {  # step NAME LIMIT_S MIN_S COMMAND...: run under min(LIMIT, budget left), or record that it was skipped
  local name=$1 limit=$2 least=$3
  shift 3
  NUMBER=$((NUMBER + 1))
  case ",$STEPS," in ,all, | *",$name,"*) ;; *) return ;; esac
  local file="$OUT/$(printf %02d $NUMBER)-$name" left=$((BUDGET - SECONDS))
  if [ "$left" -lt "$least" ]; then
    SKIPPED="$SKIPPED${SKIPPED:+,}$name"
    printf '\n## %s: skipped (%d s of the budget left, it needs %d)\n' "$name" "$left" "$least" | tee -a "$SUMMARY"
    return
  fi
  [ "$left" -lt "$limit" ] && limit=$left
  local start=$SECONDS
  echo "== $name (limit $limit s): $*" >"$file.log"
  timeout --signal=INT --kill-after=10 "$limit" "$@" >>"$file.log" 2>&1
  local rc=$?
  local verdict="rc $rc"
  [ $rc = 124 ] || [ $rc = 137 ] && verdict="cut at its $limit s limit (rc $rc)"
  {
    printf '\n## %s: %s, %d s\n\n' "$name" "$verdict" "$((SECONDS - start))"
    grep -E '^\||^###|^decision|^backbone|^pose|^mocap|^sapiens2 benchmark|^precision|^images/s|^latency|^MFU|'\
'^achieved|^peak memory|^compiled|^warm-up|^transformers|^FAILED|^ERROR| in [0-9.]+s|Error' "$file.log" |
      grep -vE '^[WIE][0-9]{4} |warning:' | tail -40
  } >"$file.md"
  cat "$file.md" | tee -a "$SUMMARY"
}

if [ $TINY = 1 ]; then  # the same steps on tiny models and short runs: a check of the control flow, no figures
  ARCH1B=tiny SIZE="64 48" BATCH=2 FRAMES=6 ARCHS=tiny TINYFLAG=--tiny LOWP=int8-weight DTYPE=fp32
  BENCH_MODEL="--model 0.1b --input-size 64 48 --batch-size 2" COMPILE="" ITERS="--rounds 1 --iters 1"
else
  ARCH1B=sapiens2_1b SIZE="1024 768" BATCH=8 FRAMES=32 ARCHS="sapiens2_0.4b sapiens2_1b" TINYFLAG="" LOWP=fp8
  DTYPE=bf16 BENCH_MODEL="--model 1b --batch-size 8" COMPILE=--compile ITERS="--rounds 3 --iters 5"
fi

step tests 75 20 $PY -m pytest -q -p no:cacheprovider tests/test_fused_kernels.py tests/test_fast_agreement.py \
  tests/test_predictor_e2e.py tests/test_fast_mode.py tests/test_lowp.py -k cuda
step backbone 200 90 $PY benchmarks/fused_kernels.py --device "$DEVICE" --only model $TINYFLAG --batch $BATCH $ITERS \
  --transformers
step pose 70 30 $PY benchmarks/bench_fast.py --device "$DEVICE" --arch $ARCH1B --resolution $SIZE --pose-people 6 \
  --bf16 --fused --no-official --no-fp32 --repeats 3
step mocap 110 40 $PY benchmarks/mocap_fps.py --device "$DEVICE" --archs $ARCHS --people 1 3 --frames $FRAMES
step fp8 130 60 $PY -m sapiens2 benchmark --device "$DEVICE" $BENCH_MODEL --dtype $DTYPE $COMPILE --quantize $LOWP \
  --iters 10 --warmup 2
step fp8-accuracy 40 15 $PY benchmarks/bench_lowp.py --device "$DEVICE" --kinds $LOWP
step ops 60 30 $PY benchmarks/fused_kernels.py --device "$DEVICE" --only ops $TINYFLAG $ITERS

{
  printf '\n## end: %d s of the %d s budget\n' "$SECONDS" "$BUDGET"
  [ -n "$SKIPPED" ] && echo "skipped: $SKIPPED; run them next with: bash benchmarks/gpu_session.sh$FLAGS --steps $SKIPPED"
  echo "FUSED_KERNELS_ON_CUDA: on if the tests step passed and the backbone's decision line says faster"
} | tee -a "$SUMMARY"
