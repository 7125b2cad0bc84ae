"""Peaks, shares of peak and the one-word class of a profiled call.

Contract: :func:`derive` fills a :class:`~cudal1.profile.model.ProgramProfile`'s bandwidth and
FLOP figures and its class from the task's bytes and FLOPs and the device's peaks;
:func:`classify` is the rule, written down once:

1. ``launch-bound`` when the device is busy (some kernel running) for less than
   ``LAUNCH_BUSY`` (50%) of the call's span: launches and host gaps take most of the call.
2. Otherwise, by arithmetic intensity I = FLOPs / bytes moved against the ridge
   R = peak FLOP/s / peak bandwidth (the roofline's corner): ``memory-bound`` when I < R / 2,
   ``compute-bound`` when I > 2 R, ``mixed`` in between.  Equivalently, the achieved share of
   peak bandwidth is at least twice the achieved share of peak FLOP/s (memory) or at most half
   of it (compute).  A call with no FLOPs is ``memory-bound``.
3. ``mixed`` when a peak the rule needs is unknown (the CPU, a GPU not in :data:`PEAK_FLOPS`).

:func:`main_work` says what the kernel time goes to, by kernel name: ``conv`` when kernels named
as convolutions (``conv``, ``fprop``, ``dgrad``, ``wgrad``, ``winograd``: cuDNN's, its implicit
GEMMs included) hold at least ``WORK_SHARE`` (50%) of it, ``gemm``
when matrix products (``gemm``, ``gemv``, ``matmul``, ``cutlass``, not also a convolution) do,
``""`` otherwise.  It tells a compute-bound convolution from a compute-bound matmul.
:func:`work_of` adds ``+tail`` when elementwise kernels (``elementwise_kernel``: PyTorch's;
``triton_poi``: Inductor's pointwise) run at least twice per call and hold at least
``TAIL_SHARE`` (20%) of the kernel time: a chain a fusion pass can turn into one pass over memory
(level2/54's multiply, LeakyReLU and GELU after its convolution: four kernels, 27% on the H200,
fused to 1.19x).

Peak bandwidth is read from the device by the judge (memory clock x bus width, as its physics
floor does: :func:`cudal1.harness.cuda_api.peak_bandwidth`); peak FLOP/s per dtype is a table of
dense datasheet figures for known GPUs (:func:`peak_flops`), matched on the device name.  Under
the judge's strict math mode float32 matmuls do not use TF32, so float32's peak is the CUDA-core
figure.  Bytes and FLOPs are the task's (inputs, outputs and weights once; FlopCounterMode on the
reference), so the candidate's shares say how close its time is to what the task needs.
"""

from __future__ import annotations

from cudal1.profile.model import BoundClass, KernelStat, ProgramProfile

LAUNCH_BUSY = 0.5  # below this share of the call with a kernel running: launch-bound
RIDGE_FACTOR = 2.0  # within this factor of the ridge: mixed
WORK_SHARE = 0.5  # of the kernel time, for main_work's answer
TAIL_SHARE = 0.2  # of the kernel time in two or more elementwise launches, for work_of's "+tail"
ELEMENTWISE_NAMES = ("elementwise_kernel", "triton_poi")
CONV_NAMES = ("conv", "fprop", "dgrad", "wgrad", "winograd")
GEMM_NAMES = ("gemm", "gemv", "matmul", "cutlass")

# Dense peak FLOP/s by device-name fragment and dtype (datasheets; SXM parts; no sparsity).
# float32 is the CUDA-core figure (TF32 off under strict math mode).
PEAK_FLOPS: dict[str, dict[str, float]] = {
    "H200": {"float32": 67e12, "float16": 989e12, "bfloat16": 989e12, "float64": 34e12},
    "H100": {"float32": 67e12, "float16": 989e12, "bfloat16": 989e12, "float64": 34e12},
    "A100": {"float32": 19.5e12, "float16": 312e12, "bfloat16": 312e12, "float64": 9.7e12},
    "L40S": {"float32": 91.6e12, "float16": 362e12, "bfloat16": 362e12},
    "A10": {"float32": 31.2e12, "float16": 125e12, "bfloat16": 125e12},
}


