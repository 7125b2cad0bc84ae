"""What the judge's steps around a timed call cost on each side of the window, by size: the
output snapshot (a copy of the call's output into its slot), the digest of the slot and the
unmasking of an input, each into memory of the three kinds the two sides use.

The clean window's check (``cudal1.harness.figures.window_check``) compares the slack of the two
sides' windows (window minus the call's span), which holds these steps.  The reference's own calls
unmask from and snapshot into this process's caching-allocator memory; the candidate's process
reads its inputs from and writes its outputs into the reference worker's slots, ``cudaMalloc``
blocks it opened through their IPC handles.  Where the two kinds of memory differ in speed, an
honest candidate's slack differs from the reference's by that much.

One parent process allocates the slots (``cuda_api.malloc``, as ``SlotPool`` does) and starts a
child that opens them by IPC handle, as the candidate's process does.  Each process times, with
CUDA events (median of ``--reps``, L2 flushed before each), every step into:

* ``torch``: a caching-allocator tensor of this process (the reference's targets and buffers);
* ``malloc``: a ``cudaMalloc`` block of this process (a slot, seen by its owner);
* ``ipc``: the parent's slot opened through its IPC handle (child only: what the candidate uses).

    python benchmarks/slot_copy.py [--sizes 1,4,8.5] [--reps 10] [--json PATH]

Sizes are in GB (10^9 bytes).  Needs a CUDA GPU and room for four buffers of the largest size.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

STEPS = ("snapshot", "digest", "unmask")


def _time_steps(sizes: list[int], reps: int, kinds: dict[str, object]) -> dict[str, dict[str, list[float]]]:
    """``{kind: {step: [ms per size]}}`` for the memory ``kinds`` (name -> callable(nbytes) giving a
    uint8 CUDA tensor of at least that many bytes)."""
    import torch

    from cudal1.harness.window import GpuKernels

    kernels = GpuKernels()
    keybuf = torch.tensor([1, 2, 3, 4], dtype=torch.int32, device="cuda")
    flush = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    out: dict[str, dict[str, list[float]]] = {k: {s: [] for s in STEPS} for k in kinds}
    for nbytes in sizes:
        leaf = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        leaf.random_(0, 255)
        for kind, make in kinds.items():
            target = make(nbytes)[:nbytes]  # type: ignore[operator]
            for step in STEPS:
                times = []
                for _ in range(reps):
                    flush.zero_()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    if step == "snapshot":  # the call's output into its slot (timer._snapshot)
                        target.copy_(leaf)
                    elif step == "digest":  # the slot's digest (timer.time_call)
                        kernels.digest(target.data_ptr(), nbytes, stream)
                    else:  # a masked input from its slot into a private buffer (CallWindow.unmask)
                        kernels.mask(target.data_ptr(), leaf.data_ptr(), nbytes, keybuf.data_ptr(), 0, stream)
                    end.record()
                    end.synchronize()
                    times.append(start.elapsed_time(end))
                out[kind][step].append(statistics.median(times))
            del target
        del leaf
        torch.cuda.empty_cache()
    return out


def child(handles: list[str], sizes: list[int], reps: int) -> None:
    import torch

    from cudal1.harness import cuda_api

    torch.cuda.init()
    opened = {size: cuda_api.byte_tensor(cuda_api.ipc_open(h), size) for h, size in zip(handles, sizes)}
    kinds = {
        "torch": lambda n: torch.empty(n, dtype=torch.uint8, device="cuda"),
        "malloc": lambda n: cuda_api.byte_tensor(cuda_api.malloc(n), n),
        "ipc": lambda n: opened[n],
    }
    print(json.dumps(_time_steps(sizes, reps, kinds)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,4,8.5", help="GB, comma-separated")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", default="")
    ap.add_argument("--child", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    sizes = [int(float(s) * 1e9) // 16 * 16 for s in args.sizes.split(",")]
    if args.child is not None:
        child(args.child, sizes, args.reps)
        return 0
    import torch

    from cudal1.harness import cuda_api

    if not torch.cuda.is_available():
        print("slot_copy: needs a CUDA GPU", file=sys.stderr)
        return 2
    slots = [cuda_api.malloc(n) for n in sizes]
    handles = [cuda_api.ipc_handle(p) for p in slots]
    proc = subprocess.run([sys.executable, __file__, "--sizes", args.sizes, "--reps", str(args.reps),
                           "--child", *handles], capture_output=True, text=True)
    if proc.returncode:
        print(proc.stderr[-3000:], file=sys.stderr)
        return 1
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    mine = _time_steps(sizes, args.reps, {
        "torch": lambda n: torch.empty(n, dtype=torch.uint8, device="cuda"),
        "malloc": lambda n: cuda_api.byte_tensor(slots[sizes.index(n)], n),
    })
    result = {"gpu": torch.cuda.get_device_name(), "sizes_bytes": sizes, "reps": args.reps,
              "owner": mine, "opener": theirs}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(f"{'process':8} {'memory':7} {'step':9} " + " ".join(f"{n / 1e9:>8.2f}GB" for n in sizes) + "   (ms)")
    for who, table in (("owner", mine), ("opener", theirs)):
        for kind, steps in table.items():
            for step, ms in steps.items():
                print(f"{who:8} {kind:7} {step:9} " + " ".join(f"{m:>10.3f}" for m in ms))
    return 0


if __name__ == "__main__":
    sys.exit(main())
