"""``import jax_autotune``: light until a public name is used (the command line starts
without jax), and the same package as before once it is."""

import os
import subprocess
import sys

import pytest

import jax_autotune as jat

CODE = """
import sys
{first}
import jax_autotune as jat
light = "jax" not in sys.modules
import jax
jat.matmul  # the first use of a public name
before = jax.config.jax_compilation_cache_dir
jax.jit(jat.matmul)(jax.numpy.ones((8, 8)), jax.numpy.ones((8, 8)))  # the tuner's first use
print(light, before is not None, jax.config.jax_compilation_cache_dir is not None)
"""


def run(first, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_AUTOTUNE_", "JAX_COMPILATION"))}
    env["JAX_AUTOTUNE_CACHE_DIR"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-P", "-c", CODE.format(first=first)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.slow
def test_import_is_light_and_the_tuner_s_first_use_points_jax_cache_beside_the_store(tmp_path):
    assert run("", tmp_path) == ["True", "False", "True"]


@pytest.mark.slow
def test_after_jax_the_import_loads_everything_at_once(tmp_path):
    assert run("import jax", tmp_path) == ["False", "False", "True"]


def test_every_public_name_resolves_and_the_functions_keep_their_names():
    assert all(getattr(jat, name) is not None for name in jat.__all__)
    assert set(jat.__all__) <= set(dir(jat))
    import jax_autotune.autotune  # noqa: F401  (the submodules of the same names)
    import jax_autotune.warmup  # noqa: F401
    assert callable(jat.warmup) and callable(jat.autotune)
    assert jat.warmup.__module__ == "jax_autotune.warmup"


def test_every_error_and_warning_has_a_common_base_and_is_exported():
    import inspect

    import jax_autotune as jat
    from jax_autotune import errors
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass) if c.__module__ == errors.__name__]
    assert {c.__name__ for c in classes} <= set(jat.__all__)
    for c in classes:
        base = jat.JaxAutotuneWarning if issubclass(c, Warning) else jat.JaxAutotuneError
        assert issubclass(c, base) and c.__name__.endswith(("Error", "Warning"))
        assert getattr(jat, c.__name__) is c
    assert jat.JaxAutotuneStoreWarning is jat.StoreWarning and jat.JaxAutotuneConsensusWarning is jat.ConsensusWarning
    assert issubclass(jat.ConfigError, ValueError) and issubclass(jat.KeyNotTunedError, RuntimeError)


def test_the_registry_keeps_its_earlier_import_path():
    import jax_autotune.registry
    import jax_autotune.tuners
    assert jax_autotune.tuners is jax_autotune.registry
    from jax_autotune.tuners import tuner_for
    assert tuner_for is jax_autotune.registry.tuner_for
