#!/usr/bin/env bash
# The zoo:scheduler refit protocol (docs/scheduler.md, "Current results"): oracle data and
# evaluation prompts per zoo pair (48 + 144 oracle-trajectory prompts), fit1 on the 48, a
# DAgger round along fit1, fit2 on the 48 and the DAgger data, fit3 on all of it, a second DAgger
# round (144 prompts) along fit3, fit4 on all of it, then replay of the shipped artifact and
# fit1-fit4 on the evaluation prompts; each zoo drafter in turn is the pipeline's strongest.
# The states are those of PIPELINE (default: the default pipeline, `treegraft`; the shipped
# artifact is this recipe's SHORT fit2 on it, 10 minutes on 2 CPU cores). Needs Debian's
# python3-doc (the copy-heavy training prompts).
# Training prompts: training_prompts(seed=0)[0:48] and [176:320] (oracle), [56:104] (DAgger
# along fit1), [320:464] (DAgger along fit3); evaluation [152:176]: disjoint.
#
#   bash benchmarks/scheduler_refit.sh runs/sched      # output folder (default runs/sched)
#   SHORT=1 bash benchmarks/scheduler_refit.sh runs/sched   # only fit1 and fit2 (the oracle 48
#                                                           # and one DAgger round)
#   PIPELINE=treegraft-threshold bash benchmarks/scheduler_refit.sh   # another pipeline's states
#   THREADS=1 bash benchmarks/scheduler_refit.sh   # a machine with one CPU (default: 2 threads)
set -euo pipefail
T=${TREEGRAFT:-.venv/bin/treegraft}
THREADS=${THREADS:-2}  # torch threads of each collect (at most the CPUs this process may use)
P=${PIPELINE:-treegraft}
O=${1:-runs/sched}
SHORT=${SHORT:-0}
date
for d in draft-s draft-m draft-l; do
  $T scheduler collect $P --strong zoo:$d --out $O/$d --prompts 48 --max-new-tokens 48 --threads "$THREADS"
  $T scheduler collect $P --strong zoo:$d --out $O/eval-$d --prompts 24 --skip 152 --costs $O/$d --max-new-tokens 48 --threads "$THREADS"
  if [ "$SHORT" = 0 ]; then
    $T scheduler collect $P --strong zoo:$d --out $O/more-$d --prompts 144 --skip 176 --costs $O/$d --max-new-tokens 48 --threads "$THREADS"
  fi
done
date
$T scheduler fit $O/draft-{s,m,l} --ensemble 5 --out $O/fit1
for d in draft-s draft-m draft-l; do
  $T scheduler collect $P --strong zoo:$d --out $O/follow-$d --prompts 48 --skip 56 --costs $O/$d --follow $O/fit1 --max-new-tokens 48 --threads "$THREADS"
done
$T scheduler fit $O/draft-{s,m,l} $O/follow-draft-{s,m,l} --ensemble 5 --out $O/fit2
if [ "$SHORT" != 0 ]; then
  for d in draft-s draft-m draft-l; do
    for a in zoo:scheduler $O/fit1 $O/fit2; do
      echo "== $d $a"; $T scheduler evaluate $O/eval-$d --artifact $a 2>&1 | tail -12
    done
  done
  date
  exit 0
fi
$T scheduler fit $O/draft-{s,m,l} $O/more-draft-{s,m,l} $O/follow-draft-{s,m,l} --ensemble 5 --out $O/fit3
for d in draft-s draft-m draft-l; do
  $T scheduler collect $P --strong zoo:$d --out $O/follow2-$d --prompts 144 --skip 320 --costs $O/$d --follow $O/fit3 --max-new-tokens 48 --threads "$THREADS"
done
$T scheduler fit $O/draft-{s,m,l} $O/more-draft-{s,m,l} $O/follow-draft-{s,m,l} $O/follow2-draft-{s,m,l} --ensemble 5 --out $O/fit4
date
for d in draft-s draft-m draft-l; do
  for a in zoo:scheduler $O/fit1 $O/fit2 $O/fit3 $O/fit4; do
    echo "== $d $a"; $T scheduler evaluate $O/eval-$d --artifact $a 2>&1 | tail -12
  done
done
date
