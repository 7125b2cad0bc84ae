"""``cudal1 verify`` over the anchor records (``benchmarks/verify_anchors.txt``) of a CUDA-L1
release file, with fresh caches: the wall time a user waits and the classes it gives.

    python benchmarks/verify_anchors.py RELEASE.jsonl [--anchors benchmarks/verify_anchors.txt]
        [--out DIR] [-- extra verify flags]

Prints the wall seconds, the number of records and the verify summary line last.  Needs a GPU
for the figure to mean anything (on the CPU every CUDA record fails to build or run).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def anchors(path: Path) -> list[tuple[int, int]]:
    out = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            level, task = line.split("/")
            out.append((int(level), int(task)))
    return out


def select(release: Path, wanted: list[tuple[int, int]]) -> list[dict]:
    """The release's records for ``wanted`` (level_id/task_id), in ``wanted``'s order."""
    by_key = {}
    for line in release.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            by_key[(int(rec["level_id"]), int(rec["task_id"]))] = rec
    missing = [k for k in wanted if k not in by_key]
    if missing:
        raise SystemExit(f"verify_anchors: {release} has no record for {', '.join(f'{a}/{b}' for a, b in missing)}")
    return [by_key[k] for k in wanted]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("release", type=Path)
    ap.add_argument("--anchors", type=Path, default=HERE / "verify_anchors.txt")
    ap.add_argument("--out", type=Path, default=None)
    args, extra = ap.parse_known_args(argv)
    records = select(args.release, anchors(args.anchors))
    work = Path(tempfile.mkdtemp(prefix="cudal1_anchors_"))
    subset = work / "anchors.jsonl"
    subset.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = args.out or work / "verify"
    env = {**os.environ, "CUDAL1_CACHE_DIR": str(work / "cache")}  # fresh caches: every build counts
    t0 = time.time()
    done = subprocess.run([sys.executable, "-m", "cudal1.cli.main", "verify", str(subset), "--out", str(out), "--json",
                           *[a for a in extra if a != "--"]], env=env, capture_output=True, text=True)
    wall = time.time() - t0
    sys.stderr.write(done.stderr[-4000:])
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    print(f"verify_anchors: {len(records)} records in {wall:.1f} s (rc {done.returncode}), report {out}")
    print(last[:2000])
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
