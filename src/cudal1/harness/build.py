"""Build cache keys and ahead-of-time candidate builds.

Contract: a candidate's ``load_inline`` extensions are built in ``<cache>/builds/<key>`` where
``key`` hashes the candidate source, torch and CUDA versions, the target architectures and the
Python version, so an identical candidate is never built twice (across runs too) and two
different candidates never share a directory.  ``TORCH_EXTENSIONS_DIR`` and
``TORCH_CUDA_ARCH_LIST`` are set identically for the CPU pre-build and the GPU worker, so the
GPU worker finds the pre-built library and ninja has nothing to do.

Pre-building imports the candidate in a sandboxed CPU child with no GPU visible, in which
``torch.cuda.is_available()`` is made true (:func:`pretend_gpu`) so GPU-guarded builds happen; a
source that builds lazily (inside ``ModelNew.__init__``, a helper, or ``forward``) is imported
with a tail that constructs ``ModelNew`` and calls it on data-free fake CUDA tensors
(:func:`prebuild_source`).  Builds the tail cannot reach and Triton kernels (compiled at first
launch) are built in the GPU worker, under its deadlines.  Pre-build and GPU worker both start in
the candidate's own directory ``<build dir>/cwd``, so a relative ``build_directory=`` is shared.
The parent holds :func:`locked` on the build directory around a pre-build, so processes sharing
the cache build a source once; a pre-build that imported cleanly is recorded beside the directory
(:func:`mark_prebuilt`), and a later judge of the same source skips its pre-build child.

Failed builds are memoised too (inside the worker, :func:`install_memo`): an identical candidate
must never be built twice, failures included.  A candidate whose ``load_inline`` fails inside
``try/except`` (then falls back to PyTorch) would otherwise pay the full nvcc time again on every
evaluation.  The wrapped ``load_inline``/``load`` remember a failure in the build directory
(already keyed by source and toolchain) and replay it as the same exception text; the failure
is also recorded (``failed_builds``) so the verdict can carry ``pytorch_fallback`` when the
candidate went on without its kernel.  The record is keyed by what the call compiles, not by the
extension's name, and lives in the call's own ``build_directory`` when it gives one.  A process id
inside an extension's name (common: ``f"ext_{os.getpid()}"``) is replaced by ``pid``, so the GPU
worker loads what the pre-build compiled instead of compiling it again under a new name.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import importlib.abc
import importlib.machinery
import importlib.metadata
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from cudal1 import __version__
from cudal1.types import Candidate, content_hash

_BUILD_MARKERS = ("load_inline", "cpp_extension", "torch.utils.cpp_extension")


def needs_build(candidate: Candidate) -> bool:
    """Whether the source compiles C++/CUDA extensions (cheap textual check, no execution)."""
    return any(marker in candidate.source for marker in _BUILD_MARKERS)


def builds_lazily(source: str) -> bool:
    """Whether a ``load_inline``/``load`` call sits inside a function or class (``ModelNew.__init__``,
    a helper it calls, ``forward``) rather than at module level, where importing builds it (AST
    only, no execution; unparsable source: False)."""
    import ast

    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    owners = {"cpp_extension"}  # names bound to torch.utils.cpp_extension
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            owners |= {a.asname for a in node.names if a.asname and a.name.endswith("cpp_extension")}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for call in ast.walk(node):
                if isinstance(call, ast.Call) and _is_extension_build(call.func, owners):
                    return True
    return False


def _is_extension_build(fn: Any, owners: set[str]) -> bool:
    """``load_inline(...)``, ``x.load_inline(...)``, ``load(...)`` or ``<cpp_extension>.load(...)``
    (not ``tl.load``, ``torch.load``, ``json.load``)."""
    import ast

    if isinstance(fn, ast.Name):
        return fn.id in ("load_inline", "load")
    if isinstance(fn, ast.Attribute):
        if fn.attr == "load_inline":
            return True
        owner = (
            fn.value.attr
            if isinstance(fn.value, ast.Attribute)
            else fn.value.id
            if isinstance(fn.value, ast.Name)
            else ""
        )
        return fn.attr == "load" and owner in owners
    return False


_CONSTRUCT_TAIL = """

