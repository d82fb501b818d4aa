#!/usr/bin/env bash
# Session 3's forward-time micro benchmarks (after scripts/session3_runs.sh; quiet machine).
set -u
P=.venv/bin/python
# its table, with the command as a header: benchmarks/micro/kernels-float32.md
$P -m racer.bench.kernels --dtype float32 --repeats 20 --sizes 1,2,3,4,6,8,12,16,24
$P -m racer.bench.attention --context 1500 > benchmarks/micro/attention-ctx1500.md
$P -m racer.bench.attention --context 300 > benchmarks/micro/attention-ctx300.md
