"""How long ``cudal1 report`` takes on a run of KernelBench's size (the issue's "renders in seconds").

Writes a synthetic run store (``--tasks`` tasks over three levels, ``--candidates`` judged
candidates in ``--rounds`` rounds: CUDA ``load_inline`` kernels, Triton kernels, torch.compile,
CUDA graphs and PyTorch rewrites, with ok / failed / rejected verdicts, baselines and model
analyses), then times each stage of the report on it: reading the store, building the document
(technique analysis of every candidate included), and rendering HTML, JSON and Markdown.  Nothing
is judged; no GPU is needed.  With ``--screenshot PNG`` the HTML page is also opened in headless
Chromium and photographed.

    python benchmarks/report_render.py [--tasks 250] [--candidates 3000] [--out DIR] [--screenshot PNG]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from cudal1.report.document import build_report, label_candidates
from cudal1.report.html import render_html
from cudal1.report.load import load_runs
from cudal1.report.markdown import render_markdown
from cudal1.search import reference_candidate
from cudal1.store import RunStore
from cudal1.types import Candidate, Correctness, Environment, EvalResult, Status, Task, Timing

ENV = Environment(device="cuda", gpu_name="NVIDIA H200", torch="2.11.0", cuda="13.0", driver="580.95", cudal1="0.1.0")

TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """Task {i}: a linear layer, an activation and a reduction."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        y = torch.relu(self.linear(x)) * {scale}
        return torch.sum(y, dim=1, keepdim=True)


batch_size = 128
in_features = {n}
out_features = {n}


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
'''

CUDA = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

src = """
#define BLOCK 256
__global__ void __launch_bounds__(BLOCK) fused_{v}(const float4* __restrict__ x, float* out, int n) {{
    __shared__ float part[BLOCK + 1];
    float4 v = x[blockIdx.x * blockDim.x + threadIdx.x];
    float s = fmaxf(v.x, 0.f) + fmaxf(v.y, 0.f) + fmaxf(v.z, 0.f) + fmaxf(v.w, 0.f);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffff, s, o);
    part[threadIdx.x] = s;
}}
"""
ext = load_inline(name="k{v}", cpp_sources="", cuda_sources=src, functions=["run"])


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return ext.run(self.linear(x))
'''

TRITON = '''import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def epilogue_{v}(y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    y = tl.load(y_ptr + offs, mask=offs < n)
    z = tl.maximum(y, 0.0) * 0.5
    tl.store(out_ptr + tl.program_id(0), tl.sum(z, axis=0))


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        y = self.linear(x)
        out = torch.empty(y.shape[0], 1, device=y.device)
        epilogue_{v}[(y.shape[0],)](y, out, y.shape[1], BLOCK=1024)
        return out
'''

