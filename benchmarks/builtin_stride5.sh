#!/usr/bin/env bash
# The builtin policy's stride-5 run on a GPU machine, one step per call (each under 10 minutes),
# from the repository root with the run's state in benchmarks/runs/stride5 (git-ignored: carry it
# along, or unpack benchmarks/runs/archive/stride5.tgz there first; benchmarks/README.md, "Run state").
#
#   bash benchmarks/builtin_stride5.sh probe    # the cost levers off and on, on 3 finished tasks (~4-6 min)
#   bash benchmarks/builtin_stride5.sh resume   # continue the run for 530 s (run it again until done)
#   STRIDE5_SECONDS=300 bash benchmarks/builtin_stride5.sh resume   # a shorter part (the pack takes ~20 s more)
#   STRIDE5_DRAIN=90 bash benchmarks/builtin_stride5.sh resume      # start no verdict in the part's last 90 s
#                                                                   # (default 60; the running ones finish: --drain-after;
#                                                                   # but one expected to end before the last 15 s does,
#                                                                   # and none that is not starts at all: --drain-end;
#                                                                   # 0: no drain, the timeout cuts them)
#   STRIDE5_WORKERS=3 bash benchmarks/builtin_stride5.sh resume     # workers per GPU (default 4; not in the config hash)
#   STRIDE5_CHUNK=0 bash benchmarks/builtin_stride5.sh resume       # tasks per chunk (default 40, the whole sample;
#                                                                   # 0: 4 x workers per GPU, at least 8; not in the
#                                                                   # config hash)
#   STRIDE5_CONFIRM_WORKERS=1 bash benchmarks/builtin_stride5.sh resume  # the re-timing's (default 4; timing and
#                                                                   # choices made by timing stay exclusive;
#                                                                   # not in the config hash)
#   STRIDE5_COMPILE_LEASE=held bash benchmarks/builtin_stride5.sh resume  # compiling under the GPU's lease
#                                                                   # (--compile-lease held | released | autotune-held;
#                                                                   # default released; not in the config hash)
#   STRIDE5_FIRST_CALL=exclusive bash benchmarks/builtin_stride5.sh resume  # the candidate's whole first call
#                                                                   # under the exclusive lease (--first-call-lease;
#                                                                   # default choosers; not in the config hash)
#   STRIDE5_BASELINE_LEASE=choosers bash benchmarks/builtin_stride5.sh resume  # a torch.compile baseline's
#                                                                   # first call under a candidate's rule
#                                                                   # (--baseline-lease; default exclusive, the
#                                                                   # whole call; not in the config hash; not safe
#                                                                   # yet: docs/harness.md)
#   STRIDE5_LEASE_ORDER=choices-first bash benchmarks/builtin_stride5.sh resume  # a worker waiting for the
#                                                                   # GPU's lease exclusive to make a choice by
#                                                                   # timing stops new holders until it is served
#                                                                   # (--lease-order; default any, flock's; not
#                                                                   # in the config hash; its GPU A/Bs:
#                                                                   # docs/harness.md)
#   STRIDE5_FINISH=staged bash benchmarks/builtin_stride5.sh resume  # baselines, then re-timing, each its own
#                                                                   # batch (--finish; default joined: one batch
#                                                                   # whose jobs join as their verdicts come in;
#                                                                   # not in the config hash)
#   STRIDE5_ALONG=off bash benchmarks/builtin_stride5.sh resume      # the baselines that need nothing of the
#                                                                   # search after it, not in its first batch
#                                                                   # (--baselines-along; default on; not in
#                                                                   # the config hash)
#   STRIDE5_OUT=benchmarks/runs/stride5b bash benchmarks/builtin_stride5.sh resume  # another run's state
#   STRIDE5_MIN_GPU_GIB=0 bash benchmarks/builtin_stride5.sh resume  # judge on a card of less than 100 GiB
#                                                                   # (without it such a call stops at once, rc 2:
#                                                                   # --min-gpu-gib; level1/38 and level1/63 ran out
#                                                                   # of memory judged alone on an 80 GB H100)
#   STRIDE5_OTHER_GPU=1 bash benchmarks/builtin_stride5.sh resume  # go on on a GPU other than the run's (without
#                                                                   # it such a call stops at once, rc 2: --other-gpu)
#   STRIDE5_ANCHOR=off bash benchmarks/builtin_stride5.sh resume    # the search judges no reference as itself
#                                                                   # (--no-anchor: one job per task fewer; in the
#                                                                   # search's identity, so only for a new run)
#   STRIDE5_REJUDGE="level1/63" bash benchmarks/builtin_stride5.sh resume  # judge these tasks' programs again first
#                                                                   # (--rejudge; their old verdicts: rejudged.jsonl;
#                                                                   # TASK:MODE: only that baseline, timed again;
#                                                                   # TASK:baselines all of its baselines; all:baselines
#                                                                   # every task's, the search's verdicts kept)
#
# probe: the baselines of the run's first 3 finished tasks (every mode, then the re-timing of each
#        one's best compile mode), from empty caches with the levers on, then off, outside the run
#        store: device seconds per task of each, and whether every speedup stays inside the other
#        pass's 95% interval (benchmarks/builtin_cost.py).  Judges nothing into the run.
# resume: the recorded command; STRIDE5_DRAIN s before its end it starts no new verdict and lets the
#        running ones finish (a verdict still running at the end is cut by SIGINT, and lost); it
#        keeps whole tasks, and its report ends with the call's device seconds per finished task; the
#        state is packed before the report too, so a call cut while it writes the report loses nothing.
# Both write $OUT/stride5_state.tgz (unpack it into the run's folder here to keep the state)
# and their log to $OUT; a summary is printed last.
set -u
OUT=${OUT:-/tmp/cudal1_out}
mkdir -p "$OUT"
step=${1:?usage: builtin_stride5.sh probe|resume}
RUN=${STRIDE5_OUT:-benchmarks/runs/stride5}
# The judge times each verdict to a 2 s budget of at most 50 calls per side (the preset: 4 s, 100).
# Four workers share the GPU (at three it sat idle about 30% of each batch): timing, choices made by
# timing (autotuners, cuDNN's benchmark mode in a candidate's first call) hold its lease exclusive,
# compiling gives it back
# (docs/harness.md), and the re-timing runs at four too.  The whole sample is one chunk: each stage
# (round 1 with the anchors, round 2, then the baselines and re-timing joined in one batch) has
# one end where lanes run dry (chunks of 20 in the third run; the fourth runs whole).
ARGS=(kernelbench:level1 kernelbench:level2 kernelbench:level3 --subset stride:5+2
      --exclude benchmarks/builtin_design_tasks.txt --rounds 2 --samples 2 --confirm
      --timing-budget 2 --timing-trials 50 --workers-per-gpu "${STRIDE5_WORKERS:-4}"
      --confirm-workers-per-gpu "${STRIDE5_CONFIRM_WORKERS:-4}"
      --chunk "${STRIDE5_CHUNK:-40}" --out "$RUN" --pack "$OUT/stride5_state.tgz"
      --compile-lease "${STRIDE5_COMPILE_LEASE:-released}" --first-call-lease "${STRIDE5_FIRST_CALL:-choosers}"
      --finish "${STRIDE5_FINISH:-joined}" --baseline-lease "${STRIDE5_BASELINE_LEASE:-exclusive}"
      --baselines-along "${STRIDE5_ALONG:-on}" --lease-order "${STRIDE5_LEASE_ORDER:-any}")
