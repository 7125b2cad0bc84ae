"""Confine the candidate's process: called first thing in the child (single-threaded, before
candidate code and before CUDA is initialised).

:func:`confine` applies what the OS allows and reports each measure (:data:`MEASURES`) as
*applied*, *refused* (with the OS's reason) or *not applicable*; it raises only for misuse.

- ``home_tmp``, ``ownership``: HOME and TMPDIR new, empty, 0700; as root, the build directory,
  HOME and TMPDIR are handed to the candidate's uid (no symlink followed, no multiply-linked file).
- ``netns``: an own network namespace with no interface up (as non-root, inside a new user
  namespace that maps only the process's own ids).
- ``no_new_privs``, ``ids``, ``capabilities``, ``not_dumpable``: as root, drop to an unprivileged
  uid/gid (real, effective, saved; no groups), empty every capability set and the bounding set;
  not dumpable after the id change (which resets that, and clears ``PR_SET_PDEATHSIG``: restored).
  The uid is :func:`uid_for` the build directory, in a range no system or container allocator
  uses: different candidates never share one; identical ones (same build directory) do, and can
  only spoil that source's own verdicts.  Where it cannot reach its directories or ``must_read``
  (default: the interpreter's prefixes, ``sys.path``, the CUDA toolkit; e.g. Python under a 0700
  ``/root``), the process stays uid 0 without capabilities (``ids`` refused, naming the directory
  in the way) and ``writable``'s ``/dev`` and ``/proc`` are narrowed (:meth:`_Paths.at_uid0`).
- ``env``: HOME, TMPDIR (``tempfile``'s cached one too); ``TORCH_EXTENSIONS_DIR``,
  ``TORCHINDUCTOR_CACHE_DIR``, ``TRITON_CACHE_DIR``, ``XDG_CACHE_HOME``, ``CUDA_CACHE_PATH`` inside
  the build directory unless ``cache_env`` says otherwise; secret-looking variables removed.
- ``landlock_fs``: writes only beneath the build directory, HOME, TMPDIR, ``/dev/null`` and
  ``writable``; reads everywhere unless ``readable_only`` lists the readable trees.
  ``landlock_net``: TCP bind/connect refused (ABI >= 4).  ``landlock_scope``: no signals to, or
  abstract Unix sockets of, processes outside (ABI >= 6).  Any Landlock domain also forbids
  ptrace-style access (``/proc/<pid>/mem`` too) to processes outside it.
- ``seccomp`` (x86-64, aarch64): :data:`DENIED_SYSCALLS` fail with EPERM;
  :data:`SELF_ONLY_SYSCALLS` (renice, pin, rlimits, page moves) work only on the caller itself, so
  the reference cannot be slowed from here; foreign ABIs (i386, x32) fail.

Limits: Landlock governs neither device ioctls (the GPU needs them) nor connecting to pathname Unix
sockets; on ABI 1 (Linux 5.13-5.18) renames across directories fail (EXDEV).  ``writable`` paths
are not chowned: the caller makes them accessible to the candidate's uid.  Unprivileged user
namespaces stay available where the kernel allows them.
"""
from __future__ import annotations

import ctypes
import errno
import glob
import hashlib
import os
import platform
import re
import stat
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Mapping, Sequence

from cudal1.harness.child.seccomp import (
    DEFAULT_PROGRAM,
    DENIED_SYSCALLS,
    SELF_ONLY_SYSCALLS,
    SYSCALLS,
    bpf,
    seccomp_program,
)

APPLIED, REFUSED, NOT_APPLICABLE = "applied", "refused", "not applicable"
UID_BASE, UID_SPAN = 1_900_000_000, 100_000_000  # above systemd's container ranges, below 2**31
MEASURES = ("home_tmp", "ownership", "netns", "no_new_privs", "ids", "capabilities", "not_dumpable", "env",
            "landlock_fs", "landlock_net", "landlock_scope", "seccomp")  # the report's names, in order
_SYSTEM_TREES = ("/", "/bin", "/boot", "/etc", "/lib", "/root", "/run", "/sbin", "/sys", "/usr", "/var")
_SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH", re.IGNORECASE)


class ConfineError(ValueError):
    """Misuse of :func:`confine` (bad paths, called with several threads), never an OS refusal."""


