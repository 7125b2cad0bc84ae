#!/usr/bin/env bash
# GPU checks in named stages, each sized to a few minutes.  Usage: bash benchmarks/gpu_checks.sh STAGE
#   smoke : environment, the gpu-marked tests (pytest -m gpu), Triton launch overheads, eval of the bundled example on CUDA, verify
#   tests : the smoke stage without verify
#   verify: cudal1 verify over CUDA-L1's sample
#   bench : the harness benchmark (benchmarks/harness_bench.py)
#   numerics: what the exact-answer rule adds per candidate (harness_bench with --tolerance exact
#            --compare-tolerance strict)
#   chain : the builtin policy's matrix-chain rewrite through optimize (correct, 32.5x fewer FLOPs
#            by the pass's own count; the old fixed 1e-4 rule rejected it)
#   trust : the timer's and the clean window's GPU tests, the GPU corpus (the cheats included), the
#           timer ladder (with the window's figures) and verify over the 18 anchor records (~7 min)
#   corpus: the first part of trust alone: the timer's and window's GPU tests and the GPU corpus,
#           every verdict in $OUT/results.tgz (~4 min)
#   timer : benchmarks/timer_ladder.py: the judge's GPU figure against the profiler's kernel time
#           from 256 K to 64 M elements, and a 2x faster kernel's reading (~2 min)
#   builtin: the builtin policy over KernelBench against every torch.compile mode
#            (benchmarks/builtin_kernelbench.py $BUILTIN_ARGS; run dir $BUILTIN_DIR, resumable; the
#            pack comes back as $OUT/builtin_state.tgz)
#   train : multi-GPU training (two GPUs): (a) torchrun --nproc_per_node 2 GRPO smoke
#           (NCCL), (b) accelerate launch (DDP config, 2 processes) SFT smoke, (c) benchmarks/train_gpu.py
#           (GRPO whose rollouts include CUDA and Triton programs judged on the GPU).  trl, datasets,
#           dill, multiprocess come from the wheels in .data/wheels (copied there for a machine without network).  Run dirs stay in
#           $TRAIN_DIR; $OUT gets 3 logs and train_gpu.json.  ~5-6 min.  No DeepSpeed there: no ZeRO.
#           TRAIN_PARTS picks parts (default "a b c").
#   host_load: benchmarks/host_load.py: launch-bound release records timed quiet, under CPU load,
#            and quiet again (~2.5 min on one GPU)
#   release: the whole CUDA-L1 H100 release through verify, fresh caches, 2 workers per GPU
#            (benchmarks/throughput.py --release; $RELEASE_ARGS adds flags; ~4-5 min on x2)
#   reward: benchmarks/reward_loop.py: one GRPO step of 64 rollouts with real answers (1.5B-shaped
#           policy, random weights; CUDA-L1 kernels built and judged on the GPU); trl, datasets, dill,
#           multiprocess from .data/wheels as for train; $REWARD_ARGS adds flags (~4-6 min)
#   mixed : the mixed set of benchmarks/throughput.py at $MIXED_WORKERS build processes (default 1),
#           second pass $MIXED_SECOND (default none), stopped at $MIXED_DEADLINE s (default 440);
#           throughput.json and a tarball of the logs come back
#   compile_lease: compiling off the GPU's lease (EvalConfig.compile_off_lease: torch.compile's and
#            Triton's): tests/gpu/test_compile_lease_gpu.py (under torch.profiler, no GPU work outside
#            Inductor's bracketed steps nor inside an autotuning compile's CPU steps, a Triton
#            autotuner's timings alone; compiles judged ok beside other workers), the lease tests, then
#            benchmarks/compile_lease_ab.py (held against released, 3 workers, $AB_SELECTORS; $AB_ARGS
#            adds flags, e.g. "--arms released,autotune-held --baseline-modes compile-max-autotune-no-cudagraphs";
#            ab.json comes back) (~7-9 min)
#   profiles: measured profiles (--profile): tests/gpu/test_profiles_gpu.py, judge --profile of the
#            bundled example, and benchmarks/profile_cost.py (median extra seconds per profiled
#            verdict; budget 0.5 s) (~4-6 min)
#   bigio : the judge on gigabyte inputs and outputs: benchmarks/slot_copy.py (the window's steps in
#           own memory against a slot opened by IPC handle), then the compile-default baselines of
#           level1/38 (8.6 GB in and out) and level1/63 (8.5 GB out) with their window figures (~2 min)
# Several stages: bash benchmarks/gpu_checks.sh "tests builtin"
# Expects KernelBench/CUDA-L1 JSONL copies in .data/ (copied there; see docs/contributing.md, GPU checks).
# Full logs go to $OUT; a short table is printed last.
set -u
OUT=${OUT:-/tmp/cudal1_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CUDAL1_KERNELBENCH=$PWD/.data/kernelbench.jsonl CUDAL1_CUDA_L1=$PWD/.data/sample.jsonl
export CUDAL1_CACHE_DIR=/tmp/cudal1_cache PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
stages=" ${1:-smoke} "
has() { [[ "$stages" == *" $1 "* ]]; }
# trl, datasets, dill and multiprocess from .data/wheels into DIR/site where this Python lacks them
# (the GPU image has no network); the stages that train call it with their run directory and a label
training_wheels() {
  python3 -c "import trl, datasets" 2>/dev/null && return
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1/site" \
    .data/wheels/*.whl >"$1/wheels.log" 2>&1 || { tail -5 "$1/wheels.log"; summary+=("$2: wheel install failed"); }
  export PYTHONPATH=$1/site:$PYTHONPATH
}
summary=()
if has smoke || has tests; then
  { nvidia-smi; python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__, torch.cuda.get_device_name())"; git rev-parse HEAD; } >"$OUT/env.txt" 2>&1
  t0=$SECONDS
  timeout ${GPU_TEST_TIMEOUT:-300} python3 -m pytest -m gpu -q -rA -p no:cacheprovider >"$OUT/gpu_tests.log" 2>&1
  summary+=("gpu tests: rc=$? $(tail -1 "$OUT/gpu_tests.log") ($((SECONDS-t0)) s)")
  timeout 120 python3 benchmarks/triton_launch_overhead.py >"$OUT/triton_launch_overhead.json" 2>&1
  summary+=("triton launch overhead: $(tail -1 "$OUT/triton_launch_overhead.json" | head -c 300)")
  t0=$SECONDS
  python3 -m cudal1.cli.main judge --device cuda --json --reference examples/tasks/diag_matmul.py --candidate examples/candidates/diag_matmul_broadcast.py >"$OUT/eval_example.log" 2>&1
  summary+=("eval example: $(tail -1 "$OUT/eval_example.log" | head -c 300) ($((SECONDS-t0)) s)")
fi
if has trust || has corpus; then
  # the judge's trust checks: the timer's and the clean window's kernels, the GPU corpus (cheats
  # included), then (trust) the ladder with the window's figures, and verify over the 18 anchor records
  { nvidia-smi; python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__, torch.cuda.get_device_name())"; python3 -c "import pynvml; print('nvidia-ml-py', pynvml.__version__ if hasattr(pynvml, '__version__') else 'present')"; git rev-parse HEAD; } >"$OUT/env.txt" 2>&1
  t0=$SECONDS
  mkdir -p "$OUT/results"
  CUDAL1_GPU_TEST_OUT="$OUT/results" timeout ${TRUST_TEST_TIMEOUT:-330} python3 -m pytest -q -rA -p no:cacheprovider \
    tests/gpu/test_timer_gpu.py tests/gpu/test_gpu_harness.py >"$OUT/trust_tests.log" 2>&1
  summary+=("trust tests: rc=$? $(tail -1 "$OUT/trust_tests.log") ($((SECONDS-t0)) s)")
  tar -czf "$OUT/results.tgz" -C "$OUT" results && rm -rf "$OUT/results"
fi
if has trust; then
  t0=$SECONDS
  timeout ${TIMER_TIMEOUT:-200} python3 benchmarks/timer_ladder.py --runs 2 --json "$OUT/timer_ladder.json" >"$OUT/timer_ladder.log" 2>&1
  summary+=("timer ladder: rc=$? ($((SECONDS-t0)) s)")
  tail -20 "$OUT/timer_ladder.log"
  t0=$SECONDS
  timeout ${ANCHORS_TIMEOUT:-150} python3 benchmarks/verify_anchors.py .data/h100.jsonl --out "$OUT/anchors" >"$OUT/anchors.log" 2>&1
  summary+=("verify anchors: rc=$? $(grep verify_anchors: "$OUT/anchors.log") ($((SECONDS-t0)) s)")
  tar -czf "$OUT/anchors.tgz" -C "$OUT" anchors && rm -rf "$OUT/anchors"
fi
if has compile_lease; then
  git rev-parse HEAD >"$OUT/env.txt" 2>&1
  t0=$SECONDS
  mkdir -p "$OUT/results"
  CUDAL1_GPU_TEST_OUT="$OUT/results" timeout ${LEASE_TEST_TIMEOUT:-260} python3 -m pytest -q -rA -p no:cacheprovider \
    tests/gpu/test_compile_lease_gpu.py tests/gpu/test_lease_gpu.py >"$OUT/compile_lease_tests.log" 2>&1
  summary+=("compile-lease tests: rc=$? $(tail -1 "$OUT/compile_lease_tests.log") ($((SECONDS-t0)) s)")
  cp "$OUT/results/compile_lease.jsonl" "$OUT/results/compile_lease_judged.json" "$OUT/" 2>/dev/null
  rm -rf "$OUT/results"
  t0=$SECONDS
  timeout ${AB_TIMEOUT:-300} python3 benchmarks/compile_lease_ab.py ${AB_SELECTORS:-kernelbench:level3/3,8,13 kernelbench:level2/43,88,98} \
    --workers-per-gpu 3 --out "$OUT/ab.json" ${AB_ARGS:-} >"$OUT/compile_lease_ab.log" 2>&1
  summary+=("compile-lease A/B: rc=$? ($((SECONDS-t0)) s)")
  tail -25 "$OUT/compile_lease_ab.log"
fi
if has profiles; then
  t0=$SECONDS
  timeout ${PROFILE_TEST_TIMEOUT:-300} python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_profiles_gpu.py \
    >"$OUT/profile_tests.log" 2>&1
  summary+=("profile tests: rc=$? $(tail -1 "$OUT/profile_tests.log") ($((SECONDS-t0)) s)")
  python3 -m cudal1.cli.main judge --device cuda --profile --reference examples/tasks/diag_matmul.py \
    --candidate examples/candidates/diag_matmul_broadcast.py >"$OUT/profile_example.log" 2>&1
  t0=$SECONDS
  timeout ${PROFILE_COST_TIMEOUT:-400} python3 benchmarks/profile_cost.py --device cuda --repeats ${PROFILE_REPEATS:-5} \
    >"$OUT/profile_cost.log" 2>&1
  summary+=("profile cost: rc=$? $(grep 'median extra' "$OUT/profile_cost.log") ($((SECONDS-t0)) s)")
fi
if has timer; then
  t0=$SECONDS
  timeout ${TIMER_TIMEOUT:-300} python3 benchmarks/timer_ladder.py --runs 2 --json "$OUT/timer_ladder.json" >"$OUT/timer_ladder.log" 2>&1
  summary+=("timer ladder: rc=$? ($((SECONDS-t0)) s)")
  tail -8 "$OUT/timer_ladder.log"
fi
if has smoke || has verify; then
  t0=$SECONDS
  timeout 330 python3 -m cudal1.cli.main verify .data/sample.jsonl --device cuda --out "$OUT/verify" >"$OUT/verify.log" 2>&1
  summary+=("verify: rc=$? ($((SECONDS-t0)) s)")
  cp "$OUT/verify/verify_report.json" "$OUT/" 2>/dev/null
  tail -32 "$OUT/verify.log"
fi
if has builtin; then
  # The run directory carries itself (tasks.jsonl with the task sources, cudal1.sqlite.gz,
  # rewrites.tgz): a later run with the same --out resumes it.  Git keeps only its tasks.jsonl;
  # restore an earlier run's state first (benchmarks/README.md, "Run state").  SIGINT at the
  # deadline: the script snapshots the store, writes its report and the pack
  # ($OUT/builtin_state.tgz) itself.  Resuming elsewhere: tar xzf the pack into the run directory.
  dir=${BUILTIN_DIR:-benchmarks/runs/stride5}
  args=${BUILTIN_ARGS:-kernelbench:level1 kernelbench:level2 kernelbench:level3 --subset stride:5+2 --exclude benchmarks/builtin_design_tasks.txt --rounds 2 --samples 2 --confirm --workers-per-gpu 2}
  t0=$SECONDS
  timeout -s INT ${BUILTIN_TIMEOUT:-540} python3 benchmarks/builtin_kernelbench.py $args --out "$dir" --pack "$OUT/builtin_state.tgz" >"$OUT/builtin.log" 2>&1
  summary+=("builtin: rc=$? ($((SECONDS-t0)) s)")
  tail -24 "$OUT/builtin.log"
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
if has bigio; then
  t0=$SECONDS
  timeout 120 python3 benchmarks/slot_copy.py --sizes 1,4,8.5 --reps 8 --json "$OUT/slot_copy.json" >"$OUT/slot_copy.log" 2>&1
  summary+=("slot copy: rc=$? ($((SECONDS-t0)) s)")
  tail -16 "$OUT/slot_copy.log"
  for t in 38 63; do
    t0=$SECONDS
    timeout 240 python3 -m cudal1.cli.main baseline --suite "kernelbench:level1/$t" --modes compile-default \
      --device cuda --out "/tmp/bigio_$t" --json >"$OUT/bigio_level1_$t.log" 2>&1
    line=$(python3 -c '
import json, sys
try:
    m = json.loads([x for x in open(sys.argv[1]) if x.startswith("{")][-1])["tasks"][0]["modes"]["compile-default"]
except Exception as exc:
    print(f"no verdict ({type(exc).__name__})"); sys.exit()
w = (m.get("figures") or {}).get("gpu", {}).get("window") or {}
print(m["status"], ",".join(m.get("flags") or []) or "-", m.get("speedup"),
      "excess", round(w.get("excess_ms", 0), 3), "bound", round(w.get("bound_ms", 0), 3), "ms")
' "$OUT/bigio_level1_$t.log")
    summary+=("level1/$t compile-default: $line ($((SECONDS-t0)) s)")
  done
fi
if has host_load; then
  t0=$SECONDS
  timeout ${HOST_LOAD_TIMEOUT:-300} python3 benchmarks/host_load.py --file .data/h100.jsonl --out /tmp/cudal1_host_load \
    ${HOST_LOAD_ARGS:-} >"$OUT/host_load.log" 2>&1
  summary+=("host_load: rc=$? ($((SECONDS-t0)) s)")
  cp /tmp/cudal1_host_load/host_load.json "$OUT/" 2>/dev/null
  tail -10 "$OUT/host_load.log"
fi
if has release; then
  t0=$SECONDS
  timeout ${RELEASE_TIMEOUT:-420} python3 benchmarks/throughput.py --workers '' --release --release-file .data/h100.jsonl \
    --workers-per-gpu 2 --deadline-s ${RELEASE_DEADLINE:-380} --out /tmp/cudal1_release ${RELEASE_ARGS:-} >"$OUT/release.log" 2>&1
  summary+=("release: rc=$? ($((SECONDS-t0)) s)")
  tar czf "$OUT/release.tgz" -C /tmp/cudal1_release --exclude='*.so' --exclude='cache*' --exclude='*.o' . 2>/dev/null
  tail -20 "$OUT/release.log"
fi
if has mixed; then
  t0=$SECONDS
  timeout $(( ${MIXED_DEADLINE:-440} + 60 )) python3 benchmarks/throughput.py --workers ${MIXED_WORKERS:-1} \
    --second-pass ${MIXED_SECOND:-none} --deadline-s ${MIXED_DEADLINE:-440} --out /tmp/cudal1_mixed ${MIXED_ARGS:-} \
    >"$OUT/mixed.log" 2>&1
  summary+=("mixed set w=${MIXED_WORKERS:-1}: rc=$? ($((SECONDS-t0)) s)")
  cp /tmp/cudal1_mixed/throughput.json "$OUT/mixed_throughput.json" 2>/dev/null
  tar czf "$OUT/mixed.tgz" -C /tmp/cudal1_mixed --exclude='*.so' --exclude='*.o' . 2>/dev/null
  tail -8 "$OUT/mixed.log"
fi
if has reward; then
  rdir=/tmp/cudal1_reward && rm -rf "$rdir" && mkdir -p "$rdir"
  training_wheels "$rdir" reward
  t0=$SECONDS
  timeout -k 15 ${REWARD_TIMEOUT:-480} python3 benchmarks/reward_loop.py --out "$rdir/run" ${REWARD_ARGS:-} \
    >"$OUT/reward_loop.log" 2>&1
  summary+=("reward loop: rc=$? ($((SECONDS-t0)) s)")
  cp "$rdir/run/reward_loop.json" "$OUT/" 2>/dev/null
  tail -16 "$OUT/reward_loop.log"
fi
if has train; then
  # NVLink multicast stays off (it can take a shared host's GPUs out of service); set here too in case the environment lacks it.
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 TOKENIZERS_PARALLELISM=false
  tdir=${TRAIN_DIR:-/tmp/cudal1_train}
  rm -rf "$tdir" && mkdir -p "$tdir" "$CUDAL1_CACHE_DIR"
  training_wheels "$tdir" train
  python3 -c "import torch, trl, transformers, accelerate, peft; print('train env:', torch.__version__, 'trl', trl.__version__, 'transformers', transformers.__version__, 'accelerate', accelerate.__version__, 'peft', peft.__version__, 'gpus', torch.cuda.device_count())" 2>&1 | tail -1
  parts=" ${TRAIN_PARTS:-a b c} "  # e.g. TRAIN_PARTS=c on one GPU while the GPU tier runs on the other
  # (a) GRPO smoke under torchrun: both ranks train (NCCL), each judges its own rollouts
  if [[ "$parts" == *" a "* ]]; then
  t0=$SECONDS
  timeout -k 15 ${TRAIN_DDP_TIMEOUT:-150} python3 -m torch.distributed.run --nproc_per_node 2 --master_addr 127.0.0.1 \
    --master_port 29531 -m cudal1.cli.main train grpo --smoke --device cuda --max-steps ${TRAIN_DDP_STEPS:-8} \
    --out "$tdir/grpo_ddp" --json >"$OUT/train_grpo_ddp.log" 2>&1
  rc=$?
  summary+=("train (a) torchrun grpo --smoke: rc=$rc ($((SECONDS-t0)) s) $(python3 benchmarks/train_gpu.py --summarize-log "$OUT/train_grpo_ddp.log" 2>&1 | tail -1)")
  fi
  # (b) SFT smoke under accelerate launch with the shipped DDP config, 2 processes
  if [[ "$parts" == *" b "* ]]; then
  t0=$SECONDS
  timeout -k 15 ${TRAIN_ACCEL_TIMEOUT:-90} python3 -m accelerate.commands.launch --config_file src/cudal1/train/configs/accelerate-ddp.yaml \
    --num_processes 2 --main_process_port 29532 -m cudal1.cli.main train sft --smoke --out "$tdir/sft_accel" --json \
    >"$OUT/train_sft_accel.log" 2>&1
  rc=$?
  summary+=("train (b) accelerate launch sft --smoke: rc=$rc ($((SECONDS-t0)) s) $(python3 benchmarks/train_gpu.py --summarize-log "$OUT/train_sft_accel.log" 2>&1 | tail -1)")
  fi
  # (c) GRPO with CUDA/Triton/PyTorch rollouts judged on the GPU (one process)
  if [[ "$parts" == *" c "* ]]; then
  t0=$SECONDS
  timeout -k 15 ${TRAIN_GPU_TIMEOUT:-280} python3 benchmarks/train_gpu.py --out "$tdir/train_gpu" --steps ${TRAIN_GPU_STEPS:-30} \
    --deadline-s ${TRAIN_GPU_DEADLINE:-200} \
    ${TRAIN_GPU_ARGS:-} >"$OUT/train_gpu.log" 2>&1
  rc=$?
  cp "$tdir/train_gpu/train_gpu.json" "$OUT/" 2>/dev/null
  summary+=("train (c) train_gpu.py: rc=$rc ($((SECONDS-t0)) s) $(python3 benchmarks/train_gpu.py --summarize-json "$tdir/train_gpu/train_gpu.json" 2>&1 | tail -1)")
  grep -E "^(warm-up|cuda_|triton_|GRPO rollouts)" "$OUT/train_gpu.log" | head -8
  fi
fi
grep -E "passed|failed|PASSED|FAILED|ERROR" "$OUT/gpu_tests.log" 2>/dev/null | tail -40
printf '%s\n' "${summary[@]}"
