#!/usr/bin/env bash
# Regenerates, on this machine, every benchmark run and micro-benchmark that the README and
# docs/PERFORMANCE.md cite. Each lands in benchmarks/ under a name that says what it is:
# MODEL-DATA-DTYPE-CPUKIND-DATE (CPU kind: avx512bf16 where the CPU has AVX512-BF16, else avx2;
# the dtype is the fast one there: bfloat16 with AVX512-BF16, float32 on AVX2 alone).
#
#   scripts/benchmarks.sh                 # everything (about 3 hours on a 2-core CPU)
#   scripts/benchmarks.sh micro smollm2   # some groups: micro, smollm2, sweep, gemma3
#   scripts/benchmarks.sh float32         # SmolLM2 in float32 with the prompt-lookup comparison's methods (not a default group)
#   SPEC_PER_CATEGORY=5 SPEC_MAX_NEW=128 scripts/benchmarks.sh smollm2   # a smaller Spec-Bench run (named specbench5)
#
# (The earlier runs without "sizecap" in their names were made by the same groups before the size cap.)
# On a 2-core AVX2 CPU (float32 forwards cost about 3x the AVX512-BF16 bfloat16 ones) the SmolLM2
# runs the docs cite were made by the float32 group (about 95 minutes there), Gemma 3's with
# SPEC_PER_CATEGORY=5 SPEC_MAX_NEW=128 GEMMA_SPEC_MAX_NEW=64.
#
# Timings need the whole machine: run nothing else meanwhile. Spec-Bench's questions come from
# $SPEC_BENCH (default ../shared/data/spec_bench.jsonl).
set -euo pipefail
cd "$(dirname "$0")/.."
P=${PYTHON:-.venv/bin/python}
SPEC=${SPEC_BENCH:-../shared/data/spec_bench.jsonl}
PER=${SPEC_PER_CATEGORY:-10}          # Spec-Bench questions per category (SmolLM2)
SPEC_NEW=${SPEC_MAX_NEW:-256}          # new tokens per Spec-Bench question (SmolLM2)
GEMMA_NEW=${GEMMA_SPEC_MAX_NEW:-128}   # new tokens per Spec-Bench question (Gemma 3)
if grep -q avx512_bf16 /proc/cpuinfo; then CPU=avx512bf16; DT=bfloat16; else CPU=avx2; DT=float32; fi
DATE=$(date -u +%F)
GROUPS_WANTED=${*:-micro smollm2 sweep gemma3}
want() { [[ " $GROUPS_WANTED " == *" $1 "* ]]; }

bench() {  # bench NAME ARGS...: one interleaved run, then its plots
  local name=$1; shift
  echo "== $name" >&2
  $P -m racer.bench --turns first --no-progress --capacity auto "$@" --out "benchmarks/$name"
  $P -m visuals.bench_figures "benchmarks/$name" --no-images
}

micro() {  # micro NAME MODULE ARGS...: a markdown table under benchmarks/micro, its command first
  local name=$1 module=$2; shift 2
  echo "== micro/$name" >&2
  mkdir -p benchmarks/micro
  { echo "Command: \`python -m $module $*\` ($CPU CPU, $DATE)"; echo; $P -m "$module" "$@"; } \
    > "benchmarks/micro/$name-$CPU-$DATE.md"
}

fresh_curve() {  # the cost curve that sizes trees, measured now on the quiet machine (not one cached under load)
  $P -c "import sys; from racer import load_model; from racer.costcurve import get_cost_curve; \
c = get_cost_curve(load_model(sys.argv[1], dtype=sys.argv[2]), remeasure=True); print(sys.argv[1], c.table(512))" "$1" "$2"
}

if want micro; then
  # Whole verify forward per kernel family, each against PyTorch's own path, interleaved.
  micro "linear-kernels-$DT" racer.kernelbench.linear_kernels --dtype "$DT" --context 300 --repeats 10 --sizes 1,2,4,8,16,32,64
  micro "attention-kernels-$DT" racer.kernelbench.attention_kernels --dtype "$DT" --context 1500 --repeats 8 --sizes 1,2,4,8,16,32
  micro "decoder-layers-$DT" racer.kernelbench.decoder_layers --dtype "$DT" --context 600 --repeats 8 --sizes 1,2,4,8,16,32
  micro "switches-$DT" racer.kernelbench.switches --dtype "$DT" --context 600 --repeats 8 --sizes 1,4,8,16
  micro "huge-pages-$DT" racer.kernelbench.huge_pages --dtype "$DT" --context 300 --repeats 60 --sizes 1,4,8,16
  micro "tree-inputs-$DT" racer.kernelbench.tree_inputs --dtype "$DT" --context 300 --repeats 150 --sizes 2,4,8,12,16
  micro "kv-caches-float32" racer.kernelbench.kv_caches --context 1000 --repeats 8 --sizes 1,2,4,8,16
  micro "dtypes" racer.kernelbench.dtypes --context 300 --repeats 8 --sizes 1,4,8,16,32,64
  # Where a decoding step's time goes, per method.
  micro "profile-$DT" racer.bench.profile --dtype "$DT" --methods ar,tr,racer
