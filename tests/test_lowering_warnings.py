"""lowering_warnings.quiet: exactly the registered deprecations are kept from the user, and
only inside it; the Pallas Triton backend's own is registered by triton_backend."""

import threading
import warnings

import jax
import jax.numpy as jnp
import pytest

from jax_autotune.kernels.gpu import triton_backend
from jax_autotune.tuning import lowering_warnings
from jax_autotune.tuning.lowering_warnings import quiet

OURS = triton_backend.DEPRECATION + " and will be removed in a future JAX version."


def _shown(fn):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in seen]


def test_the_triton_deprecation_is_registered():
    assert any(triton_backend.DEPRECATION.startswith(p.replace("\\", "")) for p in lowering_warnings.silenced())


def test_quiet_keeps_the_registered_message_even_under_always():
    def lower():
        with quiet():
            warnings.warn(OURS, DeprecationWarning)
    assert _shown(lower) == []


def test_outside_quiet_the_message_reaches_the_user():
    assert _shown(lambda: warnings.warn(OURS, DeprecationWarning)) == [OURS]


def test_quiet_lets_other_warnings_through():
    def lower():
        with quiet():
            warnings.warn("jnp.foo is deprecated", DeprecationWarning)
            warnings.warn(OURS, UserWarning)  # the same text, another category: not ours to hide
    assert _shown(lower) == ["jnp.foo is deprecated", OURS]


def test_quiet_nests_and_restores_the_filters():
    before = list(warnings.filters)

    def lower():
        with quiet():
            with quiet():
                warnings.warn(OURS, DeprecationWarning)
            warnings.warn(OURS, DeprecationWarning)
        warnings.warn(OURS, DeprecationWarning)
    assert _shown(lower) == [OURS]
    assert warnings.filters == before


def test_silence_registers_a_message_once():
    lowering_warnings.silence(triton_backend.DEPRECATION)
    patterns = lowering_warnings.silenced()
    assert len(patterns) == len(set(patterns))


def test_quiet_from_many_threads_leaves_the_filters_as_they_were():
    before = list(warnings.filters)
    errors = []

    def worker():
        try:
            for _ in range(50):
                with quiet():
                    pass
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)
    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors and not any(t.is_alive() for t in threads)
    assert warnings.filters == before


@pytest.mark.skipif(not triton_backend.SHIPPED, reason=triton_backend.WHY_NOT or "no Triton backend")
def test_a_triton_kernel_lowered_for_cuda_inside_quiet_warns_nothing():
    from jax.experimental import pallas as pl

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0

    def f(x):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              compiler_params=triton_backend.compiler_params(num_warps=4, num_stages=1))(x)

    def lower():
        try:
            jax.jit(f).trace(jax.ShapeDtypeStruct((16, 16), jnp.float32)).lower(lowering_platforms=("cuda",))
        except Exception:  # noqa: BLE001 - a CPU-only jaxlib may stop after the warning
            pass

    def lower_quietly():
        with quiet():
            lower()
    loud = _shown(lower)
    if not any(m.startswith(triton_backend.DEPRECATION) for m in loud):
        pytest.skip(f"jax {jax.__version__} does not warn for the Triton backend")
    assert not any(m.startswith(triton_backend.DEPRECATION) for m in _shown(lower_quietly))
