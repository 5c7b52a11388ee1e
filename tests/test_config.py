"""Configuration: precedence, files, and errors that name what is allowed."""

import os

import pytest

from jax_autotune import config
from jax_autotune.config import ConfigError


@pytest.fixture(autouse=True)
def clean(monkeypatch, tmp_path):
    for setting in config.SETTINGS.values():
        monkeypatch.delenv(setting.env, raising=False)
    monkeypatch.chdir(tmp_path)
    config.reset()
    yield
    config.reset()


def test_defaults():
    assert config.get("level") == "balanced"
    assert config.get("mode") == "tune"
    assert config.get("cache") is True
    assert config.get("environment") == "default"
    assert config.get("log_decisions") is None
    assert config.source("mode") == "default"


def test_the_default_store_is_the_user_cache_dir_not_the_working_directory(tmp_path):
    import platformdirs
    assert config.get("cache_dir") == platformdirs.user_cache_dir("jax_autotune", appauthor=False)
    assert not config.get("cache_dir").startswith(str(tmp_path))


def test_precedence_is_explicit_over_env_over_file_over_default(monkeypatch, tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.jax_autotune]\nmode = "cached"\nlevel = "full"\n')
    config.reset()
    assert (config.get("mode"), config.source("mode")) == ("cached", str(tmp_path / "pyproject.toml"))
    monkeypatch.setenv("JAX_AUTOTUNE_MODE", "require")
    assert (config.get("mode"), config.source("mode")) == ("require", "env")
    config.update("mode", "off")
    assert (config.get("mode"), config.source("mode")) == ("off", "explicit")
    config.update("mode", None)
    assert config.get("mode") == "require"
    assert config.get("level") == "full"


def test_the_nearest_file_walking_up_wins_and_jax_autotune_toml_counts(monkeypatch, tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.jax_autotune]\nenvironment = "outer"\n')
    inner = tmp_path / "a" / "b"
    inner.mkdir(parents=True)
    (tmp_path / "a" / "jax_autotune.toml").write_text('environment = "inner"\n')
    monkeypatch.chdir(inner)
    assert config.get("environment") == "inner"
    monkeypatch.chdir(tmp_path)
    assert config.get("environment") == "outer"


