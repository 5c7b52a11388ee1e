"""Tune tables in orbax checkpoints: saved with the params in one step, restored and installed,
and (in a fresh process, from the README example) used with no tuning at all."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

ocp = pytest.importorskip("orbax.checkpoint")

import jax_autotune as jat  # noqa: E402
from jax_autotune import tuners as tuner_module  # noqa: E402
from jax_autotune.checkpoint import TUNE_TABLE_FILENAME, TuneTableRestore, TuneTableSave  # noqa: E402
from jax_autotune.tuning.policy import Policy
from jax_autotune.tuning.store import store_at  # noqa: E402
from jax_autotune.tables.install import table  # noqa: E402
from jax_autotune.tables.table_file import TuneTableError  # noqa: E402
import readme  # noqa: E402
from test_table import PROBLEM_A, make_tuner, tuned_tuner  # noqa: E402,F401

pytestmark = pytest.mark.usefixtures("fresh_tuning")  # tmp cache dir, no tuners, fresh counters


@pytest.fixture
def params():
    return {"w": jnp.arange(12.0).reshape(3, 4), "b": jnp.ones(4)}


def save_step(directory, params, tune_table, step=1):
    with ocp.CheckpointManager(directory) as mngr:
        mngr.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(params),
                                                tune_table=TuneTableSave(tune_table)))
        mngr.wait_until_finished()


def restore_step(directory, params, install=True, step=1):
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
    with ocp.CheckpointManager(directory) as mngr:
        return mngr.restore(step, args=ocp.args.Composite(
            params=ocp.args.StandardRestore(abstract),
            tune_table=TuneTableRestore(install=install)))


def test_params_and_tune_table_round_trip_through_one_checkpoint_step(tmp_path, monkeypatch, params):
    tuner = tuned_tuner(store_at(tmp_path / "trained.db"))
    saved = table(tuners=[tuner])
    save_step(tmp_path / "ckpt", params, saved)
    item = tmp_path / "ckpt" / "1" / "tune_table"
    assert json.loads((item / TUNE_TABLE_FILENAME).read_text())["schema"] == "jax_autotune.tune_table"

    serving = make_tuner(store_at(tmp_path / "serving.db"))  # another process: nothing known
    monkeypatch.setitem(tuner_module.RUNTIME.tuners, jax.default_backend(), serving)
    restored = restore_step(tmp_path / "ckpt", params)
    assert restored.tune_table == saved
    np.testing.assert_array_equal(restored.params["w"], params["w"])
    decision = serving.select(PROBLEM_A, policy=Policy(mode="require"))
    assert decision.source == "memory" and decision.winner == "fast"
    assert len(serving.store.entries(serving.namespace)) == 2


def test_restore_without_install_returns_the_table_only(tmp_path, monkeypatch, params):
    save_step(tmp_path / "ckpt", params, table(tuners=[tuned_tuner(store_at(None))]))
    serving = make_tuner(store_at(tmp_path / "serving.db"))
    monkeypatch.setitem(tuner_module.RUNTIME.tuners, jax.default_backend(), serving)
    restored = restore_step(tmp_path / "ckpt", params, install=False)
    assert len(restored.tune_table) == 2
    assert serving.known.decisions() == []


def test_a_tampered_checkpoint_item_is_refused_naming_the_field(tmp_path, monkeypatch, params):
    save_step(tmp_path / "ckpt", params, table(tuners=[tuned_tuner(store_at(None))]))
    monkeypatch.setitem(tuner_module.RUNTIME.tuners, jax.default_backend(),
                        make_tuner(store_at(tmp_path / "serving.db")))
    path = tmp_path / "ckpt" / "1" / "tune_table" / TUNE_TABLE_FILENAME
    data = json.loads(path.read_text())
    data["schema_version"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(TuneTableError, match="schema_version"):
        restore_step(tmp_path / "ckpt", params)


def test_a_checkpoint_item_that_is_not_utf8_is_a_tune_table_error(tmp_path, monkeypatch, params):
    save_step(tmp_path / "ckpt", params, table(tuners=[tuned_tuner(store_at(None))]))
    monkeypatch.setitem(tuner_module.RUNTIME.tuners, jax.default_backend(),
                        make_tuner(store_at(tmp_path / "serving.db")))
    path = tmp_path / "ckpt" / "1" / "tune_table" / TUNE_TABLE_FILENAME
    path.write_bytes(path.read_bytes().replace(b"xla_dot", b"xla_d\xf6t"))
    with pytest.raises(TuneTableError, match="UnicodeDecodeError"):
        restore_step(tmp_path / "ckpt", params)


def test_a_checkpoint_item_that_is_a_fifo_is_refused_at_once(tmp_path, params):
    save_step(tmp_path / "ckpt", params, table(tuners=[tuned_tuner(store_at(None))]))
    item = tmp_path / "ckpt" / "1" / "tune_table"
    (item / TUNE_TABLE_FILENAME).unlink()
    os.mkfifo(item / TUNE_TABLE_FILENAME)
    code = ("import sys\n"
            "from etils import epath\n"
            "from jax_autotune.checkpoint import TuneTableHandler, TuneTableRestore\n"
            "try:\n"
            "    TuneTableHandler().restore(epath.Path(sys.argv[1]), TuneTableRestore(install=False))\n"
            "except OSError as err:\n"
            "    print(err)\n")
    done = subprocess.run([sys.executable, "-c", code, str(item)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == f"{item / TUNE_TABLE_FILENAME}: not a regular file (a FIFO)"


def test_jat_checkpoint_is_an_attribute_that_loads_orbax_on_first_use():
    code = ("import sys, jax_autotune as jat\n"
            "before = 'orbax.checkpoint' in sys.modules\n"
            "save = jat.checkpoint.TuneTableSave\n"
            "print(before, 'orbax.checkpoint' in sys.modules, save.__name__, jat.checkpoint.__name__)")
    done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True,
                          timeout=120)  # the installed package, as a user imports it
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True", "TuneTableSave", "jax_autotune.checkpoint"]


def test_saving_something_else_than_a_tune_table_names_the_argument():
    with pytest.raises(TypeError, match="TuneTableSave.table"):
        TuneTableSave({"not": "a table"})


# ---------------------------------------------------------------- the README example, end to end

def run_example(script, cwd, cache_dir, counting=False, **env):
    """Run one README script in a fresh process (``counting``: under tests/compile_counter.py,
    whose JSON line then comes last)."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("JAX_AUTOTUNE_")}
    environment.update(JAX_AUTOTUNE_CACHE_DIR=str(cache_dir), CKPT_DIR=str(cwd / "checkpoints"),
                       JAX_PLATFORMS="cpu", **env)
    command = [sys.executable, script]
    if counting:
        command = [sys.executable, str(Path(__file__).parent / "compile_counter.py"), script]
    done = subprocess.run(command, cwd=cwd, env=environment,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{script} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.mark.slow
def test_a_fresh_process_restores_the_checkpoint_and_tunes_nothing(tmp_path):
    assert callable(getattr(jat, "table", None)) and callable(getattr(jat, "load_table", None)), \
        "export table and load_table from jax_autotune/__init__.py (from jax_autotune.tables.table_file)"
    files = readme.files()  # the README's shipping example
    assert set(files) == {"model.py", "train_and_save.py", "serve.py"}
    for name, code in files.items():
        (tmp_path / name).write_text(code)
    trained = run_example("train_and_save.py", tmp_path, tmp_path / "training_cache",
                          JAX_AUTOTUNE_BUDGET_SECONDS="0.5")
    saved = json.loads(trained.strip().splitlines()[-1])
    assert saved["entries"] > 0

    empty_cache = tmp_path / "serving_cache"
    served = run_example("serve.py", tmp_path, empty_cache, JAX_AUTOTUNE_MODE="require")
    result = json.loads(served.strip().splitlines()[-1])
    assert result["stats"]["tuned"] == 0
    assert result["stats"]["candidate_runs"] == 0
    assert result["entries"] == saved["entries"]
    assert result["loss"] == pytest.approx(saved["loss"], rel=1e-5)
    assert list(empty_cache.glob("*.db")), "the restored decisions are in the (new) store"

    # a second start of the server loads the programs it jits (forward, gradient, loss) from
    # the compilation cache kept beside the store; what orbax compiles while restoring, before
    # the tune table reaches the tuner (the cache's first use), is the user's to cache
    again = run_example("serve.py", tmp_path, empty_cache, counting=True, JAX_AUTOTUNE_MODE="require")
    counts = json.loads(again.strip().splitlines()[-1])["compile_counter"]
    assert counts["hits"] >= 3, counts
    assert json.loads(again.strip().splitlines()[-2])["stats"]["tuned"] == 0
