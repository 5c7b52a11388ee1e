"""JAX's persistent compilation cache beside the tune store: a warm process compiles
nothing, a changed decision is never served a stale executable, a user's own cache
settings win. Every case runs in fresh processes (the cache is process-wide state)."""

import json
import os
import subprocess
import sys

import pytest

from jax_autotune.cli import main as cli_main
from jax_autotune.tuning.compile_cache import DIRECTORY_NAME


WORKER = r'''
import json, sys
import jax, jax.numpy as jnp, numpy as np
import jax_autotune as jat
from jax_autotune.tuning.compile_cache import CompileCounter
from jax_autotune.problem import MatmulProblem
from jax_autotune.tuners import tuner_for
from jax_autotune.tuning.decision import Decision
import jax_autotune.config as config

winner = sys.argv[1]  # "tune", or "xla_dot" / "native" installed as the decision
sharded = sys.argv[2:] == ["sharded"]  # x's rows over 4 host devices: per-shard keys
rng = np.random.default_rng(0)
x = jnp.asarray(rng.standard_normal((64, 48)), jnp.float32)
w = jnp.asarray(rng.standard_normal((48, 40)), jnp.float32)
if sharded:
    from jax.sharding import NamedSharding, PartitionSpec as P
    mesh = jax.make_mesh((4,), ("d",))
    x = jax.device_put(x, NamedSharding(mesh, P("d", None)))
    w = jax.device_put(w, NamedSharding(mesh, P()))
if winner != "tune":
    tuner = tuner_for("cpu")
    problem = MatmulProblem(1, 64, 40, 48, "float32", "float32", "float32")
    key = problem.key(config.get("level"))
    if winner == "native":
        winner = next(c.name for c in tuner.candidate_set.candidates
                      if c.name.startswith("native_gemm") and c.supports(tuner.device, key))
    assert tuner.known.install(Decision(key=key, problem=problem, winner=winner))
counter = CompileCounter()
out = jax.block_until_ready(jax.jit(jat.matmul)(x, w))
counts = counter.to_json()
error = float(np.abs(np.asarray(out, np.float64) - np.asarray(x, np.float64) @ np.asarray(w, np.float64)).max())
print(json.dumps({**counts, "error": error, "tuned": jat.stats()["tuned"],
                  "custom_call": "custom_call" in jax.jit(jat.matmul).lower(x, w).as_text(),
                  "jax_cache_dir": jax.config.jax_compilation_cache_dir,
                  "min_compile_s": jax.config.jax_persistent_cache_min_compile_time_secs}))
'''


