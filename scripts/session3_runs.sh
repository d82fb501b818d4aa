#!/usr/bin/env bash
# Session 3's CPU runs (oneDNN packed kernel, GQA tree attention, lookup chain, burst-aware
# sizing), one after another: timings need the whole machine. Reports under benchmarks/s3-*.
set -u
B=".venv/bin/python -m racer.bench --turns first --dtype float32 --no-progress --no-images --capacity auto"
SB=../shared/data/spec_bench.jsonl
M=ar,pld,tr,racer,hf,hf-pld,hf-pld-stock
$B --data assets/bench_prompts.jsonl --per-category 1 --methods ar,pld,tr,racer,racer-nochain,hf,hf-pld,hf-pld-stock \
  --max-new-tokens 128 --out benchmarks/s3-cpu-shipped
$B --data $SB --per-category 2 --methods $M --max-new-tokens 256 --out benchmarks/s3-cpu-specbench
$B --data ../shared/data/human_eval.jsonl --limit 10 --methods $M --max-new-tokens 256 --out benchmarks/s3-cpu-humaneval
$B --data ../shared/data/mgsm.jsonl --limit 10 --methods $M --max-new-tokens 256 --out benchmarks/s3-cpu-mgsm
# The shipped set again, each turn timed 3 times interleaved (median): single timings on this
# shared machine swung +-25 % between slots of one question in the first shipped run above.
$B --data assets/bench_prompts.jsonl --per-category 1 --methods ar,tr,racer,hf-pld --repeats 3 \
  --max-new-tokens 128 --out benchmarks/s3-cpu-shipped-r3