def test_a_pyproject_without_the_table_is_skipped(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text('[tool.jax_autotune]\nmode = "off"\n')
    inner = tmp_path / "pkg"
    inner.mkdir()
    (inner / "pyproject.toml").write_text('[project]\nname = "x"\n')
    monkeypatch.chdir(inner)
    assert config.get("mode") == "off"


def test_env_values_are_parsed(monkeypatch, tmp_path):
    monkeypatch.setenv("JAX_AUTOTUNE_CACHE", "0")
    monkeypatch.setenv("JAX_AUTOTUNE_CACHE_DIR", "~/somewhere")
    monkeypatch.setenv("JAX_AUTOTUNE_LOG_DECISIONS", "stderr")
    monkeypatch.setenv("JAX_AUTOTUNE_BUDGET_SECONDS", "2.5")
    assert config.get("cache") is False
    assert config.get("cache_dir") == os.path.expanduser("~/somewhere")
    assert config.get("log_decisions") == "stderr"
    assert config.get("budget_seconds") == 2.5


@pytest.mark.parametrize("name, value, allowed", [
    ("mode", "fast", "tune, cached, require, off"),
    ("level", "medium", "minimal, balanced, extensive, full"),
    ("cache", "maybe", "'1'"),
    ("environment", "../etc", "database name"),
    ("budget_seconds", "-1", "positive number"),
])
def test_a_bad_value_names_the_setting_and_what_is_allowed(name, value, allowed):
    with pytest.raises(ConfigError, match=name) as info:
        config.update(name, value)
    assert allowed in str(info.value)


def test_a_bad_env_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("JAX_AUTOTUNE_MODE", "sometimes")
    with pytest.raises(ConfigError, match="JAX_AUTOTUNE_MODE"):
        config.get("mode")


def test_an_unknown_setting_lists_the_known_ones(tmp_path):
    with pytest.raises(ConfigError, match="unknown setting 'speed'.*level"):
        config.update("speed", 1)
    (tmp_path / "jax_autotune.toml").write_text('speed = 3\n')
    config.reset()
    with pytest.raises(ConfigError, match="unknown setting"):
        config.get("mode")


@pytest.mark.parametrize("raw", ["-1", "abc", "0", "inf", "nan", ""])
def test_a_bad_budget_in_the_environment_is_an_error_naming_the_variable(monkeypatch, raw):
    monkeypatch.setenv("JAX_AUTOTUNE_BUDGET_SECONDS", raw)
    if raw == "":  # an empty variable is unset
        assert config.get("budget_seconds") == 10.0
        return
    with pytest.raises(ConfigError, match="JAX_AUTOTUNE_BUDGET_SECONDS: expected a positive number"):
        config.get("budget_seconds")


@pytest.mark.parametrize("toml", ["-1", '"abc"', "0", "inf", "true", "[1]"])
def test_a_bad_budget_in_the_file_is_an_error_naming_the_file_and_the_setting(tmp_path, toml):
    (tmp_path / "jax_autotune.toml").write_text(f"budget_seconds = {toml}\n")
    config.reset()
    with pytest.raises(ConfigError, match=r"jax_autotune.toml: budget_seconds: expected a positive"):
        config.get("budget_seconds")


@pytest.mark.parametrize("name, toml, shown", [("cache_dir", "5", "5"), ("cache_dir", "true", "True"),
                                               ("environment", "5", "5"), ("log_decisions", "1.5", "1.5")])
def test_a_path_or_name_that_is_not_a_string_in_the_file_is_an_error(tmp_path, name, toml, shown):
    (tmp_path / "jax_autotune.toml").write_text(f"{name} = {toml}\n")
    config.reset()
    with pytest.raises(ConfigError, match=rf"{name}: expected .*\(a string\), got {shown}"):
        config.get(name)


def test_a_config_file_that_is_not_utf8_is_an_error_naming_it(tmp_path):
    (tmp_path / "jax_autotune.toml").write_bytes(b'mode = "caf\xe9"\n')
    config.reset()
    with pytest.raises(ConfigError, match=r"jax_autotune.toml: cannot read config file: UnicodeDecodeError"):
        config.get("mode")


BROKEN_NOT_OURS = ['[project]\nname = "x\n', '[project]\ndependencies = ["jax_autotune>=0.1"\n',
                   '[jax_autotune]\nmode = "off"\n[project\n', b'[project]\nname = "caf\xe9"\n']
BROKEN_OURS = ['[tool.jax_autotune]\nmode = "cached\n', '[ tool . "jax_autotune" ]\nmode = cached\n',
               '[project\ntool.jax_autotune.mode = "cached"\n',
               '[tool]\njax_autotune = {mode = "cached"\n', b'[tool.jax_autotune]\nmode = "caf\xe9"\n']


def write(path, text):
    path.write_bytes(text if isinstance(text, bytes) else text.encode())


@pytest.mark.parametrize("text", BROKEN_NOT_OURS)
def test_a_broken_pyproject_without_our_table_is_skipped_silently(tmp_path, monkeypatch, text):
    import warnings
    write(tmp_path / "pyproject.toml", '[tool.jax_autotune]\nmode = "off"\n')
    inner = tmp_path / "other_project"
    inner.mkdir()
    write(inner / "pyproject.toml", text)
    monkeypatch.chdir(inner)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert config.resolve("mode") == ("off", str(tmp_path / "pyproject.toml"))


@pytest.mark.parametrize("text", BROKEN_OURS)
def test_a_broken_pyproject_that_may_hold_our_table_gives_one_warning_and_the_defaults(
        tmp_path, monkeypatch, text):
    write(tmp_path / "pyproject.toml", '[tool.jax_autotune]\nmode = "off"\n')
    inner = tmp_path / "project"
    inner.mkdir()
    write(inner / "pyproject.toml", text)
    monkeypatch.chdir(inner)
    with pytest.warns(config.ConfigWarning, match=r"project/pyproject.toml may hold \[tool.jax_autotune\]") as seen:
        assert config.resolve("mode") == ("tune", "default")
        (inner / "sub").mkdir()
        monkeypatch.chdir(inner / "sub")  # another folder under it: the same file, no new warning
        assert [config.get(name) for name in ("mode", "level")] == ["tune", "balanced"]
    assert len(seen) == 1


def test_a_matmul_under_a_broken_pyproject_runs(tmp_path, monkeypatch):
    import jax
    import jax.numpy as jnp
    import jax_autotune as jat
    write(tmp_path / "pyproject.toml", '[tool.jax_autotune]\nlevel = "full\n')
    monkeypatch.setenv("JAX_AUTOTUNE_MODE", "off")  # level still comes from the file
    with pytest.warns(config.ConfigWarning):
        out = jax.jit(jat.matmul)(jnp.ones((3, 4)), jnp.ones((4, 2)))
    assert out.tolist() == [[4.0, 4.0]] * 3


def test_a_broken_jax_autotune_toml_is_a_config_error_naming_it(tmp_path):
    write(tmp_path / "pyproject.toml", '[tool.jax_autotune]\nmode = "off"\n')
    write(tmp_path / "jax_autotune.toml", 'mode = "cached\n')
    with pytest.raises(ConfigError, match=r"jax_autotune.toml: cannot read config file: TOMLDecodeError"):
        config.get("mode")


@pytest.mark.parametrize("name, value", [("JAX_AUTOTUNE_BUDGET_SECONDS", "abc"), ("JAX_AUTOTUNE_MODE", "fast"),
                                         ("JAX_AUTOTUNE_LEVEL", "huge"), ("JAX_AUTOTUNE_STORE", "nfs"),
                                         ("JAX_AUTOTUNE_PROGRESS", "sometimes")])
def test_a_compile_under_a_bad_setting_warns_once_naming_it_and_runs_xla_dot(tmp_path, monkeypatch, name, value):
    import jax
    import numpy as np
    import jax_autotune as jat
    from jax_autotune.registry import RUNTIME
    from jax_autotune.tuning.tuner import record_decisions
    config.update("cache_dir", str(tmp_path / "cache"))
    RUNTIME.reset()
    jax.clear_caches()  # a compile, not an executable an earlier test's jit(jat.matmul) kept
    rng = np.random.default_rng(0)
    a, b = (np.asarray(rng.standard_normal(shape), np.float32) for shape in ((24, 40), (40, 16)))
    monkeypatch.setenv(name, value)
    with pytest.warns(config.ConfigWarning, match=name) as record, record_decisions() as asked:
        out = jax.jit(jat.matmul)(a, b)
        again = jax.jit(lambda x, y: jat.matmul(x, y) * 2)(a[:7], b)
    assert len([w for w in record if issubclass(w.category, config.ConfigWarning)]) == 1
    assert asked == []  # no tuner was asked: XLA's dot, as lax runs it
    np.testing.assert_array_equal(np.asarray(out), np.asarray(jax.jit(jax.numpy.matmul)(a, b)))
    np.testing.assert_array_equal(np.asarray(again), np.asarray(jax.jit(lambda x, y: (x @ y) * 2)(a[:7], b)))
    with pytest.raises(ConfigError, match=name):
        config.policy() if name != "JAX_AUTOTUNE_STORE" else config.store_choice()
    monkeypatch.delenv(name)
    jax.clear_caches()
    with record_decisions() as asked:
        jax.jit(jat.matmul)(a, b)
    assert [d.source for d in asked] == ["tuned"]  # fixed, the next compile tunes
    RUNTIME.reset()


def test_policy_holds_the_tuning_settings_of_one_compile(monkeypatch):
    monkeypatch.setenv("JAX_AUTOTUNE_MODE", "cached")
    config.update("budget_seconds", 3)
    config.update("log_decisions", "stderr")
    policy = config.policy()
    assert (policy.mode, policy.level, policy.budget_seconds, policy.log_decisions, policy.progress,
            policy.context) == ("cached", "balanced", 3.0, "stderr", "auto", "full")
    assert not policy.tunes and hash(policy) == hash(config.policy())
    config.update("mode", "tune")
    assert policy.mode == "cached" and config.policy().tunes  # frozen: a later change is a new policy


def test_nothing_under_tuning_reads_the_configuration():
    import ast
    import pathlib
    import jax_autotune
    folder = pathlib.Path(jax_autotune.__file__).parent / "tuning"
    readers = []
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [f"{node.module}.{a.name}" for a in node.names] if isinstance(node, ast.ImportFrom) else [])
            readers += [f"{path.name}: {n}" for n in names if n.startswith("jax_autotune.config")]
    assert readers == []