@dataclass(frozen=True)
class ConfinePolicy:
    """What the candidate's process may touch.  Paths are resolved against the current directory."""

    build_dir: str | os.PathLike[str]  # must exist; the candidate's own, writable
    home: str | os.PathLike[str]  # new or empty: becomes HOME (0700)
    tmp: str | os.PathLike[str]  # new or empty: becomes TMPDIR (0700)
    writable: Sequence[str | os.PathLike[str]] = ()  # existing paths also writable (job's shared memory, /dev)
    readable_only: Sequence[str | os.PathLike[str]] | None = (
        None  # None: reads everywhere; else only these trees (+ writable)
    )
    uid: int | None = None  # as root: the uid/gid to drop to; None: uid_for(build_dir)
    network: bool = False  # True leaves the network alone
    cache_env: Mapping[str, str] = field(default_factory=dict)  # overrides of the cache variables
    must_read: Sequence[str | os.PathLike[str]] | None = None  # None: interpreter, sys.path, CUDA toolkit
    deny: Sequence[str] = DENIED_SYSCALLS  # syscalls refused with EPERM


@dataclass(frozen=True)
class Measure:
    name: str
    outcome: str  # APPLIED, REFUSED or NOT_APPLICABLE
    detail: str = ""  # what was done, or why not (the OS's reason for a refusal)


@dataclass(frozen=True)
class ConfineReport:
    measures: tuple[Measure, ...]
    uid: int  # the ids the candidate runs under
    gid: int
    elapsed_s: float

    def as_dict(self) -> dict[str, str]:
        """For the verdict's environment: ``{measure: "applied[: ...]" | "refused: ..." | ..., "uid": "u:g"}``."""
        out = {m.name: f"{m.outcome}: {m.detail}" if m.detail else m.outcome for m in self.measures}
        out["uid"] = f"{self.uid}:{self.gid}"
        return out


def uid_for(build_dir: str | os.PathLike[str]) -> int:
    """The candidate uid of a build directory (a hash of its resolved path into the reserved range)."""
    digest = hashlib.blake2b(
        str(Path(build_dir).resolve()).encode(), digest_size=8
    ).digest()  # not OpenSSL: no ms of set-up
    return UID_BASE + int.from_bytes(digest[:8], "big") % UID_SPAN


def gpu_device_files() -> list[str]:
    """NVIDIA's device files (``/dev/nvidia*``, ``/dev/nvidia-caps``), for ``writable``: narrower than
    ``/dev``, whose disks a candidate left at uid 0 could otherwise open for writing."""
    return sorted(glob.glob("/dev/nvidia*"))


def confine(policy: ConfinePolicy) -> ConfineReport:
    """Confine this process for good (see the module docstring); raises :class:`ConfineError` only
    for misuse.  Costs a few milliseconds (plus one ``chown`` per entry of the build directory)."""
    t0 = time.perf_counter()
    if not sys.platform.startswith("linux"):
        return ConfineReport(
            tuple(Measure(n, NOT_APPLICABLE, f"not Linux ({sys.platform})") for n in MEASURES), -1, -1, 0.0
        )
    paths = _Paths.of(policy)
    if (threads := len(os.listdir("/proc/self/task"))) != 1:
        raise ConfineError(f"confine() must run before any other thread starts ({threads} threads)")
    os_ = _Os()
    measures: list[Measure] = []
    for d in (paths.home, paths.tmp):
        _fresh_dir(d)
    measures.append(Measure("home_tmp", APPLIED, f"HOME={paths.home} TMPDIR={paths.tmp} (new, empty, 0700)"))
    root = os.geteuid() == 0
    deathsig = ctypes.c_int(0)
    os_.prctl(2, ctypes.byref(deathsig))  # PR_GET_PDEATHSIG: any change of ids below clears it
    if root:
        uid, note = _pick_uid(paths, policy.uid if policy.uid is not None else uid_for(paths.build))
        gid, blocked = uid, note if uid == 0 else ""
        paths = paths.at_uid0() if uid == 0 else paths
        changed = sum(_give(d, uid, gid) for d in (paths.build, paths.home, paths.tmp))
        measures.append(
            Measure("ownership", APPLIED, f"build dir, HOME, TMPDIR owned by {uid}:{gid} ({changed} entries changed)")
        )
    else:
        uid, gid, blocked, note = -1, -1, "", ""
        measures.append(Measure("ownership", NOT_APPLICABLE, f"not root: the files stay uid {os.geteuid()}'s"))
    measures.append(os_.network_namespace(policy.network, root))
    measures.extend(os_.drop_privileges(root, uid, gid, blocked, note))
    os_.prctl(1, deathsig.value)  # PR_SET_PDEATHSIG again: a parent that died meanwhile is caught below
    if deathsig.value and os.getppid() == 1:
        os._exit(1)
    measures.append(_set_env(policy, paths, uid if root and uid != 0 else None))
    measures.extend(os_.landlock(policy, paths))
    measures.append(os_.seccomp(policy.deny))
    real = os.getresuid()[0], os.getresgid()[0]
    return ConfineReport(tuple(measures), real[0], real[1], time.perf_counter() - t0)