fi

if want smollm2 || want sweep; then fresh_curve default "$DT"; fi
if want smollm2; then
  bench "smollm2-135m-specbench$PER-sizecap-$DT-$CPU-$DATE" --dtype "$DT" --data "$SPEC" --per-category "$PER" --round-robin \
    --methods ar,tr,racer,racer@auto-measured,racer-nochain,hf-pld --max-new-tokens "$SPEC_NEW"
  bench "smollm2-135m-shipped-r3-sizecap-$DT-$CPU-$DATE" --dtype "$DT" --data assets/bench_prompts.jsonl --per-category 1 \
    --methods ar,tr,racer,racer@auto-measured,racer-nochain,hf-pld --repeats 3 --max-new-tokens 128
fi

if want sweep; then
  # capacity auto against fixed tree sizes, and racer without its lookup chain (the paper's drafter)
  # or without the copy-logit row probabilities in sizing, all in one interleaved run.
  bench "smollm2-135m-shipped-sweep-$DT-$CPU-$DATE" --dtype "$DT" --data assets/bench_prompts.jsonl --per-category 1 \
    --methods ar,racer,racer-nochain,racer-ranks,racer@4,racer@8,racer@16,racer@32,racer@64,hf-pld --repeats 2 \
    --max-new-tokens 128
fi

if want float32; then
  # float32 with the methods the comparison with prompt lookup names (ar, tr, racer, racer-nochain, hf-pld).
  # On an AVX512-BF16 CPU this is the dtype and the AVX2 kernels an AVX2-only CPU runs, on this CPU; on an
  # AVX2-only CPU it is that CPU's own fast dtype (the whole group about 95 minutes on a 2-core one).
  micro "attention-kernels-float32-ctx300" racer.kernelbench.attention_kernels --dtype float32 --context 300 --repeats 9 --sizes 1,2,4,8,12,16
  micro "attention-kernels-float32" racer.kernelbench.attention_kernels --dtype float32 --context 1500 --repeats 8 --sizes 1,2,4,8,16,32
  fresh_curve default float32
  # Spec-Bench as the bfloat16 group runs it (10 per category, 256 tokens: in float32 about 40 minutes on
  # an AVX512-BF16 CPU, 76 on a 2-core AVX2 one);
  # SPEC_PER_CATEGORY=5 SPEC_MAX_NEW=128 made the smaller specbench5 runs.
  bench "smollm2-135m-specbench$PER-float32-$CPU-$DATE" --dtype float32 --data "$SPEC" --per-category "$PER" --round-robin \
    --methods ar,tr,racer,racer-nochain,hf-pld --max-new-tokens "$SPEC_NEW"
  bench "smollm2-135m-shipped-r3-float32-$CPU-$DATE" --dtype float32 --data assets/bench_prompts.jsonl --per-category 1 \
    --methods ar,tr,racer,racer-nocold,racer-nochain,hf-pld --repeats 3 --max-new-tokens 128
fi

if want gemma3; then
  fresh_curve gemma3-270m "$DT"
  bench "gemma3-270m-shipped-r3-$DT-$CPU-$DATE" --model gemma3-270m --dtype "$DT" --data assets/bench_prompts.jsonl \
    --per-category 1 --methods ar,tr,racer,hf-pld --repeats 3 --max-new-tokens 128
  bench "gemma3-270m-specbench5-$DT-$CPU-$DATE" --model gemma3-270m --dtype "$DT" --data "$SPEC" --per-category 5 \
    --round-robin --methods ar,tr,racer,hf-pld --max-new-tokens "$GEMMA_NEW"
fi

# One shared plotly.min.js for every committed plot page.
$P scripts/share_plotlyjs.py benchmarks
