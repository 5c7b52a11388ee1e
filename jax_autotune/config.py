"""Configuration: every user-facing setting, where it comes from, and its checks.

Precedence, highest first: ``config.update(name, value)`` > environment variable >
config file > default. The file is the nearest ``jax_autotune.toml`` (top-level keys) or
``pyproject.toml`` with a ``[tool.jax_autotune]`` table, walking up from the working
directory. Only that table of a ``pyproject.toml`` is read: one without it is skipped, and
one that cannot be read or parsed is skipped too unless its text names the table
(``[tool.jax_autotune]``, ``tool.jax_autotune.level = ...``, ``jax_autotune = {...}``),
which gives one ``ConfigWarning`` and the defaults. ``jax_autotune.toml`` is the user's own
file for this package: one that cannot be read or parsed is a ``ConfigError``, like a bad
setting in it.

    >>> from jax_autotune import config
    >>> config.update("mode", "cached")
    >>> config.get("mode")
    'cached'

| setting        | env var                        | default                          |
|----------------|--------------------------------|----------------------------------|
| level          | JAX_AUTOTUNE_LEVEL             | balanced                         |
| cache          | JAX_AUTOTUNE_CACHE             | true (0 turns the disk store off)|
| cache_dir      | JAX_AUTOTUNE_CACHE_DIR         | the user cache dir (platformdirs)|
| environment    | JAX_AUTOTUNE_ENVIRONMENT       | default                          |
| store          | JAX_AUTOTUNE_STORE             | sqlite (directory: a shared filesystem; memory) |
| mode           | JAX_AUTOTUNE_MODE              | tune                             |
| log_decisions  | JAX_AUTOTUNE_LOG_DECISIONS     | unset (stdout, stderr or a path) |
| budget_seconds | JAX_AUTOTUNE_BUDGET_SECONDS    | 10.0 (per-key tuning budget)     |
| compilation_cache | JAX_AUTOTUNE_COMPILATION_CACHE | true (JAX's cache beside the store) |
| context        | JAX_AUTOTUNE_CONTEXT           | full (autotune keys each dot with its epilogue, backward too; forward; off) |
| progress       | JAX_AUTOTUNE_PROGRESS          | auto (a line on a terminal; on, off) |

The tuner reads none of these itself: ``policy()`` reads the tuning settings once where a
compile's matmul lowering or a ``warmup`` starts and hands them down as a frozen
``Policy``; ``store_choice()`` names the store. A trace or compile that meets a bad
setting warns (``ConfigWarning``, naming it) and runs XLA's dot (``compile_policy()``);
``update``, ``get``, ``policy`` and ``warmup`` raise ``ConfigError``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import threading
import tomllib
import warnings
from pathlib import Path
from typing import Any, Callable

from jax_autotune.errors import ConfigError, ConfigWarning
from jax_autotune.files import open_regular
from jax_autotune.key import Level
from jax_autotune.tuning.policy import Policy, StoreChoice

MODES = ("tune", "cached", "require", "off")
STORES = ("sqlite", "directory", "memory")
CONTEXTS = ("full", "forward", "off")
PROGRESS = ("auto", "on", "off")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _parse_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(f"{name}: expected one of {_TRUE + _FALSE}, got {value!r}")


def _parse_progress(name: str, value: Any) -> str:
    """``auto``, ``on`` or ``off``; a boolean (``1``, ``true``, ``0``, ``false``, ...) is on or off."""
    text = str(value).strip().lower()
    if text in PROGRESS:
        return text
    try:
        return "on" if _parse_bool(name, value) else "off"
    except ConfigError:
        raise ConfigError(f"{name}: expected one of {', '.join(PROGRESS)} (or a boolean), "
                          f"got {value!r}") from None


def _parse_choice(choices: tuple[str, ...]) -> Callable[[str, Any], str]:
    def parse(name: str, value: Any) -> str:
        text = str(value.value if hasattr(value, "value") else value).strip().lower()
        if text not in choices:
            raise ConfigError(f"{name}: expected one of {', '.join(choices)}, got {value!r}")
        return text
    return parse


def _text(name: str, value: Any, expected: str) -> str:
    """``value`` as text when it is a string or a path; a number or a boolean (e.g. from
    the toml file) is a ConfigError, never a name like './5'."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise ConfigError(f"{name}: expected {expected} (a string), got {value!r}")
    return value


def _parse_environment(name: str, value: Any) -> str:
    text = _text(name, value, "a database name")
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", text) or text.startswith("."):
        raise ConfigError(f"{name}: expected a database name of letters, digits, '_', '.', '-' "
                          f"(1-64 chars), got {value!r}")
    return text