def peak_flops(device_name: str | None, dtype: str) -> float | None:
    """Dense peak FLOP/s of ``dtype`` (``"float32"``, ``"bfloat16"``...) on the named device, or
    None when the device or the dtype is not in the table."""
    if not device_name:
        return None
    for fragment, peaks in PEAK_FLOPS.items():
        if fragment in device_name:
            return peaks.get(dtype)
    return None


def classify(busy_share: float | None, intensity: float | None, ridge: float | None) -> BoundClass:
    """The class of a call (the rule in the module docstring).  ``busy_share``: busy / span;
    ``intensity``: FLOPs per byte; ``ridge``: peak FLOP/s / peak bandwidth."""
    if busy_share is not None and busy_share < LAUNCH_BUSY:
        return BoundClass.LAUNCH
    if intensity is not None and intensity == 0:
        return BoundClass.MEMORY
    if intensity is None or not ridge:
        return BoundClass.MIXED
    if intensity < ridge / RIDGE_FACTOR:
        return BoundClass.MEMORY
    if intensity > ridge * RIDGE_FACTOR:
        return BoundClass.COMPUTE
    return BoundClass.MIXED


def main_work(kernels: list[KernelStat]) -> str:
    """``conv``, ``gemm`` or ``""``: what holds at least :data:`WORK_SHARE` of the kernel time
    (the rule in the module docstring; ``kernels``' shares sum to 1)."""
    conv = gemm = 0.0
    for k in kernels:
        name = k.name.lower()
        if any(n in name for n in CONV_NAMES):
            conv += k.share
        elif any(n in name for n in GEMM_NAMES):
            gemm += k.share
    return "conv" if conv >= WORK_SHARE else "gemm" if gemm >= WORK_SHARE else ""


def fusible_tail(kernels: list[KernelStat]) -> bool:
    """Elementwise kernels launched at least twice in the call hold at least :data:`TAIL_SHARE` of
    its kernel time."""
    elementwise = [k for k in kernels if any(n in k.name.lower() for n in ELEMENTWISE_NAMES)]
    return sum(k.launches for k in elementwise) >= 2 and sum(k.share for k in elementwise) >= TAIL_SHARE


def work_of(kernels: list[KernelStat]) -> str:
    """:func:`main_work`, with ``+tail`` when :func:`fusible_tail`: ``conv+tail``, ``gemm``, ``+tail``,
    ``""``."""
    return main_work(kernels) + ("+tail" if fusible_tail(kernels) else "")


def derive(p: ProgramProfile, bytes_moved: int | None, flops: int | None, peak_bandwidth: float | None,
           peak_flop_rate: float | None) -> ProgramProfile:
    """``p`` with bytes, FLOPs, achieved rates, shares of peak, intensity and class filled in
    (in place; returned for chaining).  A profile that is not ``ok`` is returned unchanged."""
    if not p.ok:
        return p
    p.bytes_moved, p.flops = bytes_moved, flops
    p.peak_bandwidth, p.peak_flops = peak_bandwidth, peak_flop_rate
    seconds = p.call_us * 1e-6
    if seconds > 0 and bytes_moved:
        p.achieved_bandwidth = bytes_moved / seconds
        p.bandwidth_share = p.achieved_bandwidth / peak_bandwidth if peak_bandwidth else None
    if seconds > 0 and flops is not None:
        p.achieved_flops = flops / seconds
        p.flops_share = p.achieved_flops / peak_flop_rate if peak_flop_rate else None
    if bytes_moved and flops is not None:
        p.intensity = flops / bytes_moved
    ridge = peak_flop_rate / peak_bandwidth if peak_flop_rate and peak_bandwidth else None
    busy = p.busy_us / p.call_us if p.call_us > 0 else None
    p.bound = classify(busy, p.intensity, ridge)
    return p