REWRITE = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """relu then sum: the sum of a linear map folded where the activation allows ({v})."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.addmm(self.linear.bias, x, self.linear.weight.t()).clamp_min_(0).sum(1, keepdim=True).mul_(0.5)
'''

COMPILED = '''{task}

class ModelNew(Model):
    def __init__(self, *args):
        super().__init__(*args)
        self.fast = torch.compile(super().forward, mode="{mode}")

    def forward(self, *args):
        return self.fast(*args)
'''

KINDS = ["cuda", "triton", "rewrite", "compile"]


def candidate_source(kind: str, v: int, task_source: str) -> str:
    if kind == "cuda":
        return CUDA.format(v=v)
    if kind == "triton":
        return TRITON.format(v=v)
    if kind == "rewrite":
        return REWRITE.format(v=v)
    return (
        COMPILED.format(task=task_source, mode=random.choice(["default", "reduce-overhead", "max-autotune"]))
        + f"# {v}\n"
    )


def verdict(task: Task, cand: Candidate, rng: random.Random, kind: str) -> EvalResult:
    roll = rng.random()
    if roll < 0.62:
        status, speedup = Status.OK, rng.lognormvariate(0.25 if kind != "compile" else 0.1, 0.6)
    else:
        status, speedup = rng.choice([Status.COMPILE_ERROR, Status.INCORRECT, Status.RUNTIME_ERROR, Status.TIMEOUT,
                                      Status.REJECTED]), None
    flags = (["side_stream"] if status is Status.REJECTED else ["value_mismatch"] if status is Status.INCORRECT else [])
    ref_ms = rng.uniform(0.05, 20.0)
    return EvalResult(
        status=status, task_name=task.name, task_hash=task.hash, candidate_hash=cand.hash, flags=flags,
        message="" if status is Status.OK else f"{status.value}: synthetic",
        correctness=Correctness(trials=5, passed=5 if status is Status.OK else 2),
        reference=Timing.from_samples([ref_ms] * 7, "cuda_event", keep=False),
        candidate=Timing.from_samples([ref_ms / speedup] * 7, "cuda_event", keep=False) if speedup else None,
        speedup=speedup,
        speedup_ci=(speedup * 0.97, speedup * 1.03) if speedup else None,
        environment=ENV,
        config_hash="bench",
        phase="done",
    )


def write_run(out: Path, n_tasks: int, n_candidates: int, rounds: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    random.seed(seed)
    per_task = max(1, n_candidates // n_tasks)
    with RunStore(out / "cudal1.sqlite") as store:
        run_id = store.start_run("optimize", {"judge": {"preset": "synthetic"}})
        for i in range(n_tasks):
            level = 1 + i * 3 // n_tasks
            task = Task(
                name=f"{i}_Synthetic", source=TASK.format(i=i, scale=0.5, n=256 + i), level=level, problem_id=i + 1
            )
            store.add_task(task)
            anchor = reference_candidate(task)
            store.add_candidate(anchor, task.hash, {"round": 0})
            store.record_evaluation(verdict(task, anchor, random.Random(1), "anchor"))
            for j in range(per_task + (1 if i < n_candidates - per_task * n_tasks else 0)):
                kind = rng.choice(KINDS)
                round_ = 1 + j * rounds // per_task
                cand = Candidate(
                    candidate_source(kind, i * 1000 + j, task.source), task_hash=task.hash, label=f"bench:r{round_}"
                )
                store.add_candidate(cand, task.hash, {"round": round_, "policy": "bench"})
                store.record_evaluation(verdict(task, cand, rng, kind))
                store.record_response(
                    task.hash, round_, "bench", {}, "", "The fast kernels fuse the epilogue.", cand.hash
                )
            if rng.random() < 0.8:
                base = verdict(task, anchor, rng, "compile")
                if base.status is Status.OK:
                    store.record_baseline(task.hash, "compile", ENV.key(), "bench", base)
        store.finish_run(run_id, "done")


def timed(label: str, fn, times: dict):
    t0 = time.perf_counter()
    out = fn()
    times[label] = time.perf_counter() - t0
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=250)
    ap.add_argument("--candidates", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", default=None, help="keep the synthetic run and the reports here (default: a temp dir)")
    ap.add_argument("--screenshot", default=None, metavar="PNG", help="photograph the page in headless Chromium")
    args = ap.parse_args()
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="cudal1-report-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    times: dict[str, float] = {}
    if not (out / "cudal1.sqlite").exists():
        timed(
            "write synthetic store (setup, not reporting)",
            lambda: write_run(out, args.tasks, args.candidates, args.rounds),
            times,
        )
    data = timed("read store", lambda: load_runs([out]), times)
    labels = timed("technique analysis", lambda: label_candidates(data), times)
    doc = timed("build document", lambda: build_report(data, labels=labels), times)
    html = timed("render HTML (plots included)", lambda: render_html(doc, data), times)
    text = timed("render JSON", lambda: json.dumps(doc, default=str), times)
    md = timed("render Markdown", lambda: render_markdown(doc), times)
    (out / "report.html").write_text(html)
    (out / "report.json").write_text(text)
    (out / "report.md").write_text(md)
    total = sum(v for k, v in times.items() if not k.startswith("write"))
    judged = sum(1 for rec in data.tasks for c in rec.candidates if c.result)
    print(
        f"{len(data.tasks)} tasks, {judged} judged candidates; HTML {len(html) / 1e6:.1f} MB, JSON "
        f"{len(text) / 1e6:.2f} MB"
    )
    for k, v in times.items():
        print(f"  {k:48s} {v:7.2f} s")
    print(f"  {'report total (read + analyse + HTML + JSON + MD)':48s} {total:7.2f} s")
    print(f"reports in {out}")
    if args.screenshot:
        chromium = shutil.which("chromium") or shutil.which("chromium-browser")
        if not chromium:
            print("no chromium binary: apt-get install chromium", file=sys.stderr)
            return 1
        from playwright.sync_api import sync_playwright

        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            t0 = time.perf_counter()
            page.goto((out / "report.html").resolve().as_uri())
            page.wait_for_load_state("load")
            print(f"  {'Chromium load':48s} {time.perf_counter() - t0:7.2f} s")
            page.screenshot(path=args.screenshot, full_page=False)
            browser.close()
        print(f"screenshot: {args.screenshot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