def run(tmp_path, winner, *extra, stderr=None, **env):
    """The worker's JSON line; ``stderr``, a list, receives what it printed there."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    environment = {k: v for k, v in os.environ.items()
                   if not k.startswith(("JAX_AUTOTUNE_", "JAX_COMPILATION_CACHE"))}
    environment.update(JAX_AUTOTUNE_CACHE_DIR=str(tmp_path / "store"), JAX_PLATFORMS="cpu",
                       JAX_AUTOTUNE_BUDGET_SECONDS="1", **env)
    done = subprocess.run([sys.executable, "-P", str(script), winner, *extra],
                          env=environment, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    if stderr is not None:
        stderr.append(done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("backend, database", [("sqlite", "default.db"), ("directory", "default.d")])
def test_a_warm_process_tunes_and_compiles_nothing(tmp_path, backend, database):
    pytest.importorskip("jax_autotune.kernels.cpu.native")
    cold = run(tmp_path, "tune", JAX_AUTOTUNE_STORE=backend)
    assert cold["compiles"] >= 1 and cold["error"] < 1e-3
    assert cold["jax_cache_dir"] == str(tmp_path / "store" / DIRECTORY_NAME)
    assert cold["min_compile_s"] == 0.0  # matmul executables compile fast: keep them all
    assert (tmp_path / "store" / database).exists()
    warm = run(tmp_path, "tune", JAX_AUTOTUNE_STORE=backend)
    assert warm["tuned"] == 0
    assert warm["requests"] >= 1 and warm["compiles"] == 0 and warm["hits"] >= 1
    assert warm["error"] < 1e-3


@pytest.mark.slow
def test_a_warm_process_tunes_nothing_for_a_sharded_matmul_but_compiles_it_again(tmp_path):
    """The per-shard kernel is chosen while XLA partitions the program (custom_partitioning),
    and JAX keys such a program by a per-process callback id, so a warm process compiles it
    again; its decisions come from the store. (JAX's
    ``jax_remove_custom_partitioning_ptr_from_cache_key`` would cache it, but the decision
    taken while partitioning is not in the key: a re-tuned key would be served a stale
    executable, so the setting is left to the user.)"""
    pytest.importorskip("jax_autotune.kernels.cpu.native")
    flags = dict(XLA_FLAGS="--xla_force_host_platform_device_count=4")
    cold = run(tmp_path, "tune", "sharded", **flags)
    assert cold["compiles"] >= 1 and cold["tuned"] >= 1 and cold["error"] < 1e-3
    assert cold["custom_call"]  # the per-shard kernel is the native one, not XLA's dot
    warm = run(tmp_path, "tune", "sharded", **flags)
    assert warm["tuned"] == 0 and warm["error"] < 1e-3
    assert warm["requests"] == 1 and warm["compiles"] == 1 and warm["hits"] == 0


@pytest.mark.slow
def test_a_changed_decision_is_never_served_a_stale_executable(tmp_path):
    pytest.importorskip("jax_autotune.kernels.cpu.native")
    native = run(tmp_path, "native")
    assert native["custom_call"] and native["compiles"] >= 1 and native["error"] < 1e-3
    xla = run(tmp_path, "xla_dot")  # same program, same cache, another winner
    assert not xla["custom_call"]
    assert xla["compiles"] >= 1 and xla["hits"] == 0 and xla["error"] < 1e-3
    again = run(tmp_path, "native")  # the first winner's executable is still there
    assert again["custom_call"] and again["compiles"] == 0 and again["hits"] >= 1


def test_a_cache_the_user_configured_is_used_and_never_moved(tmp_path):
    users = tmp_path / "users_cache"
    result = run(tmp_path, "xla_dot", JAX_COMPILATION_CACHE_DIR=str(users))
    assert result["jax_cache_dir"] == str(users)
    assert not (tmp_path / "store" / DIRECTORY_NAME).exists()
    assert result["min_compile_s"] == 1.0  # JAX's default: the user's settings are theirs


JAX_LOCK_FILE = ".lockfile"  # JAX's eviction (the size cap) locks the folder with it
JAX_SETTINGS = ["jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
                "jax_persistent_cache_min_entry_size_bytes", "jax_compilation_cache_max_size",
                "jax_enable_compilation_cache"]
SETTINGS_WORKER = f"""
import json, jax, jax.numpy as jnp
names = {JAX_SETTINGS!r}
def settings(): return {{n: getattr(jax.config, n) for n in names}}
seen = {{"before": settings()}}
import jax_autotune as jat
from jax_autotune.tuning import compile_cache
seen["imported"] = settings()
jax.jit(jat.matmul)(jnp.ones((16, 8)), jnp.ones((8, 4))).block_until_ready()
seen["called"] = settings()
compile_cache.disable()
seen["disabled"] = settings()
print(json.dumps(seen))
"""


def _settings_seen(tmp_path, **env):
    environment = {k: v for k, v in os.environ.items()
                   if not k.startswith(("JAX_AUTOTUNE_", "JAX_COMPILATION_CACHE"))}
    environment.update(JAX_AUTOTUNE_CACHE_DIR=str(tmp_path / "store"), JAX_PLATFORMS="cpu",
                       JAX_AUTOTUNE_BUDGET_SECONDS="1", **env)
    done = subprocess.run([sys.executable, "-P", "-c", SETTINGS_WORKER], env=environment,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_changes_nothing_in_jax_and_the_first_tuned_call_points_a_capped_cache(tmp_path):
    from jax_autotune.tuning.compile_cache import MAX_BYTES
    seen = _settings_seen(tmp_path)
    assert seen["imported"] == seen["before"]
    called = seen["called"]
    assert called["jax_compilation_cache_dir"] == str(tmp_path / "store" / DIRECTORY_NAME)
    assert called["jax_persistent_cache_min_compile_time_secs"] == 0.0
    assert called["jax_compilation_cache_max_size"] == MAX_BYTES
    assert seen["disabled"] == seen["before"]  # every setting put back


@pytest.mark.slow
def test_a_cache_folder_written_without_the_cap_gets_access_times_and_no_warning(tmp_path):
    pytest.importorskip("jax_autotune.kernels.cpu.native")
    run(tmp_path, "xla_dot")
    folder = tmp_path / "store" / DIRECTORY_NAME
    for stamp in folder.glob("*-atime"):
        stamp.unlink()  # as an uncapped process (an earlier version) leaves the folder
    entries = sorted(folder.glob("*-cache"))
    assert entries
    printed = []
    again = run(tmp_path, "native", stderr=printed)  # a new program: a write, which evicts first
    assert "Error writing persistent compilation cache" not in printed[0], printed[0][-2000:]
    assert again["compiles"] >= 1
    for entry in entries:
        stamp = entry.with_name(entry.name[:-len("-cache")] + "-atime")
        assert int.from_bytes(stamp.read_bytes(), "little") > 0


def test_access_times_are_added_only_where_missing(tmp_path):
    from jax_autotune.tuning.compile_cache import add_missing_access_times
    stem = "jit_f-" + "ab" * 32
    (tmp_path / f"{stem}-cache").write_bytes(b"x")
    kept = "jit_g-" + "cd" * 32
    (tmp_path / f"{kept}-cache").write_bytes(b"y")
    (tmp_path / f"{kept}-atime").write_bytes((7).to_bytes(8, "little"))
    (tmp_path / "notes-cache").write_text("the user's")  # not JAX's name: left alone
    assert add_missing_access_times(str(tmp_path)) == 1
    assert int.from_bytes((tmp_path / f"{stem}-atime").read_bytes(), "little") == \
        (tmp_path / f"{stem}-cache").stat().st_mtime_ns
    assert int.from_bytes((tmp_path / f"{kept}-atime").read_bytes(), "little") == 7
    assert not (tmp_path / "notes-atime").exists()
    assert add_missing_access_times(str(tmp_path / "absent")) == 0


def test_mode_off_changes_nothing_in_jax(tmp_path):
    seen = _settings_seen(tmp_path, JAX_AUTOTUNE_MODE="off")
    assert seen["imported"] == seen["called"] == seen["before"]
    assert not (tmp_path / "store").exists()


def test_a_size_cap_the_user_set_is_kept(tmp_path):
    seen = _settings_seen(tmp_path, JAX_COMPILATION_CACHE_MAX_SIZE=str(2**20))
    assert seen["before"]["jax_compilation_cache_max_size"] == 2**20
    assert seen["called"]["jax_compilation_cache_max_size"] == 2**20
    assert seen["called"]["jax_compilation_cache_dir"] == str(tmp_path / "store" / DIRECTORY_NAME)


@pytest.mark.parametrize("setting", [{"JAX_AUTOTUNE_COMPILATION_CACHE": "0"}, {"JAX_AUTOTUNE_STORE": "memory"}],
                         ids=["compilation_cache=0", "store=memory"])
def test_the_setting_turns_it_off(tmp_path, setting):
    result = run(tmp_path, "xla_dot", **setting)
    assert result["jax_cache_dir"] is None and result["hits"] == 0 and result["compiles"] >= 1
    assert not (tmp_path / "store" / DIRECTORY_NAME).exists()


def test_clear_deletes_the_compiled_executables_only_when_asked(tmp_path, monkeypatch, capsys):
    run(tmp_path, "xla_dot")
    folder = tmp_path / "store" / DIRECTORY_NAME
    files = sorted(folder.iterdir())
    kept = sum(not f.name.endswith("-atime") and f.name != JAX_LOCK_FILE for f in files)
    assert kept > 0
    monkeypatch.setenv("JAX_AUTOTUNE_CACHE_DIR", str(tmp_path / "store"))
    assert cli_main(["clear", "--yes"]) == 0
    assert sorted(folder.iterdir()) == files
    assert cli_main(["clear", "--yes", "--compilation-cache"]) == 0
    assert {f.name for f in folder.iterdir()} <= {JAX_LOCK_FILE}  # the size cap's lock, JAX's to manage
    assert f"deleted {kept} compiled executables" in capsys.readouterr().out


ENTRY = "jit_matmul-" + "ab" * 32  # JAX's key: module name, sha256 hex


def user_files(folder):
    """A folder of the user's own files, one named like a cache entry."""
    folder.mkdir()
    for name, text in (("thesis.tex", "chapter 1"), (f"{ENTRY}-cache", "mine"), ("notes", "x")):
        (folder / name).write_text(text)
    return {p.name: p.read_text() for p in folder.iterdir()}


