"""Internal: the registry, one Tuner per platform, holding that platform's kernel family.

The process's tuning state is one object, ``RUNTIME`` (a ``Runtime``): its tuners, the
store each uses, the JAX compilation-cache settings in effect, and through ``reset()`` the
program records and counters. ``RUNTIME.tuner_for(platform)`` (also ``tuner_for``) builds
the process's tuner for a platform once: the device's facts (``tuning.device``), the
family's candidate set (``kernels.cpu`` on CPUs, ``kernels.gpu`` on GPUs, XLA's dot alone
elsewhere) and the configured store (``config.store_choice()``). When ``cache``,
``cache_dir``, ``environment`` or ``store`` change, the tuner switches to that store. With a
disk store (SQLite or directory), ``compilation_cache`` on and ``mode`` not off, JAX's
persistent compilation cache is pointed beside the store (``tuning.compile_cache``) the
first time a tuner is asked for (a tuned matmul lowering, ``warmup``, a table loaded),
never at import: importing the package changes nothing in JAX.

    >>> from jax_autotune.registry import RUNTIME
    >>> tuner = RUNTIME.tuner_for("cpu")
    >>> tuner.select(problem).winner
    'native_small_avx2_t1'
    >>> RUNTIME.reset()                       # a clean slate (tests)

A lowering asks ``lowering_tuner(platform)``: the tuner and the compile's ``Policy``
(``config.compile_policy()``, read once there and passed to every tuner call), or None
for XLA's dot (mode off, a bad setting).

Grouped matmuls (``lax.ragged_dot``) have a tuner of their own per platform
(``ragged_tuner_for``): the grouped candidates (``kernels.ragged``), the dense tuner's
store and probes; its decisions sit beside the dense ones in the store, under their own
candidate-set checksum.
"""

from __future__ import annotations

import threading
import warnings

import jax

import jax_autotune.config as config
from jax_autotune.errors import ConfigError, NativeKernelsWarning
from jax_autotune.kernels.ragged import ragged_candidate_set
from jax_autotune.kernels.xla import XLA_DOT
from jax_autotune.tuning import compile_cache
from jax_autotune.tuning.candidates import CandidateSet, CandidateSetBuilder
from jax_autotune.tuning.device import DeviceInfo, device_info
from jax_autotune.tuning import attention_decisions, counters, programs
from jax_autotune.tuning.policy import Policy
from jax_autotune.tuning.store import StoreChoice, open_store
from jax_autotune.tuning.tuner import Tuner

_warned_native = False


def native_module(platform: str):
    """The native CPU kernel module where the extension is built, else None (on a CPU,
    with one ``NativeKernelsWarning`` per process saying how to build it).

    Imported here, not at module level: a source checkout without the built extension
    (or a GPU-only process) must still import the package.
    """
    global _warned_native
    if platform != "cpu":
        return None
    try:
        from jax_autotune.kernels.cpu import native
    except ImportError as err:
        if not _warned_native:
            _warned_native = True
            warnings.warn(f"jax_autotune: the native CPU kernels are not built ({err}); CPU "
                          f"matmuls use XLA's dot only. To build them in a source checkout: "
                          f"pip install --no-build-isolation -e . (see BUILD.md)",
                          NativeKernelsWarning, stacklevel=2)
        return None
    return native


def candidate_set_for(device: DeviceInfo) -> CandidateSet:
    """The candidate set of a device; XLA's dot alone where no family applies.

    A family is imported only for its platform: the GPU kernels never load on a CPU-only
    process, the native extension never on a GPU-only one.
    """
    try:
        if device.platform == "cpu":
            from jax_autotune.kernels.cpu.candidates import cpu_candidate_set
            return cpu_candidate_set(device)
        if device.platform == "gpu":
            from jax_autotune.kernels.gpu.candidates import gpu_candidate_set
            return gpu_candidate_set(device)
    except ImportError:
        pass
    builder = CandidateSetBuilder(device.platform, device.device_kind)
    builder.add(XLA_DOT)
    return builder.build()


def _build(platform: str, choice: StoreChoice) -> Tuner:
    jax_device = jax.local_devices(backend=platform)[0]  # this process's own, in a multi-process job
    native = native_module(jax_device.platform)
    device = (device_info(jax_device, native.cpu_features(), native.isa()) if native
              else device_info(jax_device))
    return Tuner(device, candidate_set_for(device), store=open_store(choice), jax_device=jax_device,
                 native=native)


def has_devices(platform: str) -> bool:
    """Whether this process has a device of ``platform`` ('cpu', 'gpu', 'cuda', ...): a
    lowering for a platform absent here (a multi-platform export) cannot tune for it.

        >>> has_devices("cpu"), has_devices("cuda")      # on a CPU-only host
        (True, False)
    """
    try:
        return bool(jax.devices(platform))
    except RuntimeError:
        return False


def lowering_tuner(platform: str, grouped: bool = False) -> tuple[Tuner, Policy] | None:
    """The tuner a matmul's lowering for ``platform`` asks (``grouped``: the grouped
    matmuls' one) and the compile's policy, read here once; None where the lowering emits
    XLA's dot without asking: mode ``off`` (no tuner is built), or a bad setting (one
    ``ConfigWarning`` naming it: the user's matmul never fails because of the tuner).

        >>> tuner, policy = lowering_tuner("cpu")
        >>> tuner.select(problem, key, policy)
    """
    policy = config.compile_policy()
    if policy.mode == "off":
        return None
    try:
        return (RUNTIME.ragged_tuner_for(platform) if grouped else RUNTIME.tuner_for(platform)), policy
    except ConfigError as err:  # a bad store setting (cache, cache_dir, environment, store)
        config.warn_bad_setting(err)
        return None


