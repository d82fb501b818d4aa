#!/usr/bin/env bash
# Session 9: racer's decoder-layer forward (racer/fastlayer.py). Same machine as session 8 (2-core EPYC
# with AVX512-BF16). One after another: timings need the whole machine.
set -u
P=.venv/bin/python
B="$P -m racer.bench --turns first --no-progress --no-images --capacity auto"
# The cost curve for the new forward, before any timed decoding.
$P -c "from racer.models import load_model; from racer.costcurve import get_cost_curve; print(get_cost_curve(load_model('default')))"
# Whole verify forward, module path against the fast layer forward, both dtypes.
for dt in bfloat16 float32; do
  { echo "Command: \`python -m racer.bench.layers --dtype $dt --context 600 --repeats 8 --sizes 1,2,4,8,16,32\` (session 9, AVX512-BF16 CPU)"; echo
    $P -m racer.bench.layers --dtype $dt --context 600 --repeats 8 --sizes 1,2,4,8,16,32; } > benchmarks/micro/layers-$dt-ctx600-s9.md
done
# Where a step's time goes now.
{ echo "Command: \`python -m racer.bench.profile --methods ar,tr,racer\` (session 9, AVX512-BF16 CPU)"; echo
  $P -m racer.bench.profile --methods ar,tr,racer; } > benchmarks/micro/profile-bfloat16-s9.md
# Spec-Bench, 10 questions per category (130), categories in turn.
$B --data ../shared/data/spec_bench.jsonl --per-category 10 --round-robin --methods ar,tr,racer,hf-pld \
  --max-new-tokens 256 --out benchmarks/s9-cpu-specbench10
# The shipped prompts, each turn timed 3 times interleaved (median).
$B --data assets/bench_prompts.jsonl --per-category 1 --methods ar,tr,racer,hf-pld --repeats 3 \
  --max-new-tokens 128 --out benchmarks/s9-cpu-shipped-r3
# Fixed capacities against auto in one interleaved run (method@capacity), each turn timed twice.
$B --data assets/bench_prompts.jsonl --per-category 1 --methods ar,racer,racer@4,racer@8,racer@16,racer@32,racer@64,hf-pld \
  --repeats 2 --max-new-tokens 128 --out benchmarks/s9-cpu-shipped-sweep
# float32 on the same machine.
$B --dtype float32 --data assets/bench_prompts.jsonl --per-category 1 --methods ar,racer,hf-pld --repeats 3 \
  --max-new-tokens 128 --out benchmarks/s9-cpu-shipped-fp32