# ---- paths ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Paths:
    build: Path
    home: Path
    tmp: Path
    writable: tuple[Path, ...]
    readable: tuple[Path, ...] | None
    must_read: tuple[Path, ...]
    narrowed: str = ""  # what at_uid0 changed

    @classmethod
    def of(cls, policy: ConfinePolicy) -> "_Paths":
        def abs_(p: str | os.PathLike[str]) -> Path:
            return Path(os.path.abspath(os.fspath(p)))

        build = abs_(policy.build_dir)
        if not build.is_dir():
            raise ConfineError(f"build directory {build} does not exist")
        if policy.uid is not None and not 0 < policy.uid < 2**32 - 1:
            raise ConfineError(f"uid {policy.uid} is not an unprivileged uid")
        writable = tuple(abs_(p) for p in policy.writable)
        if missing := [str(p) for p in writable if not p.exists()]:
            raise ConfineError(f"writable paths do not exist: {', '.join(missing)}")
        readable = None if policy.readable_only is None else tuple(abs_(p) for p in policy.readable_only)
        cuda = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
        default = {sys.prefix, sys.base_prefix, sys.exec_prefix, cuda, *(p for p in sys.path if p)}
        must = [p for p in default if os.path.isdir(p)] if policy.must_read is None else policy.must_read
        must_read = tuple(sorted(abs_(p) for p in must))
        if unknown := sorted(set(policy.deny) - set(SYSCALLS["x86_64"][2])):
            raise ConfineError(f"unknown syscalls to deny: {', '.join(unknown)}")
        return cls(build, abs_(policy.home), abs_(policy.tmp), writable, readable, must_read)

    def at_uid0(self) -> "_Paths":
        """Left at uid 0 (owner of most system files, capabilities or not): ``/dev`` narrowed to NVIDIA's
        device files, ``/proc`` to its own entry (CUDA names its threads there), system trees dropped."""
        keep: list[Path] = []
        said = []
        for p in self.writable:
            if str(p) in ("/dev", "/proc"):
                keep += [Path(f) for f in gpu_device_files()] if str(p) == "/dev" else [Path("/proc/self")]
                said.append(
                    f"{p} narrowed to " + ("NVIDIA's device files" if str(p) == "/dev" else "its own /proc/<pid>")
                )
            elif str(p) in _SYSTEM_TREES:
                said.append(f"{p} dropped")
            else:
                keep.append(p)
        return replace(self, writable=tuple(keep), narrowed="; ".join(said))


