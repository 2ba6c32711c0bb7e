#!/usr/bin/env bash
# Regenerate the mini-world benchmark tables in figures/benchmark/ (issue 4, item 7).
#
#   bash benchmarks/mini_world.sh            # every suite, expert seeds 0 1 2
#   SEEDS="0" SUITES="tasks8" bash benchmarks/mini_world.sh
#
# Builds what the zoo cache lacks (20 experts per seed at size small from the shipped base:
# ~30 min per seed on 2 CPU cores), then merges with every method, chooses each coefficient
# on 100 validation images per task (grid with patience 3, as the Iso code, golden section for ESM) and
# reports test accuracy on 500 test images per task. Results: <suite>_small_seed<k>_*.csv/json
# and <suite>_small_seeds.csv (mean, sd, min, max over seeds); wudi_step_size_<suite>_small_seed<first>.csv.
set -euo pipefail
cd "$(dirname "$0")/.."
SEEDS=${SEEDS:-"0 1 2"}
SUITES=${SUITES:-"tasks8 tasks14 tasks20"}
THREADS=${THREADS:-2}
for seed in $SEEDS; do
  python3 -m acetools zoo build --suite tasks20 --size small --seeds "$seed" --no-mtl --threads "$THREADS"
done
for suite in $SUITES; do
  for seed in $SEEDS; do
    python3 -m acetools bench --suite "$suite" --size small --seeds "$seed" --no-mtl --threads "$THREADS" \
      --patience 3 --n-val 100 --n-test 500 --ace-scaled --variants --out figures/benchmark
  done
done
# WUDI's step-size study (README, "The misses"): the first seed only
first=${SEEDS%% *}
for suite in $SUITES; do
  python3 benchmarks/wudi_step_size.py --suite "$suite" --size small --seed "$first" --threads "$THREADS" \
    --lrs 1e-5 1e-4 1e-3 3e-3 --n-val 100 --n-test 500 --out figures/benchmark
done
