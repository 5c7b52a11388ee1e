"""Shared test setup: a throw-away tune store per session, never the user's cache."""

import os

import pytest

# JAX's compilation cache stays off unless a test asks for it (tests/test_compile_cache.py);
# set before jax_autotune is imported, which points the cache at the configured store
os.environ.setdefault("JAX_AUTOTUNE_COMPILATION_CACHE", "0")

from jax_autotune import config  # noqa: E402
from jax_autotune.registry import RUNTIME  # noqa: E402
from jax_autotune.tuning.store import store_at  # noqa: E402


def pytest_collection_modifyitems(config, items):
    try:
        import jax
        has_gpu = any(d.platform == "gpu" for d in jax.devices())
    except RuntimeError:
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def isolated_cache(tmp_path_factory):
    directory = tmp_path_factory.mktemp("jax_autotune_cache")
    os.environ["JAX_AUTOTUNE_CACHE_DIR"] = str(directory)
    os.environ.pop("JAX_AUTOTUNE_MODE", None)
    # tests time real candidates; keep each key's tuning short
    os.environ.setdefault("JAX_AUTOTUNE_BUDGET_SECONDS", "2")
    RUNTIME.reset()
    yield directory
    RUNTIME.reset()


@pytest.fixture
def fresh_tuning(tmp_path):
    """An empty store and memory table for one test; config and counters restored after."""
    config.reset()
    config.update("cache_dir", str(tmp_path / "cache"))
    RUNTIME.reset()  # tuners, stores, program records, counters
    yield tmp_path / "cache"
    config.reset()
    RUNTIME.reset()


@pytest.fixture
def store(tmp_path):
    """A store of its own for a tuner built directly in a test."""
    s = store_at(tmp_path / "tuned.db")
    yield s
    s.close()