# ---- appended by the judge for the CPU pre-build only (never in a timed run) ----
def _cudal1_prebuild_reach_builds():
    import sys as _sys
    import torch as _torch
    _ref = _sys.modules.get(%(ref)r)
    try:
        _init = list(_ref.get_init_inputs()) if _ref is not None else []
    except BaseException:
        _init = []
    try:  # builds in __init__ and in forward: data-free tensors that claim to live on the GPU
        import torch._subclasses.fake_tensor as _fake_tensor
        from torch._subclasses.fake_tensor import FakeTensorMode as _Fake

        # torch <= 2.12 warms a real CUDA context for every fake CUDA tensor when is_available()
        # says yes (it does here: pretend_gpu); there is no GPU to warm.
        _fake_tensor.init_gpu_context = lambda device: None

        class _NoDevice(_Fake):
            @property
            def avoid_device_init(self):  # no GPU here, whatever torch.cuda.is_available says
                return True

        def _on_gpu(t):
            if isinstance(t, _torch.Tensor):
                return _torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cuda")
            return t

        with _NoDevice(allow_non_fake_inputs=True):
            _model = ModelNew(*[_on_gpu(x) for x in _init])
            for _m in _model.modules():
                for _n, _p in list(_m._parameters.items()):
                    if _p is not None:
                        _m._parameters[_n] = _torch.nn.Parameter(_on_gpu(_p), requires_grad=_p.requires_grad)
                for _n, _b in list(_m._buffers.items()):
                    if _b is not None:
                        _m._buffers[_n] = _on_gpu(_b)
            _args = [_on_gpu(x) for x in _ref.get_inputs()]
            with _torch.no_grad():
                _model(*_args)
        return
    except BaseException:  # after the build (or its cached failure), nothing here matters
        pass
    try:  # fake tensors unavailable or construction refused them: parameters on the meta device
        with _torch.device("meta"):
            ModelNew(*_init)
    except BaseException:
        pass