def _parse_path(name: str, value: Any) -> str:
    text = _text(name, value, "a directory path")
    if not text.strip():
        raise ConfigError(f"{name}: expected a directory path, got an empty string")
    return os.path.abspath(os.path.expanduser(text))


def _parse_log(name: str, value: Any) -> str | None:
    if value is None:
        return None
    text = _text(name, value, "stdout, stderr, a file path or none").strip()
    if text == "" or text.lower() in ("none", "0", "off"):
        return None
    if text in ("stdout", "stderr"):
        return text
    return os.path.abspath(os.path.expanduser(text))


def _parse_seconds(name: str, value: Any) -> float:
    try:
        seconds = float("nan") if isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise ConfigError(f"{name}: expected a positive number of seconds, got {value!r}")
    return seconds


def _default_cache_dir() -> str:
    import platformdirs
    return platformdirs.user_cache_dir("jax_autotune", appauthor=False)


@dataclasses.dataclass(frozen=True)
class Setting:
    name: str
    env: str
    parse: Callable[[str, Any], Any]
    default: Callable[[], Any]


SETTINGS: dict[str, Setting] = {s.name: s for s in (
    Setting("level", "JAX_AUTOTUNE_LEVEL", _parse_choice(tuple(l.value for l in Level)),
            lambda: Level.BALANCED.value),
    Setting("cache", "JAX_AUTOTUNE_CACHE", _parse_bool, lambda: True),
    Setting("cache_dir", "JAX_AUTOTUNE_CACHE_DIR", _parse_path, _default_cache_dir),
    Setting("environment", "JAX_AUTOTUNE_ENVIRONMENT", _parse_environment, lambda: "default"),
    Setting("store", "JAX_AUTOTUNE_STORE", _parse_choice(STORES), lambda: "sqlite"),
    Setting("mode", "JAX_AUTOTUNE_MODE", _parse_choice(MODES), lambda: "tune"),
    Setting("log_decisions", "JAX_AUTOTUNE_LOG_DECISIONS", _parse_log, lambda: None),
    Setting("budget_seconds", "JAX_AUTOTUNE_BUDGET_SECONDS", _parse_seconds, lambda: 10.0),
    Setting("compilation_cache", "JAX_AUTOTUNE_COMPILATION_CACHE", _parse_bool, lambda: True),
    Setting("context", "JAX_AUTOTUNE_CONTEXT", _parse_choice(CONTEXTS), lambda: "full"),
    Setting("progress", "JAX_AUTOTUNE_PROGRESS", _parse_progress, lambda: "auto"),
)}

_lock = threading.Lock()
_explicit: dict[str, Any] = {}
_file_cache: dict[str, tuple[Path | None, dict[str, Any]]] = {}
_warned_files: set[Path] = set()
_warned_settings: set[str] = set()  # bad settings a compile has warned of
# a line of TOML that names our table: [tool.jax_autotune...], tool.jax_autotune... =, or
# (under [tool]) jax_autotune = / jax_autotune.x =
_OUR_TABLE = re.compile(r"""^[ \t]*(\[\[?[ \t]*tool[ \t]*\.[ \t]*|tool[ \t]*\.[ \t]*)?"""
                        r"""(jax_autotune|"jax_autotune"|'jax_autotune')[ \t]*[.=\]]""", re.M)


def _setting(name: str) -> Setting:
    if name not in SETTINGS:
        raise ConfigError(f"unknown setting {name!r}; allowed: {', '.join(SETTINGS)}")
    return SETTINGS[name]


def find_config_file(start: str | os.PathLike | None = None) -> tuple[Path | None, dict[str, Any]]:
    """The nearest config file above ``start`` (default: cwd) and its jax_autotune table
    (see the module docstring for which files count).

        >>> find_config_file("/home/me/project")
        (PosixPath('/home/me/project/pyproject.toml'), {'mode': 'cached'})
    """
    directory = Path(start or os.getcwd()).resolve()
    for folder in (directory, *directory.parents):
        own = folder / "jax_autotune.toml"
        if own.is_file():
            try:
                return own, _read_toml(own)
            except _UNREADABLE as err:
                raise ConfigError(f"{own}: cannot read config file: {type(err).__name__}: "
                                  f"{err}") from None
        pyproject = folder / "pyproject.toml"
        if pyproject.is_file():
            table = _pyproject_table(pyproject)
            if table is not None:
                return pyproject, table
    return None, {}


_UNREADABLE = (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError)  # toml is UTF-8


def _read_toml(path: Path) -> dict[str, Any]:
    with open_regular(path) as f:
        return tomllib.loads(f.read().decode("utf-8"))


