"""Device facts: what a candidate may ask of the device, read from the jax device.

``DeviceInfo`` is platform, kind, memory, compute capability, CPU features and the GPU
limits a kernel family sizes its tiles and cost model by (multiprocessor count, shared
memory per block). ``device_info(jax_device)`` reads them from the device; where a GPU
does not report a limit, the measured H200 values below stand in.

    >>> import jax
    >>> from jax_autotune.tuning.device import device_info
    >>> device_info(jax.devices("cpu")[0]).platform
    'cpu'
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import platform as host

# Where a GPU does not report its limits: the H200's (132 SMs, measured), and CUDA's
# opt-in shared memory per block by compute capability (sm_90: H100/H200).
H200_SM_COUNT = 132
SHARED_MEMORY_PER_BLOCK = {(9, 0): 232_448, (8, 0): 166_912, (8, 6): 101_376, (8, 7): 166_912,
                           (8, 9): 101_376}
MIN_SHARED_MEMORY_PER_BLOCK = 49_152  # every CUDA GPU
_CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97


def shared_memory_for_capability(capability: tuple[int, int] | None) -> int:
    """Shared memory per block (bytes) of a compute capability; sm_90 and later: Hopper's."""
    capability = capability or (0, 0)
    if capability >= (9, 0):
        return SHARED_MEMORY_PER_BLOCK[(9, 0)]
    return SHARED_MEMORY_PER_BLOCK.get(capability, MIN_SHARED_MEMORY_PER_BLOCK)


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """What a candidate may ask of the device: platform, kind and capabilities."""

    platform: str  # "cpu" | "gpu" | "tpu"
    device_kind: str  # e.g. "cpu", "NVIDIA H200"
    memory_bytes: int = 0
    compute_capability: tuple[int, int] | None = None  # GPUs only, e.g. (9, 0)
    features: frozenset[str] = frozenset()  # e.g. {"avx2", "avx512f"} or {"wgmma", "tma"}
    sm_count: int | None = None  # GPUs: multiprocessors, when the device reports them
    shared_memory_per_block: int | None = None  # GPUs: bytes, when the driver reports it
    isa: str = ""  # CPUs: the native kernels' effective ISA ('' where they are not built)

    @property
    def fingerprint(self) -> str:
        """Names platform, device kind, memory size and (CPUs) the native kernels' ISA;
        namespaces tables and probes, so a decision for one ISA is never read under another.

            >>> DeviceInfo("cpu", "AMD EPYC x2", isa="avx2").fingerprint
            'cpu-AMD-EPYC-x2-mem0-avx2'
        """
        kind = "".join(c if c.isalnum() else "-" for c in self.device_kind)
        isa = f"-{self.isa}" if self.isa else ""
        return f"{self.platform}-{kind}-mem{self.memory_bytes}{isa}"

    @property
    def multiprocessors(self) -> int:
        """The SM count, or the H200's where the device does not say."""
        return self.sm_count or H200_SM_COUNT

    @property
    def shared_memory_limit(self) -> int:
        """Shared memory one block may use, from the driver or the compute capability."""
        return self.shared_memory_per_block or shared_memory_for_capability(self.compute_capability)


def device_info(jax_device, cpu_features: frozenset[str] = frozenset(), isa: str = "") -> DeviceInfo:
    """Describe a jax device; ``cpu_features`` and ``isa`` are what the native kernels may
    use here (``native.cpu_features()``, ``native.isa()``)."""
    platform = jax_device.platform
    if platform == "cpu":
        return DeviceInfo("cpu", cpu_model(), 0, None, cpu_features, isa=isa)
    memory = 0
    try:
        memory = int((jax_device.memory_stats() or {}).get("bytes_limit", 0))
    except Exception:  # noqa: BLE001 - a device without memory stats
        pass
    capability = None
    raw = getattr(jax_device, "compute_capability", None)
    if raw:
        major, _, minor = str(raw).partition(".")
        capability = (int(major), int(minor or 0))
    is_gpu = platform in ("gpu", "cuda", "rocm")
    return DeviceInfo("gpu" if is_gpu else platform, jax_device.device_kind, memory, capability,
                      frozenset(), sm_count=getattr(jax_device, "core_count", None) or None,
                      shared_memory_per_block=_cuda_shared_memory(jax_device) if is_gpu else None)


def cpu_model() -> str:
    """The CPU's model name and core count, e.g. ``AMD EPYC 7B13 x2``."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()} x{os.cpu_count()}"
    except OSError:
        pass
    return f"{host.processor() or host.machine()} x{os.cpu_count()}"


def _cuda_shared_memory(jax_device) -> int | None:
    """The driver's opt-in shared memory per block of this CUDA device, or None."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        handle, value = ctypes.c_int(), ctypes.c_int()
        ordinal = int(getattr(jax_device, "local_hardware_id", None) or 0)
        if (cuda.cuInit(0) != 0 or cuda.cuDeviceGet(ctypes.byref(handle), ordinal) != 0
                or cuda.cuDeviceGetAttribute(
                    ctypes.byref(value), _CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                    handle) != 0):
            return None
        return value.value or None
    except (OSError, AttributeError, TypeError, ValueError):
        return None