def _fresh_dir(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        if not stat.S_ISDIR(os.lstat(path).st_mode) or os.listdir(path):
            raise ConfineError(f"{path} must be a new or empty directory") from None
    os.chmod(path, 0o700)


def _pick_uid(paths: _Paths, wanted: int) -> tuple[int, str]:
    """``(uid, note)``: ``wanted``, or 65534 where ``wanted`` does not exist (a user namespace that
    maps few uids); ``(0, why)`` where neither can reach the candidate's directories and read
    ``must_read``.  Checked with the effective ids switched (single-threaded: nothing else runs
    under them); supplementary groups are dropped first."""
    why = ""
    try:
        os.setgroups([])
    except OSError as exc:
        return 0, f"setgroups: {_reason(exc.errno or 0)}"
    for uid in dict.fromkeys((wanted, 65534)):
        try:
            os.setegid(uid)
            os.seteuid(uid)
        except OSError as exc:
            os.setegid(0)
            why = f"uid {uid}: {_reason(exc.errno or 0)}"
            continue
        try:
            blocked = _unreachable(paths, uid)
        finally:
            os.seteuid(0)
            os.setegid(0)
        return (0, blocked) if blocked else (uid, f"{why}; " if why else "")
    return 0, why


def _unreachable(paths: _Paths, uid: int) -> str:
    """'' when the effective ids can reach the candidate's directories and read ``must_read``;
    else the first directory that stops them."""
    def mode_of(path: Path) -> str:
        return f"mode {stat.S_IMODE(os.stat(path).st_mode):04o}" if os.path.exists(path) else "missing or unreadable"

    def check(path: Path, mode: int) -> str:
        if os.access(path, mode, effective_ids=True):
            return ""
        blocker = next((a for a in reversed(path.parents) if not os.access(a, os.X_OK, effective_ids=True)), None)
        if blocker is not None:
            return f"{blocker} ({mode_of(blocker)}) keeps uid {uid} from {path}"
        return f"uid {uid} cannot {'read' if mode & os.R_OK else 'reach'} {path} ({mode_of(path)})"

    wanted = [(d.parent, os.X_OK) for d in (paths.build, paths.home, paths.tmp)] + [
        (p, os.F_OK) for p in paths.writable
    ]
    wanted += [(p, os.R_OK | (os.X_OK if os.path.isdir(p) else 0)) for p in paths.must_read]
    return next((why for p, mode in wanted if (why := check(p, mode))), "")


def _give(root: Path, uid: int, gid: int) -> int:
    """chown ``root``'s tree to uid:gid without following symlinks; returns the entries changed."""
    changed = 0
    os.chown(root, uid, gid, follow_symlinks=False)
    for _, dirs, files, dirfd in os.fwalk(root, follow_symlinks=False):
        for name in dirs + files:
            st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
            plain = (
                stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode) or (stat.S_ISREG(st.st_mode) and st.st_nlink == 1)
            )
            if plain and (st.st_uid, st.st_gid) != (uid, gid):
                os.chown(name, uid, gid, dir_fd=dirfd, follow_symlinks=False)
                changed += 1
    return changed


def _set_env(policy: ConfinePolicy, paths: _Paths, uid: int | None) -> Measure:
    env = {"HOME": str(paths.home), "TMPDIR": str(paths.tmp), "TMP": str(paths.tmp), "TEMP": str(paths.tmp),
           "TORCH_EXTENSIONS_DIR": str(paths.build), "TORCHINDUCTOR_CACHE_DIR": str(paths.build / "inductor"),
           "TRITON_CACHE_DIR": str(paths.build / "triton"), "XDG_CACHE_HOME": str(paths.build / "xdg-cache"),
           "CUDA_CACHE_PATH": str(paths.build / "nv-compute-cache")}
    if uid is not None:  # getpass.getuser() (torch's default cache paths) has no passwd entry to find
        env["USER"] = env["LOGNAME"] = f"cudal1-{uid}"
    env.update(policy.cache_env)
    removed = sorted(name for name in os.environ if _SECRET.search(name) and name not in env)
    for name in removed:
        del os.environ[name]
    os.environ.update(env)
    tempfile.tempdir = str(paths.tmp)  # tempfile caches the directory it found first (the forkserver's)
    return Measure(
        "env", APPLIED, "HOME, TMPDIR and caches set" + (f"; removed {', '.join(removed)}" if removed else "")
    )


# ---- the OS calls --------------------------------------------------------------------------------

_LANDLOCK_CREATE, _LANDLOCK_ADD_RULE, _LANDLOCK_RESTRICT = 444, 445, 446  # same on every architecture
_FS_EXECUTE, _FS_WRITE_FILE, _FS_READ_FILE, _FS_READ_DIR, _FS_REFER, _FS_TRUNCATE = 1, 2, 4, 8, 1 << 13, 1 << 14
_FS_WRITE_V1 = _FS_WRITE_FILE | sum(1 << b for b in range(4, 13))  # remove and make_* (dir, reg, sym, ...)
_FS_READ = _FS_EXECUTE | _FS_READ_FILE | _FS_READ_DIR
_FS_FILE_ONLY = _FS_EXECUTE | _FS_WRITE_FILE | _FS_READ_FILE | _FS_TRUNCATE  # rights a rule on a file may hold
_NET_TCP, _SCOPES = 0b11, 0b11  # TCP bind and connect; abstract unix sockets and signals
_CLONE_NEWUSER, _CLONE_NEWNET = 0x10000000, 0x40000000


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("fd", ctypes.c_int32)]


