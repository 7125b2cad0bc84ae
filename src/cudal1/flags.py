"""Named behaviours the judge reports in ``EvalResult.flags``.

Names are a stable contract (``cudal1 judge --json`` carries them): add new ones, never rename.
Informational flags describe a candidate; the others explain a ``rejected``/``incorrect`` verdict.
:data:`LOAD_DEPENDENT` names those that the machine's load while timing decides.
"""

from __future__ import annotations

FLAGS: dict[str, str] = {
    # verdict-explaining
    "side_stream": "device work escaped the calling stream: it was still running when forward returned",
    "lazy_output": "output is not a plain materialized torch.Tensor (subclass, meta/fake, wrong device)",
    "cached_result": "a re-checked timed output did not match the reference for that call's fresh inputs",
    "input_mutation": "the candidate modified its input tensors",
    "tampering": "the candidate interfered with the judge (forged messages, patched timing/compare functions)",
    "precision_downgrade": "the candidate changed global numeric precision settings (e.g. TF32)",
    "shape_mismatch": "output structure, shape or dtype differs from the reference",
    "nan_mismatch": "NaN/Inf positions differ from the reference",
    "value_mismatch": "values differ beyond the correctness rule",
    "hyperparameter_ignored": "ModelNew ignores a constructor argument that the reference uses",
    "impossible_time": "the candidate's time stayed below half of what moving its inputs and outputs once takes",
    "reference_error": "the reference task itself failed (not the candidate's fault)",
    "oom": "out of device memory",
    "illegal_memory_access": "a CUDA illegal memory access (the CUDA context was lost)",
    "signal": "the worker was killed by a signal (e.g. SIGSEGV)",
    "no_verdict": "the worker exited without sending a verdict",
    "timing_mismatch": "the candidate's process reported times that do not fit the clean side's clock",
    "below_physical_limit": "a timed call was faster than writing its outputs once at the device's peak memory "
                            "bandwidth",
    "persisting_l2": "the candidate set a persisting-L2 limit or an access-policy window (lines an L2 flush cannot "
                     "evict)",
    "new_process": "the candidate's process started a process after warm-up (it is sealed against that once timing "
                   "begins)",
    "foreign_gpu_work": "a process the candidate started (by descent or uid) held its own context on the GPU being "
                        "timed",
    "contended": "the GPU (another process outside this judge) or the host (its timed threads waited for a CPU) was "
                 "shared while it was timed: the timing is not trusted",
    # informational
    "cpu_timing": "timed on the CPU with a monotonic host clock",
    "build_cached": "the candidate's extension build was found in the build cache",
    "degenerate_task": "the task's reference output is constant, near zero or input-independent",
    "no_custom_kernel": "no custom CUDA/Triton kernel ran during forward (profiled on CUDA only)",
    "pytorch_fallback": "the code falls back to PyTorch behind try/except",
    "strict_verified": "a speedup above the strict threshold passed a second, stricter verification",
    "reviewer_suspects": "an optional LLM reviewer suspects reward hacking (second opinion, never a verdict)",
    "launch_bound": "the host's time to issue a call exceeds its GPU time (reference or candidate): figures depend "
                    "on the host",
    "high_variance": "timing spread (IQR/median) above 10%: the speedup is less certain",
    "rejudged_alone": "judged again with the GPU to itself: it ran out of device memory beside other workers, or its "
                      "timing was contended",
}

# Flags that the host's or the GPU's load while the candidate was timed decides, not the candidate:
# judged twice (another backend, a re-judge), the same candidate may get one of them only once.
# Comparisons of two judgings of one candidate leave them out; a verdict-explaining flag is never one.
LOAD_DEPENDENT: frozenset[str] = frozenset((
    "contended",  # another process or thread held the GPU or a CPU the timed threads waited for
    "high_variance",  # the spread of the timed calls
    "launch_bound",  # the host's issue time against the GPU time (on a CPU clock, both are host time)
    "strict_verified",  # the second pass runs only above a measured speedup
    "rejudged_alone",  # out of memory or contended beside the other workers of the moment
))


def check(name: str) -> str:
    """Return ``name`` if it is a registered flag; raise ``KeyError`` otherwise (fail loudly)."""
    if name not in FLAGS:
        raise KeyError(f"unknown flag {name!r}")
    return name