def test_clear_deletes_only_jax_entries_and_never_follows_a_link(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "store" / DIRECTORY_NAME
    folder.mkdir(parents=True)
    for name in (f"{ENTRY}-cache", f"{ENTRY}-atime", f"jit_f-{'0' * 64}-cache"):
        (folder / name).write_bytes(b"executable")
    (folder / "README.txt").write_text("the user's")
    (folder / "sub").mkdir()
    (folder / "sub" / f"{ENTRY}-cache").write_text("nested")
    outside = user_files(tmp_path / "thesis")
    (folder / f"jit_g-{'1' * 64}-cache").symlink_to(tmp_path / "thesis" / "thesis.tex")
    monkeypatch.setenv("JAX_AUTOTUNE_CACHE_DIR", str(tmp_path / "store"))
    assert cli_main(["clear", "--yes", "--compilation-cache"]) == 0
    assert "deleted 2 compiled executables" in capsys.readouterr().out
    assert sorted(p.name for p in folder.iterdir()) == ["README.txt", f"jit_g-{'1' * 64}-cache", "sub"]
    assert (folder / "sub" / f"{ENTRY}-cache").exists()
    assert {p.name: p.read_text() for p in (tmp_path / "thesis").iterdir()} == outside


def test_clear_refuses_a_cache_folder_that_is_a_symlink(tmp_path, monkeypatch, capsys):
    outside = user_files(tmp_path / "thesis")
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / DIRECTORY_NAME).symlink_to(tmp_path / "thesis")
    monkeypatch.setenv("JAX_AUTOTUNE_CACHE_DIR", str(tmp_path / "store"))
    assert cli_main(["clear", "--yes", "--compilation-cache"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "symbolic link" in err[-1] and "nothing deleted" in err[-1]
    assert {p.name: p.read_text() for p in (tmp_path / "thesis").iterdir()} == outside