def current_tuners() -> list[Tuner]:
    """The tuners of ``jax.default_backend()``, dense and grouped (built if needed), and
    every other live tuner."""
    default = RUNTIME.tuner_for(jax.default_backend())
    grouped = RUNTIME.ragged_tuner_for(jax.default_backend())
    return [default, grouped] + [t for t in RUNTIME.built_tuners() if t is not default and t is not grouped]


def _platform(name: str) -> str:
    return "gpu" if name in ("cuda", "rocm") else name


class Runtime:
    """The process's tuning state in one object: the tuners (dense and grouped, per
    platform), the store each uses, the JAX compilation-cache settings in effect, and the
    program records and counters tuning keeps; ``reset()`` forgets all of it.

        >>> RUNTIME.tuner_for("cpu").select(problem).winner
        'native_small_avx2_t1'
        >>> RUNTIME.reset()                 # a clean slate (tests use this)

    What outlives a reset is what the process itself holds: the devices' measured peaks
    (``tuning.probes``) and the GEMM choices XLA keeps (``tuning.xla_priming``).
    """

    def __init__(self):
        self._lock = threading.Lock()
        self.tuners: dict[str, Tuner] = {}  # by platform ("cpu", "gpu", ...)
        self.grouped_tuners: dict[str, Tuner] = {}  # grouped matmuls', by platform
        self._stores: dict[str, StoreChoice] = {}  # the store each dense tuner uses
        self._compile_settings: tuple | None = None  # (cache, store, cache_dir, compilation_cache, mode)

    def tuner_for(self, platform: str) -> Tuner:
        """The process's tuner for ``platform`` ('cpu', 'gpu', 'cuda', ...), built once.

        When ``cache``, ``cache_dir``, ``environment`` or ``store`` changed since, it
        switches to that store (its memory table of decisions stays).
        """
        platform = _platform(platform)
        choice = config.store_choice()
        with self._lock:
            tuner = self.tuners.get(platform)
            if tuner is None:
                tuner = self.tuners[platform] = _build(platform, choice)
            elif self._stores.get(platform) != choice:
                tuner.use_store(open_store(choice))
            self._stores[platform] = choice
            self._follow_compilation_cache_setting()
            return tuner

    def ragged_tuner_for(self, platform: str) -> Tuner:
        """The process's tuner of grouped matmuls for ``platform``: the candidates of
        ``kernels.ragged``, with the store and probes of ``tuner_for(platform)``.

            >>> RUNTIME.ragged_tuner_for("cpu").select(problem).winner     # problem.groups > 0
            'ragged_padded_dense_x2'
        """
        dense = self.tuner_for(platform)
        platform = _platform(platform)
        with self._lock:
            tuner = self.grouped_tuners.get(platform)
            if tuner is None:
                tuner = self.grouped_tuners[platform] = Tuner(
                    dense.device, ragged_candidate_set(dense.device), jax_device=dense.jax_device,
                    timer=dense.timer, store=dense.store, rules=dense.rules, probes=dense.probes)
            elif tuner.store is not dense.store:
                tuner.known.store = dense.store  # the dense tuner switched stores (and closed the old)
            return tuner

    def built_tuners(self) -> list[Tuner]:
        """The tuners built in this process (the grouped ones on their dense tuner's
        current store)."""
        with self._lock:
            dense, grouped = list(self.tuners.values()), list(self.grouped_tuners)
        return dense + [self.ragged_tuner_for(platform) for platform in grouped]

    def reset(self) -> None:
        """Forget every tuner (memory tables, store handles), the program records, the
        attention decisions and the counters; the next use rebuilds. A changed ``cache``, ``cache_dir``,
        ``environment`` or ``store`` needs no reset (``tuner_for`` switches stores)."""
        with self._lock:
            for tuner in self.tuners.values():
                tuner.store.close()
            self.tuners.clear()
            self.grouped_tuners.clear()
            self._stores.clear()
            self._compile_settings = None
        programs.forget()
        attention_decisions.forget()
        counters.reset_stats()

    def _follow_compilation_cache_setting(self) -> None:
        """Point JAX's compilation cache beside the store, or stop, when the settings
        changed (one process-wide cache, whatever the platform); with ``mode`` off, never."""
        settings = (config.get("cache"), config.get("store"), config.get("cache_dir"),
                    config.get("compilation_cache"), config.get("mode"))
        if settings == self._compile_settings:
            return
        cache, store, cache_dir, compilation, mode = settings
        if cache and store != "memory" and compilation and mode != "off":
            compile_cache.enable(compile_cache.directory_for(cache_dir))
        else:
            compile_cache.disable()
        self._compile_settings = settings


RUNTIME = Runtime()  # the process's one
tuner_for = RUNTIME.tuner_for
ragged_tuner_for = RUNTIME.ragged_tuner_for
built_tuners = RUNTIME.built_tuners
reset_tuners = RUNTIME.reset  # its earlier name
