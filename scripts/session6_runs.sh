#!/usr/bin/env bash
# Session 6's CPU runs (kernel v2: 12-accumulator tiles for every row count, next-block prefetch, vocabulary projection tiled), one after another: timings need the whole
# machine. Reports under benchmarks/s6-*.
set -u
P=.venv/bin/python
B="$P -m racer.bench --turns first --dtype float32 --no-progress --no-images --capacity auto"
# Measure the cost curve for the new kernel (its key holds the kernel source hash) before any timed decoding.
$P -c "from racer.models import load_model; from racer.costcurve import get_cost_curve; print(get_cost_curve(load_model('default', dtype='float32')))"
# Whole verify forward per kernel (the tiled kernel v2 against oneDNN packed, small-batch and stock).
{ echo "Command: \`python -m racer.bench.kernels --context 300 --repeats 10 --sizes 1,2,3,4,5,6,7,8,12,16\` (session 6, tiled kernel v2)"; echo
  $P -m racer.bench.kernels --context 300 --repeats 10 --sizes 1,2,3,4,5,6,7,8,12,16; } > benchmarks/micro/kernels-tiled-v2-float32.md
# The shipped prompts, each turn timed 3 times interleaved (median), with the best fixed capacity of session 4's sweep.
$B --data assets/bench_prompts.jsonl --per-category 1 --methods ar,tr,racer,hf-pld,racer@8 --repeats 3 \
  --max-new-tokens 128 --out benchmarks/s6-cpu-shipped-r3
# Spec-Bench, 10 questions per category (130), categories in turn so a stopped run stays balanced.
$B --data ../shared/data/spec_bench.jsonl --per-category 10 --round-robin --methods ar,racer,hf-pld,tr \
  --max-new-tokens 256 --out benchmarks/s6-cpu-specbench10
# bfloat16 on the shipped prompts (float32 side: s6-cpu-shipped-r3 above; a separate run, so compare ratios).
${B/float32/bfloat16} --data assets/bench_prompts.jsonl --per-category 1 --methods ar,tr,racer,hf-pld --max-new-tokens 128 \
  --out benchmarks/s6-cpu-shipped-bf16
# After raising TILED_MAX_ROWS to 64 (trees of 17-64 nodes on the tiled kernel too): the cost curve again, the shipped
# prompts timed 3 times, and Spec-Bench 4 per category (52) with ar, racer, hf-pld.
$P -c "from racer.models import load_model; from racer.costcurve import get_cost_curve; print(get_cost_curve(load_model('default', dtype='float32')))"
$B --data assets/bench_prompts.jsonl --per-category 1 --methods ar,tr,racer,hf-pld,racer@8 --repeats 3 \
  --max-new-tokens 128 --out benchmarks/s6-cpu-shipped-r3-rows64
$B --data ../shared/data/spec_bench.jsonl --per-category 4 --round-robin --methods ar,racer,hf-pld \
  --max-new-tokens 256 --out benchmarks/s6-cpu-specbench4-rows64
