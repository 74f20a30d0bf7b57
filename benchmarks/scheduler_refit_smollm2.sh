#!/usr/bin/env bash
# Refit the distilled scheduler for the SmolLM2 pair (zoo:smollm2 + zoo:smollm2-draft-l, head 4096,
# chat template), the recipe of benchmarks/scheduler_refit.sh for one pair: label training prompts
# with the value system, fit, a DAgger round along the fit, fit on both; evaluate the shipped
# zoo:scheduler and both fits on a disjoint set in replay. About an hour on 2 CPU cores; run it on
# an otherwise idle machine (collect measures the costs in its first seconds).
#
#   bash benchmarks/scheduler_refit_smollm2.sh runs/sched-smollm2
set -euo pipefail
T=${TREEGRAFT:-.venv/bin/treegraft}
THREADS=${THREADS:-2}  # torch threads of each collect (at most the CPUs this process may use)
O=${1:-runs/sched-smollm2}
P=benchmarks/smollm2-collect.yaml
date
$T scheduler collect $P --out $O/train --prompts 48 --max-new-tokens 96 --threads "$THREADS" --no-progress
$T scheduler collect $P --out $O/eval --prompts 16 --skip 152 --costs $O/train --max-new-tokens 96 --threads "$THREADS" --no-progress
$T scheduler fit $O/train --ensemble 5 --out $O/fit1
$T scheduler collect $P --out $O/follow --prompts 48 --skip 56 --costs $O/train --follow $O/fit1 --max-new-tokens 96 --threads "$THREADS" --no-progress
$T scheduler fit $O/train $O/follow --ensemble 5 --out $O/fit2
date
for a in zoo:scheduler $O/fit1 $O/fit2; do
  echo "== $a"; $T scheduler evaluate $O/eval --artifact $a 2>&1 | tail -12
done
date