def _pyproject_table(path: Path) -> dict[str, Any] | None:
    """The ``[tool.jax_autotune]`` table of a pyproject.toml; None when it has none (or
    cannot be read and does not name it); {} with one ConfigWarning when it cannot be read
    and may hold it (an unreadable file, or text that names the table)."""
    try:
        tool = _read_toml(path).get("tool")
    except _UNREADABLE as err:
        try:
            with open_regular(path) as f:
                names_it = _OUR_TABLE.search(f.read().decode("utf-8", "replace")) is not None
        except OSError:
            names_it = True  # cannot tell
        if not names_it:
            return None
        if path not in _warned_files:
            _warned_files.add(path)
            warnings.warn(f"jax_autotune: {path} may hold [tool.jax_autotune] but cannot be "
                          f"read ({type(err).__name__}: {err}); its settings are not used: "
                          f"defaults (and environment variables) until it is fixed",
                          ConfigWarning, stacklevel=5)
        return {}
    table = tool.get("jax_autotune") if isinstance(tool, dict) else None
    if table is not None and not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.jax_autotune] must be a table")
    return table


def _file_values() -> tuple[Path | None, dict[str, Any]]:
    cwd = os.getcwd()
    with _lock:
        if cwd not in _file_cache:
            _file_cache[cwd] = find_config_file(cwd)
        return _file_cache[cwd]


def get(name: str) -> Any:
    """The effective value of setting ``name`` (explicit > env > file > default)."""
    return resolve(name)[0]


def source(name: str) -> str:
    """Where ``name``'s value comes from: 'explicit', 'env', a file path, or 'default'."""
    return resolve(name)[1]


def resolve(name: str) -> tuple[Any, str]:
    setting = _setting(name)
    with _lock:
        if name in _explicit:
            return _explicit[name], "explicit"
    raw_env = os.environ.get(setting.env)
    if raw_env is not None and raw_env != "":
        return setting.parse(setting.env, raw_env), "env"
    path, table = _file_values()
    if table:
        unknown = set(table) - set(SETTINGS)
        if unknown:
            raise ConfigError(f"{path}: unknown setting(s) {sorted(unknown)}; allowed: "
                              f"{', '.join(SETTINGS)}")
        if name in table:
            return setting.parse(f"{path}: {name}", table[name]), str(path)
    return setting.parse(name, setting.default()), "default"


def update(name: str, value: Any) -> None:
    """Set ``name`` for this process; ``None`` removes the explicit value again."""
    setting = _setting(name)
    with _lock:
        if value is None:
            _explicit.pop(name, None)
        else:
            _explicit[name] = setting.parse(name, value)


def reset() -> None:
    """Forget explicit values and cached config files (tests use this)."""
    with _lock:
        _explicit.clear()
        _file_cache.clear()
        _warned_files.clear()
        _warned_settings.clear()


def policy() -> Policy:
    """The tuning settings now, as one frozen ``Policy`` (a bad one: ``ConfigError``).

        >>> policy().mode
        'tune'
    """
    return Policy(mode=get("mode"), level=get("level"), budget_seconds=get("budget_seconds"),
                  log_decisions=get("log_decisions"), progress=get("progress"), context=get("context"))


def compile_policy() -> Policy:
    """``policy()`` for a trace or a compile: where a setting is bad, one ``ConfigWarning``
    naming it and mode ``off`` (XLA's dot runs every tuned matmul: the user's matmul never
    fails because of the tuner's settings).

        >>> os.environ["JAX_AUTOTUNE_MODE"] = "fast"
        >>> compile_policy().mode              # ConfigWarning: ... JAX_AUTOTUNE_MODE ...
        'off'
    """
    try:
        return policy()
    except ConfigError as err:
        warn_bad_setting(err)
        return Policy(mode="off")


def warn_bad_setting(err: ConfigError) -> None:
    """One ``ConfigWarning`` per distinct bad setting: the compile runs XLA's dot."""
    text = str(err)
    with _lock:
        if text in _warned_settings:
            return
        _warned_settings.add(text)
    warnings.warn(f"jax_autotune: a bad setting ({text}); XLA's dot runs every tuned matmul "
                  f"until it is fixed", ConfigWarning, stacklevel=3)


def store_choice() -> StoreChoice:
    """Which store the settings name (``cache``, ``cache_dir``, ``environment``, ``store``).

        >>> open_store(store_choice())
        SqliteStore('/home/me/.cache/jax_autotune/default.db', on disk)
    """
    return StoreChoice(cache=get("cache"), cache_dir=get("cache_dir"), environment=get("environment"),
                       store=get("store"))
