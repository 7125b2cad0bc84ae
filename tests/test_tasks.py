"""Unit tests for cudal1.tasks: loaders, selectors, lookup and error messages (no torch, no GPU)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from cudal1 import tasks as T
from cudal1.tasks import (
    Selector,
    TaskError,
    find_task,
    load_task_dir,
    load_task_file,
    load_task_hf,
    load_task_jsonl,
    load_tasks,
    parse_selector,
    resolve_suite,
    split_of,
)
from cudal1.types import Task

SHARED = Path(__file__).resolve().parents[2] / "shared"
KERNELBENCH_JSONL = SHARED / "kernelbench" / "kernelbench.jsonl"
CUDA_L1_SAMPLE = SHARED / "cuda-l1" / "sample.jsonl"


def task_src(op: str = "torch.relu(x)") -> str:
    return (
        "import torch\nimport torch.nn as nn\n\n"
        "class Model(nn.Module):\n"
        "    def forward(self, x):\n"
        f"        return {op}\n\n"
        "batch_size = 4\n\n"
        "def get_inputs():\n    return [torch.randn(batch_size, 8)]\n\n"
        "def get_init_inputs():\n    return []\n"
    )


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def write_jsonl(path: Path, records: list[dict], blank_lines: bool = False) -> Path:
    sep = "\n\n" if blank_lines else "\n"
    return write(path, sep.join(json.dumps(r) for r in records) + "\n")


@pytest.fixture
def suite_dir(tmp_path: Path) -> Path:
    root = tmp_path / "kb"
    for level, names in {1: ["1_Matmul", "3_Conv", "19_ReLU", "2_Add"], 2: ["17_Fused"]}.items():
        for i, name in enumerate(names):
            write(root / f"level{level}" / f"{name}.py", task_src(f"x + {level * 100 + i}"))
    write(root / "level1" / "__init__.py", "")
    write(root / "level1" / "_helper.py", "x = 1\n")
    return root


@pytest.fixture
def suite_jsonl(tmp_path: Path) -> Path:
    records = [
        {"level": lvl, "problem_id": pid, "name": f"{pid}_T{lvl}",
         "code": task_src(f"x * {lvl}{pid}")}
        for lvl in (1, 2)
        for pid in range(1, 11)
    ]
    return write_jsonl(tmp_path / "suite.jsonl", records)


def kernelbench_tasks() -> list[Task]:
    if not KERNELBENCH_JSONL.is_file():
        pytest.skip(f"shared KernelBench file not present: {KERNELBENCH_JSONL}")
    return load_task_jsonl(KERNELBENCH_JSONL)


# --- module contract -------------------------------------------------------------------------


@pytest.mark.cpu
def test_import_does_not_pull_torch() -> None:
    code = "import sys, cudal1.tasks; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_task_error_is_value_error() -> None:
    assert issubclass(TaskError, ValueError)


def test_loading_never_executes_task_code(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    src = f"open({str(marker)!r}, 'w').close()\nraise SystemExit(3)\n" + task_src()
    task = load_task_file(write(tmp_path / "evil.py", src))
    assert task.source == src
    assert not marker.exists()


# --- single files --------------------------------------------------------------------------


def test_load_task_file_flat(tmp_path: Path) -> None:
    task = load_task_file(write(tmp_path / "19_ReLU.py", task_src()))
    assert (task.name, task.level, task.problem_id) == ("19_ReLU", None, None)
    assert task.task_id == "19_ReLU"
    assert task.origin == str(tmp_path / "19_ReLU.py")


def test_load_task_file_in_level_dir(tmp_path: Path) -> None:
    task = load_task_file(write(tmp_path / "level1" / "19_ReLU.py", task_src()))
    assert (task.name, task.level, task.problem_id, task.task_id) == ("19_ReLU", 1, 19, "level1/19")


def test_level_dir_without_numeric_stem_has_no_level(tmp_path: Path) -> None:
    task = load_task_file(write(tmp_path / "level3" / "relu.py", task_src()))
    assert (task.level, task.problem_id) == (None, None)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match="no such task file"):
        load_task_file(tmp_path / "nope.py")


@pytest.mark.parametrize(
    "src, missing",
    [
        ("def get_inputs(): pass\ndef get_init_inputs(): pass\n", "Model"),
        ("class Model: pass\ndef get_init_inputs(): pass\n", "get_inputs"),
        ("class Model: pass\nget_inputs = lambda: []\n", "get_init_inputs"),
        ("x = 1\n", "Model, get_inputs, get_init_inputs"),
    ],
)
def test_source_missing_names(tmp_path: Path, src: str, missing: str) -> None:
    with pytest.raises(TaskError, match=f"missing {missing}"):
        load_task_file(write(tmp_path / "t.py", src))


def test_nested_definitions_do_not_count(tmp_path: Path) -> None:
    src = "if False:\n    class Model: pass\ndef get_inputs(): pass\ndef get_init_inputs(): pass\n"
    with pytest.raises(TaskError, match="missing Model"):
        load_task_file(write(tmp_path / "t.py", src))


def test_syntax_error_is_task_error(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.py", task_src() + "\ndef broken(:\n")
    with pytest.raises(TaskError, match=r"bad\.py: not valid Python \(line \d+"):
        load_task_file(path)


def test_error_messages_are_one_line(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.py", "def f(:\n    pass\n")
    with pytest.raises(TaskError) as info:
        load_task_file(path)
    assert "\n" not in str(info.value)


# --- directories ---------------------------------------------------------------------------


def test_load_task_dir_sorted_and_skips_private(suite_dir: Path) -> None:
    tasks = load_task_dir(suite_dir)
    assert [t.task_id for t in tasks] == [
        "level1/1", "level1/2", "level1/3", "level1/19", "level2/17"
    ]
    assert all(not t.name.startswith("_") for t in tasks)


def test_load_task_dir_flat(tmp_path: Path) -> None:
    for i, name in enumerate(("b_task", "a_task")):
        write(tmp_path / f"{name}.py", task_src(f"x + {i}"))
    write(tmp_path / "__init__.py", "")
    assert [t.name for t in load_task_dir(tmp_path)] == ["a_task", "b_task"]


def test_load_task_dir_errors(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match="no such task directory"):
        load_task_dir(tmp_path / "missing")
    write(tmp_path / "empty" / "__init__.py", "")
    with pytest.raises(TaskError, match="no task files"):
        load_task_dir(tmp_path / "empty")


def test_load_task_dir_reports_bad_file(tmp_path: Path) -> None:
    write(tmp_path / "good.py", task_src())
    write(tmp_path / "sub" / "bad.py", "print('hi')\n")
    with pytest.raises(TaskError, match=r"bad\.py: not a KernelBench task"):
        load_task_dir(tmp_path)


# --- JSONL ---------------------------------------------------------------------------------


def test_load_task_jsonl_kernelbench_format(tmp_path: Path) -> None:
    recs = [
        {"level": 1, "problem_id": 19, "name": "19_ReLU", "code": task_src()},
        {"level": 2, "problem_id": 5, "name": "5_Add", "code": task_src("x + 1")},
    ]
    path = write_jsonl(tmp_path / "t.jsonl", recs, blank_lines=True)
    tasks = load_task_jsonl(path)
    assert [(t.name, t.level, t.problem_id) for t in tasks] == [("19_ReLU", 1, 19), ("5_Add", 2, 5)]
    assert tasks[0].origin == f"{path}:1" and tasks[1].origin == f"{path}:3"


def test_load_task_jsonl_cuda_l1_format(tmp_path: Path) -> None:
    rec = {"level_id": 2, "task_id": 7, "ref_code": task_src(), "custom_code": "None"}
    (task,) = load_task_jsonl(write_jsonl(tmp_path / "t.jsonl", [rec]))
    assert (task.name, task.level, task.problem_id, task.task_id) == ("level2_7", 2, 7, "level2/7")


def test_load_task_jsonl_bad_json_names_line(tmp_path: Path) -> None:
    good = json.dumps({"name": "a", "code": task_src()})
    path = write(tmp_path / "t.jsonl", f"{good}\n\n{{not json\n")
    with pytest.raises(TaskError, match=r"t\.jsonl:3: invalid JSON"):
        load_task_jsonl(path)


@pytest.mark.parametrize(
    "record, message",
    [
        ([1, 2], "expected a JSON object"),
        ({"name": "x"}, "no task source"),
        ({"code": "x = 1\n", "name": "x"}, "not a KernelBench task"),
        ({"code": task_src()}, "no 'name'"),
        ({"code": task_src(), "name": "x", "level": "one"}, "'level' is not an integer"),
        ({"code": task_src(), "name": 3}, "'name' is not a string"),
    ],
)
def test_load_task_jsonl_bad_records(tmp_path: Path, record: object, message: str) -> None:
    path = write(tmp_path / "t.jsonl", json.dumps(record) + "\n")
    with pytest.raises(TaskError, match=message) as info:
        load_task_jsonl(path)
    assert "t.jsonl:1" in str(info.value)


def test_load_task_jsonl_missing_and_empty(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match="no such task file"):
        load_task_jsonl(tmp_path / "nope.jsonl")
    with pytest.raises(TaskError, match="no tasks in"):
        load_task_jsonl(write(tmp_path / "empty.jsonl", "\n  \n"))


def test_shared_kernelbench_jsonl() -> None:
    tasks = kernelbench_tasks()
    assert len(tasks) == 270
    assert {lvl: sum(t.level == lvl for t in tasks) for lvl in (1, 2, 3, 4)} == {
        1: 100, 2: 100, 3: 50, 4: 20
    }
    relu = find_task(tasks, "level1/19")
    assert relu.name == "19_ReLU" and "relu" in relu.source.lower()
    assert len({t.task_id for t in tasks}) == 270


def test_shared_kernelbench_via_selector() -> None:
    kernelbench_tasks()  # skips when absent
    tasks = resolve_suite("kernelbench:level1/1-20", KERNELBENCH_JSONL)
    assert [t.problem_id for t in tasks] == list(range(1, 21))
    assert len(load_tasks("kernelbench:level3", source=KERNELBENCH_JSONL)) == 50


def test_shared_kernelbench_split_counts_and_is_a_partition() -> None:
    tasks = kernelbench_tasks()
    held = resolve_suite("kernelbench:held-out", KERNELBENCH_JSONL)
    train = resolve_suite("kernelbench:train", KERNELBENCH_JSONL)
    assert {lvl: sum(t.level == lvl for t in held) for lvl in (1, 2, 3, 4)} == {1: 20, 2: 20, 3: 10, 4: 4}
    assert len(train) == 216 and not {t.hash for t in held} & {t.hash for t in train}
    assert len(held) + len(train) == len(tasks)
    assert [t.problem_id for t in resolve_suite("kernelbench:level3:held-out", KERNELBENCH_JSONL)] == list(
        range(5, 51, 5)
    )


def test_shared_cuda_l1_sample() -> None:
    if not CUDA_L1_SAMPLE.is_file():
        pytest.skip(f"shared CUDA-L1 sample not present: {CUDA_L1_SAMPLE}")
    tasks = load_task_jsonl(CUDA_L1_SAMPLE)
    assert len(tasks) == 15
    assert tasks[0].name == f"level{tasks[0].level}_{tasks[0].problem_id}"
    assert {t.level for t in tasks} == {1, 2, 3}


# --- hashes --------------------------------------------------------------------------------


def test_hash_stable_across_loaders(tmp_path: Path) -> None:
    src = task_src()
    from_file = load_task_file(write(tmp_path / "level1" / "19_ReLU.py", src))
    rec = {"level": 1, "problem_id": 19, "name": "19_ReLU", "code": src}
    from_jsonl = load_task_jsonl(write_jsonl(tmp_path / "t.jsonl", [rec]))[0]
    again = load_task_file(tmp_path / "level1" / "19_ReLU.py")
    assert from_file.hash == from_jsonl.hash == again.hash
    other = load_task_file(write(tmp_path / "other.py", task_src("torch.tanh(x)")))
    assert other.hash != from_file.hash


# --- selectors -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("kernelbench", Selector("kernelbench")),
        ("kernelbench:level1", Selector("kernelbench", 1)),
        ("kernelbench:level2/17", Selector("kernelbench", 2, (17,))),
        ("kernelbench:level1/1-5", Selector("kernelbench", 1, (1, 2, 3, 4, 5))),
        ("kernelbench:level1/1,3,5-7", Selector("kernelbench", 1, (1, 3, 5, 6, 7))),
        ("kernelbench:level1/7,1,1-2", Selector("kernelbench", 1, (1, 2, 7))),
        (" kernelbench:level4 ", Selector("kernelbench", 4)),
        ("kernelbench:held-out", Selector("kernelbench", split="held-out")),
        ("kernelbench:level2:train", Selector("kernelbench", 2, split="train")),
        ("kernelbench:level1/1-3:held-out", Selector("kernelbench", 1, (1, 2, 3), "held-out")),
    ],
)
def test_parse_selector(text: str, expected: Selector) -> None:
    assert parse_selector(text) == expected


def test_selector_str_round_trips() -> None:
    for text in ("kernelbench", "kernelbench:level1", "kernelbench:level1/1,3,5", "kernelbench:train",
                 "kernelbench:level3:held-out", "kernelbench:level1/1,3:train"):
        assert str(parse_selector(text)) == text


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "bad suite selector"),
        ("kernelbench:", "bad suite selector"),
        ("kernelbench:1", "bad suite selector"),
        ("kernelbench:levelx", "bad suite selector"),
        ("kernelbench:level1/", "bad suite selector"),
        ("kernelbench:level1/a", "bad id list"),
        ("kernelbench:level1/1,,2", "bad id list"),
        ("kernelbench:level1/5-3", "bad id range"),
        ("kernelbench:level1/1-2-3", "bad id list"),
        ("kernelbench/3", "bad suite selector"),
        ("otherbench:level1", "unknown suite 'otherbench'"),
        ("kernelbench:heldout", "unknown split 'heldout'"),
        ("kernelbench:held-out:level1", "bad suite selector"),
        ("kernelbench:train:held-out", "bad suite selector"),
    ],
)
def test_parse_selector_rejects(text: str, message: str) -> None:
    with pytest.raises(TaskError, match=message):
        parse_selector(text)


def test_resolve_suite_jsonl(suite_jsonl: Path) -> None:
    assert len(resolve_suite("kernelbench", suite_jsonl)) == 20
    tasks = resolve_suite("kernelbench:level2/1,3,5-7", suite_jsonl)
    assert [t.task_id for t in tasks] == [f"level2/{i}" for i in (1, 3, 5, 6, 7)]


def test_resolve_suite_dir(suite_dir: Path) -> None:
    tasks = resolve_suite("kernelbench:level1/2-3", suite_dir)
    assert [t.name for t in tasks] == ["2_Add", "3_Conv"]


def test_resolve_suite_missing_ids_named(suite_jsonl: Path) -> None:
    with pytest.raises(TaskError, match=r"no task with id 11, 12 in level 1"):
        resolve_suite("kernelbench:level1/9-12", suite_jsonl)


def test_resolve_suite_no_match(suite_jsonl: Path) -> None:
    with pytest.raises(TaskError, match="no tasks matched 'kernelbench:level9'"):
        resolve_suite("kernelbench:level9", suite_jsonl)


def test_resolve_suite_split(suite_jsonl: Path, tmp_path: Path) -> None:
    held = resolve_suite("kernelbench:held-out", suite_jsonl)
    assert [(t.level, t.problem_id) for t in held] == [(1, 5), (1, 10), (2, 5), (2, 10)]
    assert all(split_of(t) == "held-out" for t in held)
    assert len(resolve_suite("kernelbench:train", suite_jsonl)) == 16
    assert [t.problem_id for t in resolve_suite("kernelbench:level2:held-out", suite_jsonl)] == [5, 10]
    assert [t.problem_id for t in resolve_suite("kernelbench:level1/1-6:train", suite_jsonl)] == [1, 2, 3, 4, 6]
    assert [t.problem_id for t in load_tasks("kernelbench:level1:held-out", source=suite_jsonl)] == [5, 10]
    flat = tmp_path / "flat"
    write(flat / "a.py", task_src("x + 1"))
    assert split_of(load_task_file(flat / "a.py")) is None
    with pytest.raises(TaskError, match="needs tasks with a level and problem id"):
        resolve_suite("kernelbench:held-out", flat)


def test_resolve_suite_bad_source(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match="no such suite source"):
        resolve_suite("kernelbench:level1", tmp_path / "nope")


def test_resolve_suite_env_var(suite_jsonl: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDAL1_KERNELBENCH", str(suite_jsonl))
    assert len(resolve_suite("kernelbench:level1")) == 10


def test_resolve_suite_falls_back_to_hf(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDAL1_KERNELBENCH", raising=False)
    calls = []

    def fake_hf(name: str, level: int | None = None) -> list[Task]:
        calls.append((name, level))
        return [Task("19_ReLU", task_src(), 1, 19, "hf")]

    monkeypatch.setattr(T, "load_task_hf", fake_hf)
    assert [t.task_id for t in resolve_suite("kernelbench:level1/19")] == ["level1/19"]
    assert calls == [("ScalingIntelligence/KernelBench", 1)]


# --- Hugging Face --------------------------------------------------------------------------


def test_load_task_hf_without_datasets(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    from cudal1 import extras

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "datasets" else real(name, *a)
    )
    extras.is_available.cache_clear()  # probes are cached per process: ask again, and forget the answers after
    request.addfinalizer(extras.is_available.cache_clear)
    with pytest.raises(extras.MissingExtra, match=r'pip install "cudal1\[hf\]"'):
        load_task_hf("ScalingIntelligence/KernelBench", level=1)


def test_load_task_hf_offline_reaches_imported_hub(monkeypatch: pytest.MonkeyPatch, hf_hub_imported_online) -> None:
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(T, "_hub_reachable", lambda: False)
    with pytest.raises(TaskError, match="the Hugging Face hub is not reachable") as e:
        load_task_hf("cudal1-tests/never-published", level=1)
    assert "\n" not in str(e.value)
    # read once, at import, by the packages: without these the requests were retried ~20 s
    assert huggingface_hub.constants.is_offline_mode() and huggingface_hub.constants.HF_HUB_OFFLINE is True
    assert datasets.config.HF_HUB_OFFLINE is True and datasets.config.HF_DATASETS_OFFLINE is True


# --- front door ----------------------------------------------------------------------------


def test_load_tasks_dispatch(tmp_path: Path, suite_dir: Path, suite_jsonl: Path) -> None:
    py = write(tmp_path / "19_ReLU.py", task_src())
    assert [t.name for t in load_tasks(py)] == ["19_ReLU"]
    assert [t.name for t in load_tasks(str(py))] == ["19_ReLU"]
    assert len(load_tasks(suite_jsonl)) == 20
    assert len(load_tasks(suite_dir)) == 5
    assert len(load_tasks("kernelbench:level2/3", source=suite_jsonl)) == 1
    assert len(load_tasks("kernelbench", source=suite_dir)) == 5


def test_load_tasks_existing_path_with_colon_is_a_path(tmp_path: Path) -> None:
    path = tmp_path / "kernelbench:level1"
    write(path / "1_A.py", task_src())
    assert [t.name for t in load_tasks(str(path))] == ["1_A"]


def test_load_tasks_errors(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match="no such task file or suite: nowhere/x.py"):
        load_tasks("nowhere/x.py")
    with pytest.raises(TaskError, match="unsupported task file"):
        load_tasks(write(tmp_path / "t.txt", task_src()))
    with pytest.raises(TaskError, match="unknown suite"):
        load_tasks("nosuchsuite:level1")


# --- find_task -----------------------------------------------------------------------------


def test_find_task_by_each_key(suite_dir: Path) -> None:
    tasks = load_task_dir(suite_dir)
    relu = next(t for t in tasks if t.name == "19_ReLU")
    keys = ("level1/19", "19_ReLU", "level1_19", relu.hash[:8], relu.hash, relu.hash[:12].upper())
    for key in keys:
        assert find_task(tasks, key) is relu


def test_find_task_cuda_l1_name(tmp_path: Path) -> None:
    rec = {"level_id": 3, "task_id": 13, "ref_code": task_src()}
    tasks = load_task_jsonl(write_jsonl(tmp_path / "t.jsonl", [rec]))
    assert find_task(tasks, "level3_13") is tasks[0]
    assert find_task(tasks, "level3/13") is tasks[0]


def test_find_task_no_match_and_short_hash(suite_dir: Path) -> None:
    tasks = load_task_dir(suite_dir)
    with pytest.raises(TaskError, match="no task matches 'level9/1'"):
        find_task(tasks, "level9/1")
    with pytest.raises(TaskError, match="no task matches"):
        find_task(tasks, tasks[0].hash[:7])
    with pytest.raises(TaskError, match="no task matches"):
        find_task([], "level1/1")


def test_find_task_ambiguous(tmp_path: Path) -> None:
    a = load_task_file(write(tmp_path / "a" / "level1" / "19_ReLU.py", task_src()))
    b = load_task_file(write(tmp_path / "b" / "level1" / "19_ReLU.py", task_src("x.abs()")))
    with pytest.raises(TaskError, match="ambiguous"):
        find_task([a, b], "level1/19")
    assert find_task([a, a], "19_ReLU") is a  # the same task twice is not ambiguous
