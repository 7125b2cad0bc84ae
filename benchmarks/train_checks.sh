#!/usr/bin/env bash
# GPU checks of training at scale, on one GPU (about 8 minutes on an H200).  Usage, from the repo root:
#   bash benchmarks/train_checks.sh            # every stage
#   TRAIN_CHECKS="saves" bash benchmarks/train_checks.sh
# Stages:
#   saves: tests/gpu/test_zero3_save_gpu.py: a tiny model trained two steps under DeepSpeed ZeRO-3 (full and
#          LoRA) and FSDP2 in one process reloads with plain transformers, every tensor at full shape with the
#          trained values (needs deepspeed)
#   chain: (1) train grpo --smoke on the GPU, 4 steps, evaluated every 2 (--eval-every); (2) cudal1 evaluate of
#          that model on the smoke task with --policy hf (8 one-shot samples judged on the GPU); (3) train grpo
#          --smoke --exemplars-from the evaluate run and the first GRPO run (their verified programs seed the pool)
# Packages the machine lacks travel as wheels in $WHEELS (default .whl: trl, datasets, dill, multiprocess,
# deepspeed built with its ops off, hjson, pydantic and its dependencies, typing-extensions), installed with --target into
# /tmp/site and put first on PYTHONPATH.  Logs and a summary go to $OUT.
set -u
OUT=${OUT:-/tmp/cudal1_train_checks}
WHEELS=${WHEELS:-.whl}
DEVICE=${DEVICE:-cuda}
T=${TRAIN_CHECKS_DIR:-/tmp/cudal1_train}
SCALE=${TIMEOUT_SCALE:-1}  # multiplies every stage's time limit (a slow CPU stand-in: 4)
stages=" ${TRAIN_CHECKS:-saves chain} "
mkdir -p "$OUT" "$T"
export PYTHONUNBUFFERED=1 CUDAL1_CACHE_DIR=${CUDAL1_CACHE_DIR:-/tmp/cudal1_cache} TOKENIZERS_PARALLELISM=false
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never NVLink multicast
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$WHEELS"/*.whl >"$OUT/wheels.log" 2>&1 || { echo "wheel install failed"; tail -5 "$OUT/wheels.log"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}
else
  export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
fi
summary=()
run() {  # run NAME TIMEOUT CMD...: log to $OUT/NAME.log, one summary line
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout $((limit * SCALE)) "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  summary+=("$name: rc $rc, $((SECONDS - t0)) s; $(python3 - "$OUT/$name.log" <<'EOF'
import json, sys
last = None
for line in open(sys.argv[1], errors="replace"):
    if line.startswith("{"):
        try:
            last = json.loads(line)
        except ValueError:
            pass
if last is None:
    tail = [l.strip() for l in open(sys.argv[1], errors="replace") if l.strip()][-1:]
    print(tail[0][:300] if tail else "no output")
elif "reward_mean" in last:
    ev = [(e["step"], round(e["ok_rate"], 3), e.get("pass@1")) for e in last.get("eval") or []]
    print(f"steps {last['steps']}, reward_mean {last['reward_mean']}, seeded {last.get('seeded')}, eval (step, ok, pass@1) {ev}")
else:
    keys = ("samples", "requests", "compile_rate", "correct_rate", "ok_rate", "pass@1", "pass@8", "fast_p", "speedup", "judged")
    print({k: last.get(k) for k in keys})
EOF
)")
}
has() { [[ "$stages" == *" $1 "* ]]; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; git rev-parse HEAD;
  python3 -c "import torch, transformers, trl, peft, accelerate; print(torch.__version__, transformers.__version__, trl.__version__, peft.__version__, accelerate.__version__)";
  python3 -c "import deepspeed; print('deepspeed', deepspeed.__version__)"; } >"$OUT/env.txt" 2>&1
if has saves; then
  run saves 420 python3 -m pytest tests/gpu/test_zero3_save_gpu.py -q -rA -p no:cacheprovider
fi
if has chain; then
  python3 -c "from cudal1.train import smoke; open('$T/diag_scale.py', 'w').write(smoke.TASK_SOURCE)"
  run grpo 300 python3 -m cudal1.cli.main train grpo --smoke --device "$DEVICE" --max-steps 4 --eval-every 2 \
      --eval-samples 4 --out "$T/grpo" --json
  run evaluate 240 python3 -m cudal1.cli.main evaluate "$T/diag_scale.py" --policy hf --model-path "$T/grpo" \
      --samples 8 --max-tokens 256 --device "$DEVICE" --out "$T/eval" --json
  run grpo_seeded 300 python3 -m cudal1.cli.main train grpo --smoke --device "$DEVICE" --max-steps 2 \
      --exemplars-from "$T/eval" "$T/grpo" --out "$T/grpo_seeded" --json
  cp "$T/eval/evaluation.json" "$OUT/" 2>/dev/null
fi
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
