"""The process Nsight Compute profiles: ``python -m cudal1.profile.ncu_target TASK.py [CANDIDATE.py]``.

Builds the task's ``Model`` (or the candidate's ``ModelNew``) on the GPU with the judge's weight
seed, makes warm-up calls (builds, autotuning and caches happen there), then makes one call
between ``cudaProfilerStart`` and ``cudaProfilerStop`` so ncu (``--profile-from-start off``)
sees that call's kernels only.  Not the judge's sandbox: it runs the files as ``python`` would.
"""

from __future__ import annotations

import sys

WARMUP_CALLS = 3


def main(argv: list[str]) -> int:
    import importlib.util

    import torch

    task_path, candidate = argv[0], (argv[1] if len(argv) > 1 else None)

    def load(path: str, name: str):
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[name] = module
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        return module

    task = load(task_path, "cudal1_ncu_task")
    device = torch.device("cuda", 0)
    init = [x.to(device) if isinstance(x, torch.Tensor) else x for x in task.get_init_inputs()]
    torch.manual_seed(42)
    cls = load(candidate, "cudal1_ncu_candidate").ModelNew if candidate else task.Model
    model = cls(*init)
    model = model.to(device) if isinstance(model, torch.nn.Module) else model
    inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in task.get_inputs()]
    with torch.no_grad():
        for _ in range(WARMUP_CALLS):
            model(*inputs)
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        model(*inputs)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
