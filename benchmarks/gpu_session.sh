#!/usr/bin/env bash
# One device-tool call's worth of GPU checks.  Usage: bash benchmarks/gpu_session.sh STAGE
#   smoke : environment, gpu-marked tests, Triton launch overheads, eval of the bundled example on CUDA, verify
#   tests : the smoke stage without verify
#   verify: cudal1 verify over CUDA-L1's sample
#   bench : the harness benchmark (benchmarks/harness_bench.py)
#   numerics: what the exact-answer rule adds per candidate (harness_bench with --tolerance exact
#            --compare-tolerance strict)
#   chain : the builtin policy's matrix-chain rewrite through optimize (correct, ~60x fewer FLOPs;
#            the old fixed 1e-4 rule rejected it)
#   builtin: the builtin policy over KernelBench (benchmarks/builtin_kernelbench.py $BUILTIN_ARGS;
#            run dir $BUILTIN_DIR, resumable; its store and report are copied to $OUT/builtin)
# Several stages: bash benchmarks/gpu_session.sh "tests builtin"
# Expects KernelBench/CUDA-L1 JSONL copies in .data/ (carried; see docs/benchmarks.md).
# Full logs go to $OUT; a short table is printed last.
set -u
OUT=${OUT:-/tmp/cudal1_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CUDAL1_KERNELBENCH=$PWD/.data/kernelbench.jsonl CUDAL1_CUDA_L1=$PWD/.data/sample.jsonl
export CUDAL1_CACHE_DIR=/tmp/cudal1_cache PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
stages=" ${1:-smoke} "
has() { [[ "$stages" == *" $1 "* ]]; }
summary=()
if has smoke || has tests; then
  { nvidia-smi; python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__, torch.cuda.get_device_name())"; git rev-parse HEAD; } >"$OUT/env.txt" 2>&1
  t0=$SECONDS
  timeout ${GPU_TEST_TIMEOUT:-250} python3 -m pytest tests/gpu -q -rA -p no:cacheprovider >"$OUT/gpu_tests.log" 2>&1
  summary+=("gpu tests: rc=$? $(tail -1 "$OUT/gpu_tests.log") ($((SECONDS-t0)) s)")
  timeout 120 python3 benchmarks/triton_launch_overhead.py >"$OUT/triton_launch_overhead.json" 2>&1
  summary+=("triton launch overhead: $(tail -1 "$OUT/triton_launch_overhead.json" | head -c 300)")
  t0=$SECONDS
  python3 -m cudal1.cli.main eval --device cuda --json --reference examples/tasks/diag_matmul.py --candidate examples/candidates/diag_matmul_broadcast.py >"$OUT/eval_example.log" 2>&1
  summary+=("eval example: $(tail -1 "$OUT/eval_example.log" | head -c 300) ($((SECONDS-t0)) s)")
fi
if has smoke || has verify; then
  t0=$SECONDS
  timeout 330 python3 -m cudal1.cli.main verify .data/sample.jsonl --device cuda --out "$OUT/verify" >"$OUT/verify.log" 2>&1
  summary+=("verify: rc=$? ($((SECONDS-t0)) s)")
  cp "$OUT/verify/verify_report.json" "$OUT/" 2>/dev/null
  tail -32 "$OUT/verify.log"
fi
if has builtin; then
  # The run directory stays out of $OUT (its best/*.py would crowd the 8 files that come back):
  # $OUT/builtin gets the store, the report and state.tgz (tasks.txt, confirm.json, rewrites/).
  # BUILTIN_RESUME: a folder holding an earlier call's $OUT/builtin files (carried): the store
  # is resumed (nothing judged twice) and the graph-rewrite cache reused (no tracing again).
  dir=${BUILTIN_DIR:-/tmp/cudal1_builtin}
  state=/tmp/cudal1_builtin_state
  args=${BUILTIN_ARGS:-kernelbench:level2/1-100 --subset algebraic}
  mkdir -p "$dir" "$CUDAL1_CACHE_DIR" && rm -rf "$state" && mkdir -p "$state"
  if [ -n "${BUILTIN_RESUME:-}" ]; then
    cp "$BUILTIN_RESUME"/cudal1.sqlite "$dir/" 2>/dev/null
    tar xzf "$BUILTIN_RESUME/state.tgz" -C "$state" 2>/dev/null
    cp "$state"/tasks.txt "$state"/confirm.json "$dir/" 2>/dev/null
    [ -d "$state/rewrites" ] && cp -r "$state/rewrites" "$CUDAL1_CACHE_DIR/"
    rm -rf "$state" && mkdir -p "$state"
  fi
  t0=$SECONDS
  timeout ${BUILTIN_TIMEOUT:-400} python3 benchmarks/builtin_kernelbench.py $args --out "$dir" >"$OUT/builtin.log" 2>&1
  rc=$?
  # killed by the timeout or not: report what was judged (closing the store checkpoints its WAL)
  python3 benchmarks/builtin_kernelbench.py $args --out "$dir" --report-only >>"$OUT/builtin.log" 2>&1
  mkdir -p "$OUT/builtin"
  cp "$dir"/cudal1.sqlite "$dir"/report.md "$OUT/builtin/" 2>/dev/null
  cp "$dir"/tasks.txt "$dir"/confirm.json "$state/" 2>/dev/null
  [ -d "$CUDAL1_CACHE_DIR/rewrites" ] && cp -r "$CUDAL1_CACHE_DIR/rewrites" "$state/"
  tar czf "$OUT/builtin/state.tgz" -C "$state" .
  summary+=("builtin: rc=$rc ($((SECONDS-t0)) s) $(head -1 "$dir/report.md" 2>/dev/null)")
  head -16 "$dir/report.md" 2>/dev/null
fi
if has bench; then
  t0=$SECONDS
  timeout 560 python3 benchmarks/harness_bench.py --out "$OUT/bench" ${BENCH_ARGS:-} >"$OUT/bench.log" 2>&1
  summary+=("harness_bench: rc=$? ($((SECONDS-t0)) s)")
  tail -25 "$OUT/bench.log"
fi
if has numerics; then
  t0=$SECONDS
  timeout ${NUMERICS_TIMEOUT:-400} python3 benchmarks/harness_bench.py --out "$OUT/numerics_bench" --tolerance exact \
    --compare-tolerance strict --runs 2 --min-tasks ${NUMERICS_TASKS:-12} --max-pairs ${NUMERICS_PAIRS:-24} >"$OUT/numerics_bench.log" 2>&1
  summary+=("numerics bench: rc=$? ($((SECONDS-t0)) s) $(grep -E '^\(e\)' "$OUT/numerics_bench.log" | head -1)")
  tail -30 "$OUT/numerics_bench.log"
fi
if has chain; then
  t0=$SECONDS
  timeout 200 python3 -m cudal1.cli.main optimize examples/tasks/matmul_chain.py --policy builtin --device cuda --rounds 2 \
    --out "$OUT/chain" --json >"$OUT/chain.log" 2>&1
  summary+=("matmul chain optimize: rc=$? ($((SECONDS-t0)) s) $(tail -1 "$OUT/chain.log" | head -c 400)")
fi
grep -E "passed|failed|PASSED|FAILED|ERROR" "$OUT/gpu_tests.log" 2>/dev/null | tail -40
printf '%s\n' "${summary[@]}"