[ "${STRIDE5_ANCHOR:-on}" = off ] && ARGS+=(--no-anchor)
[ -n "${STRIDE5_OTHER_GPU:-}" ] && ARGS+=(--other-gpu)
[ "${STRIDE5_MIN_GPU_GIB:-100}" != 0 ] && ARGS+=(--min-gpu-gib "${STRIDE5_MIN_GPU_GIB:-100}")
[ -f "$RUN/cudal1.sqlite.gz" ] || echo "warning: no stride-5 state in $RUN: the run starts afresh"
case "$step" in
  probe)
    timeout -s INT 540 python3 benchmarks/builtin_kernelbench.py "${ARGS[@]}" --report-only --cost-probe 3 \
      >"$OUT/stride5_probe.log" 2>&1
    echo "probe rc=$?"
    cp "$RUN/cost_probe.json" "$OUT/" 2>/dev/null
    grep -A12 '^cost probe' "$OUT/stride5_probe.log"
    ;;
  resume)
    REJUDGE=()
    for t in ${STRIDE5_REJUDGE:-}; do REJUDGE+=(--rejudge "$t"); done
    [ ${#REJUDGE[@]} -eq 0 ] || REJUDGE+=(--rejudge-reason "${STRIDE5_REJUDGE_REASON:-verdicts of a judge fixed since}")
    SECONDS_=${STRIDE5_SECONDS:-530}
    DRAIN=()
    [ "${STRIDE5_DRAIN:-60}" -gt 0 ] && DRAIN=(--drain-after $((SECONDS_ - ${STRIDE5_DRAIN:-60})))
    # a deadline 15 s before the end: a verdict starts only if its task's verdicts of its kind say it ends by then
    [ "${STRIDE5_DRAIN:-60}" -gt 20 ] && DRAIN+=(--drain-end $((SECONDS_ - 15)))
    timeout -s INT "$SECONDS_" python3 benchmarks/builtin_kernelbench.py "${ARGS[@]}" "${REJUDGE[@]}" "${DRAIN[@]}" \
      >"$OUT/stride5_resume.log" 2>&1
    echo "resume rc=$? (130: drained or cut short, 124: cut by the timeout; whole tasks kept either way; 2: another GPU, or one too small)"
    grep -E '^(re-judging|tasks [0-9]|cost|Where a compile)' "$OUT/stride5_resume.log"
    tail -22 "$OUT/stride5_resume.log"
    ;;
  *) echo "unknown step $step (probe | resume)"; exit 2 ;;
esac