_cudal1_prebuild_reach_builds()
del _cudal1_prebuild_reach_builds
"""


def prebuild_source(source: str, reference_module: str) -> str:
    """The candidate as the CPU pre-build imports it: when it builds lazily
    (:func:`builds_lazily`), followed by a tail that constructs ``ModelNew`` and calls it once on
    data-free fake tensors that report a CUDA device (``FakeTensorMode``; parameters and buffers
    moved to the fake device), so extensions built in ``__init__``, in helpers, or first reached in
    ``forward`` behind ``x.is_cuda`` checks land in the build cache before a GPU lane needs them.
    Where fake tensors fail before the build, ``ModelNew`` is constructed on the ``meta`` device.
    The pre-build child also reports a GPU to ``torch.cuda.is_available`` (:func:`pretend_gpu`).
    Exceptions of the tail are ignored (a failed build is remembered by :func:`install_memo` and
    replayed in the GPU worker, which gives the verdict).  Not reached: builds behind checks the
    fakes do not satisfy (device properties, values of the data)."""
    if not builds_lazily(source):
        return source
    return source + _CONSTRUCT_TAIL % {"ref": reference_module}


def pretend_gpu() -> None:
    """In the CPU pre-build child (no GPU visible): make ``torch.cuda.is_available()`` true and
    ``device_count()`` at least 1, so candidate code takes its GPU path (``if
    torch.cuda.is_available(): ext = load_inline(...)``) and builds there instead of in a timing
    lane.  Never called in a GPU worker."""
    import torch

    torch.cuda.is_available = lambda: True
    real_count = torch.cuda.device_count
    torch.cuda.device_count = lambda: max(1, real_count())


@functools.lru_cache(maxsize=1)
def toolchain_id() -> str:
    """torch + CUDA + Python versions, read without importing torch where possible."""
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = "none"
    try:
        import torch

        cuda = str(torch.version.cuda)
    except ImportError:
        cuda = "none"
    return f"torch={torch_version};cuda={cuda};py={platform.python_version()};cudal1={__version__}"


def build_dir(cache_root: Path, candidate: Candidate, arch_list: str) -> Path:
    key = content_hash("build", candidate.source, toolchain_id(), arch_list)[:24]
    return cache_root / "builds" / key


def baseline_dir(cache_root: Path, task_source: str, arch_list: str) -> Path:
    """The torch.compile/Triton cache of one task's baselines (``EvalConfig.baseline_cache``):
    only processes running that task's reference under a baseline mode write there, so a
    candidate can never reach what a baseline loads."""
    key = content_hash("baseline", task_source, toolchain_id(), arch_list)[:24]
    return cache_root / "baselines" / key


def has_built_library(path: Path) -> bool:
    return path.is_dir() and any(path.rglob("*.so"))


def _prebuilt_record(path: Path) -> Path:
    return path.with_name(path.name + ".prebuilt")  # beside the build directory: no candidate writes there


def mark_prebuilt(path: Path) -> None:
    """Record (in the parent) that a pre-build of this directory's source imported cleanly: the
    next judge of the same source skips its pre-build child (its extensions, or its memoised
    build failures, are already in the directory for the GPU worker's import).  The record sits
    beside the build directory, where a confined candidate cannot write; a missing record only
    costs a pre-build."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(_prebuilt_record(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    except OSError:
        return
    with os.fdopen(fd, "w") as f:
        f.write(toolchain_id() + "\n")


def was_prebuilt(path: Path) -> bool:
    return _prebuilt_record(path).is_file() and path.is_dir()  # a removed directory is built again


# ---- cross-process safety of a build directory (runs in the parent) ------------------------

LOCK_NAME = ".cudal1.lock"
_BATON = "lock"  # torch.utils.file_baton.FileBaton's file in each extension's own directory


@contextlib.contextmanager
def locked(path: Path) -> Iterator[float]:
    """Hold an exclusive ``flock`` on ``path/.cudal1.lock`` (created if needed) for the block;
    yields the seconds spent waiting for it.  Processes sharing a build cache (two runs, two
    judges) take it around a pre-build, so one source is built by one of them while the other
    waits and then finds the library.  The kernel drops the lock when its holder dies, so a
    killed judge leaves no stale lock (unlike torch's own ``FileBaton``, see
    :func:`clear_stale_batons`)."""
    path.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield time.monotonic() - t0
    finally:
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


def clear_stale_batons(path: Path, *, older_than_s: float | None = None, since: float | None = None) -> list[Path]:
    """Remove torch ``FileBaton`` files (``<ext>/lock``) under the build directory ``path`` that
    a killed build left behind: ``load_inline`` waits for such a file to disappear, forever, so
    one timed-out build would time out every later build of the same source.  Call it only while
    holding :func:`locked` on ``path``.  ``older_than_s``: batons older than that (no judged
    build lives longer than its build deadline); ``since`` (a ``time.time()``): batons made at or
    after it (by the build that was just killed).  Returns what was removed."""
    removed: list[Path] = []
    if not path.is_dir():
        return removed
    now = time.time()
    for baton in path.glob(f"*/{_BATON}"):
        try:
            mtime = baton.stat().st_mtime
        except OSError:
            continue
        stale = (older_than_s is not None and now - mtime > older_than_s) or (
            since is not None and mtime >= since - 1.0
        )
        if stale:
            baton.unlink(missing_ok=True)
            removed.append(baton)
    return removed


# ---- failed-build memo (runs inside the worker) -------------------------------------------

_MARKER = ".cudal1_build_failed"
failed_builds: list[str] = []
_NOT_INPUTS = ("name", "verbose", "build_directory", "keep_intermediates")  # do not change what is compiled


def _build_inputs(args: tuple, kwargs: dict[str, Any]) -> str:
    """A digest of what a ``load_inline``/``load`` call compiles: its sources (the contents of
    source files for ``load``), flags and options, and the toolchain — not the extension's name,
    so a name made per process (``f"ext_{os.getpid()}"``) still finds its recorded failure."""
    parts: list[str] = [toolchain_id(), repr(args[1:])]
    for key in sorted(k for k in kwargs if k not in _NOT_INPUTS):
        parts.append(f"{key}={kwargs[key]!r}")
    sources = kwargs.get("sources", args[1] if len(args) > 1 else None)
    for src in [sources] if isinstance(sources, str) else sources if isinstance(sources, (list, tuple)) else []:
        try:  # ``load``'s source files (``load_inline``'s source strings are no paths: skipped)
            if len(str(src)) < 4096 and Path(str(src)).is_file():
                parts.append(Path(str(src)).read_text(errors="replace"))
        except (OSError, ValueError):
            pass
    return content_hash("build-inputs", *parts)[:24]


def _marker(args: tuple, kwargs: dict[str, Any]) -> Path | None:
    """Where a failed build of these inputs is recorded: the call's own ``build_directory`` (a
    relative one lies in the candidate's directory, see the module docstring), else the
    candidate's ``TORCH_EXTENSIONS_DIR``.  None when neither is known."""
    root = kwargs.get("build_directory") or os.environ.get("TORCH_EXTENSIONS_DIR")
    return Path(root) / f"{_MARKER}-{_build_inputs(args, kwargs)}" if root else None


def _stable_name(args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """The call with this process's id in the extension name replaced by ``pid``: a name made per
    process (``f"ext_{os.getpid()}"``) would be a new extension, built again, in every process,
    the pre-build's work wasted.  The candidate uses the returned module, not its name."""
    pid = str(os.getpid())
    if isinstance(kwargs.get("name"), str) and pid in kwargs["name"]:
        kwargs = {**kwargs, "name": kwargs["name"].replace(pid, "pid")}
    elif args and isinstance(args[0], str) and pid in args[0]:
        args = (args[0].replace(pid, "pid"), *args[1:])
    return args, kwargs


def _memoize(fn: Callable[..., Any], building: Callable[[bool], None]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        args, kwargs = _stable_name(args, kwargs)
        name = str(kwargs.get("name", args[0] if args else ""))
        try:
            marker = _marker(args, kwargs)
        except Exception:  # noqa: BLE001 - unhashable oddities: no memo, the build itself decides
            marker = None
        if marker is not None and marker.is_file():
            failed_builds.append(name)
            raise RuntimeError(f"Error building extension '{name}' (cached failure): " + marker.read_text()[-8000:])
        building(True)  # a build inside ModelNew.__init__ runs under the build deadline
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            failed_builds.append(name)
            if marker is not None and "Error building extension" in str(exc):
                try:
                    marker.parent.mkdir(parents=True, exist_ok=True)
                    marker.write_text(str(exc)[-20000:])
                except OSError:
                    pass
            raise
        finally:
            building(False)

    return wrapper


_EXTENSIONS = "torch.utils.cpp_extension"


def install_memo(building: Callable[[bool], None] = lambda on: None) -> None:
    """Wrap the extension loaders; ``building(True/False)`` is told when a build starts/ends.
    The wrapping happens now if ``torch.utils.cpp_extension`` is imported, else as its import
    finishes (:class:`_WrapOnImport`): importing it costs about a quarter of a second (setuptools),
    which a candidate that builds nothing should not pay, and it cannot be preloaded before the
    fork (it initialises CUDA)."""
    module = sys.modules.get(_EXTENSIONS)
    if module is not None:
        _wrap_loaders(module, building)
    elif not any(isinstance(f, _WrapOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _WrapOnImport(building))


def _wrap_loaders(module: Any, building: Callable[[bool], None]) -> None:
    for attr in ("load_inline", "load"):
        original = getattr(module, attr)
        if not getattr(original, "_cudal1_memo", False):
            wrapped = _memoize(original, building)
            wrapped._cudal1_memo = True  # type: ignore[attr-defined]
            setattr(module, attr, wrapped)


class _WrapOnImport(importlib.abc.MetaPathFinder):
    """Finds ``torch.utils.cpp_extension`` like the path finder does, with a loader that wraps
    its loaders right after the module's own code ran (before any importer sees the module)."""

    def __init__(self, building: Callable[[bool], None]) -> None:
        self.building = building

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != _EXTENSIONS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _WrappingLoader(spec.loader, self.building)
        return spec


class _WrappingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, building: Callable[[bool], None]) -> None:
        self.loader, self.building = loader, building

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        _wrap_loaders(module, self.building)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ... (tracebacks, inspect)
        return getattr(self.loader, name)