def _reason(err: int) -> str:
    return f"{errno.errorcode.get(err, str(err))} ({os.strerror(err)})"


class _Os:
    """The raw calls, each returning -1 and leaving the reason in ``errno`` as libc does."""

    libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None  # loaded in the forkserver

    def _call(self, fn: Callable[..., int], *args: object) -> int:
        ctypes.set_errno(0)
        return fn(*(ctypes.c_ulong(a) if isinstance(a, int) else a for a in args))

    def prctl(self, *args: object) -> int:
        return self._call(self.libc.prctl, *args, *([0] * (5 - len(args))))

    def syscall(self, nr: int, *args: object) -> int:
        return self._call(self.libc.syscall, nr, *args)

    def failed(self, name: str, detail: str = "") -> Measure:  # right after the call that failed
        return Measure(name, REFUSED, (detail + ": " if detail else "") + _reason(ctypes.get_errno()))

    def network_namespace(self, allowed: bool, root: bool) -> Measure:
        if allowed:
            return Measure("netns", NOT_APPLICABLE, "the policy allows network")
        if root:
            if self._call(self.libc.unshare, _CLONE_NEWNET) != 0:
                return self.failed("netns", "unshare(CLONE_NEWNET)")
            return Measure("netns", APPLIED, "own network namespace, no interface up")
        uid, gid = os.geteuid(), os.getegid()
        self.prctl(4, 1)  # dumpable for now: a non-dumpable process cannot write its own id maps
        if self._call(self.libc.unshare, _CLONE_NEWUSER | _CLONE_NEWNET) != 0:
            return self.failed("netns", "unshare(CLONE_NEWUSER|CLONE_NEWNET)")
        try:  # map only our own ids, so files and the uid look the same as before
            for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
                with open(f"/proc/self/{name}", "w") as f:
                    f.write(text)
        except OSError as exc:
            return Measure("netns", APPLIED, f"own user and network namespaces; id maps not written ({exc.strerror})")
        return Measure("netns", APPLIED, "own user and network namespaces (own ids mapped), no interface up")

    def drop_privileges(self, root: bool, uid: int, gid: int, blocked: str, note: str) -> list[Measure]:
        out: list[Measure] = []
        if root:
            for cap in range(64):  # PR_CAPBSET_DROP until EINVAL (past the kernel's last capability)
                if self.prctl(24, cap) != 0 and ctypes.get_errno() == errno.EINVAL:
                    break
        out.append(Measure("no_new_privs", APPLIED) if self.prctl(38, 1) == 0 else self.failed("no_new_privs"))
        if not root:
            out.append(Measure("ids", NOT_APPLICABLE, f"not root: runs as uid {os.geteuid()}"))
        elif blocked:
            out.append(Measure("ids", REFUSED, f"{blocked}; stays uid 0 without capabilities"))
        else:
            try:
                os.setresgid(gid, gid, gid)
                os.setresuid(uid, uid, uid)
                out.append(Measure("ids", APPLIED, f"{note}uid {uid} gid {gid}, no supplementary groups"))
            except OSError as exc:
                out.append(
                    Measure(
                        "ids", REFUSED, f"setresuid({uid}): {_reason(exc.errno or 0)}; stays uid 0 without capabilities"
                    )
                )
        if os.geteuid() == 0:
            self.prctl(28, 0x2F)  # PR_SET_SECUREBITS: NOROOT, NO_SETUID_FIXUP (locked), KEEP_CAPS_LOCKED
        with open("/proc/self/status") as f:
            had = "CapEff:\t0000000000000000" not in f.read()
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
        if (
            self._call(self.libc.capset, header, (ctypes.c_uint32 * 6)()) != 0
        ):  # 2 x (effective, permitted, inheritable)
            out.append(self.failed("capabilities", "capset"))
        elif had or root:
            out.append(Measure("capabilities", APPLIED, "every set empty" + (", bounding set too" if root else "")))
        else:
            out.append(Measure("capabilities", NOT_APPLICABLE, "none held"))
        # PR_SET_DUMPABLE, after the id change (which resets it)
        out.append(Measure("not_dumpable", APPLIED) if self.prctl(4, 0) == 0 else self.failed("not_dumpable"))
        return out

    def landlock(self, policy: ConfinePolicy, paths: _Paths) -> list[Measure]:
        names = ("landlock_fs", "landlock_net", "landlock_scope")
        abi = self.syscall(_LANDLOCK_CREATE, None, 0, 1)  # LANDLOCK_CREATE_RULESET_VERSION
        if abi < 0:
            err = ctypes.get_errno()
            why = {errno.ENOSYS: "this kernel has no Landlock", errno.EOPNOTSUPP: "Landlock is disabled at boot"}
            return [Measure(n, NOT_APPLICABLE, why.get(err, _reason(err))) for n in names]
        fs = _FS_WRITE_V1 | (_FS_REFER if abi >= 2 else 0) | (_FS_TRUNCATE if abi >= 3 else 0)
        fs |= _FS_READ if paths.readable is not None else 0
        net = _NET_TCP if abi >= 4 and not policy.network else 0
        scoped = _SCOPES if abi >= 6 else 0
        writable = [
            paths.build, paths.home, paths.tmp, *paths.writable,
            *[Path(os.devnull)] * os.path.exists(os.devnull),
        ]
        rules = [(p, fs) for p in writable] + [(p, _FS_READ) for p in paths.readable or () if p.exists()]
        problem = self._restrict(_RulesetAttr(fs, net, scoped), 8 if abi < 4 else 16 if abi < 6 else 24, rules)
        if problem:
            return [Measure(names[0], REFUSED, f"ABI {abi}: {problem}"),
                    *(Measure(n, NOT_APPLICABLE, "no Landlock domain") for n in names[1:])]
        reads = (
            "reads everywhere"
            if paths.readable is None
            else f"reads only beneath {len(paths.readable)} listed paths and those"
        )
        extra = ", ".join(map(str, paths.writable)) or "nothing else"
        return [
            Measure(
                names[0],
                APPLIED,
                f"ABI {abi}: writes only beneath its own directories, /dev/null and {extra}; {reads}"
                + (f"; uid 0: {paths.narrowed}" if paths.narrowed else "")
                + ("; renames across directories fail (ABI 1)" if abi == 1 else ""),
            ),
            Measure(names[1], APPLIED, "TCP bind and connect refused")
            if net
            else Measure(names[1], NOT_APPLICABLE, "the policy allows network" if policy.network else f"ABI {abi} < 4"),
            Measure(names[2], APPLIED, "no signals or abstract Unix sockets outside")
            if scoped
            else Measure(names[2], NOT_APPLICABLE, f"ABI {abi} < 6"),
        ]

    def _restrict(self, attr: _RulesetAttr, size: int, rules: list[tuple[Path, int]]) -> str:
        """Create the ruleset, add ``rules`` (path beneath -> rights) and enforce it; '' or what failed."""
        ruleset = self.syscall(_LANDLOCK_CREATE, ctypes.byref(attr), size, 0)
        if ruleset < 0:
            return f"create_ruleset: {_reason(ctypes.get_errno())}"
        try:
            for path, rights in rules:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                try:
                    allowed = rights if stat.S_ISDIR(os.fstat(fd).st_mode) else rights & _FS_FILE_ONLY
                    if self.syscall(
                        _LANDLOCK_ADD_RULE, ruleset, 1, ctypes.byref(_PathBeneath(allowed & attr.fs, fd)), 0
                    ):
                        return f"add_rule {path}: {_reason(ctypes.get_errno())}"
                finally:
                    os.close(fd)
            if self.syscall(_LANDLOCK_RESTRICT, ruleset, 0) != 0:
                return f"restrict_self: {_reason(ctypes.get_errno())}"
            return ""
        finally:
            os.close(ruleset)

    def seccomp(self, deny: Sequence[str]) -> Measure:
        machine = platform.machine()
        if machine not in SYSCALLS:
            return Measure("seccomp", NOT_APPLICABLE, f"no syscall table for {machine}")
        program = (
            DEFAULT_PROGRAM if tuple(deny) == DENIED_SYSCALLS and DEFAULT_PROGRAM else seccomp_program(machine, deny)
        )
        if self.prctl(22, 2, ctypes.byref(bpf(program))) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
            return self.failed("seccomp")
        return Measure("seccomp", APPLIED, f"{machine}: {', '.join(deny)}, unsetting the subreaper -> EPERM; "
                                           f"{', '.join(SELF_ONLY_SYSCALLS)} on itself only; foreign ABIs refused")
