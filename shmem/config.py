"""Configuration: frozen dataclasses read from TOML, the environment and keywords.

Precedence, lowest to highest: built-in defaults < TOML file < ``SHMEM_<SECTION>_<KEY>``
environment variables < keyword arguments (``heap_nbytes="1GiB"``). Unknown sections and keys
are rejected with the source, section and key named, and so is any ``SHMEM_*`` environment
variable that is neither such an override nor one of :data:`ENV_VARIABLES` (with the closest
valid name suggested). This module is the one reader of the project's environment variables:
other modules ask :func:`env_value`. Sizes accept integers or strings such
as ``"256MiB"``, ``"1.5GiB"`` or ``"64kB"``.

This module is pure: it imports neither MPI nor CUDA.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

from .errors import ConfigError

__all__ = [
    "CollectivesConfig",
    "Config",
    "DeviceConfig",
    "FlightConfig",
    "HeapConfig",
    "LogConfig",
    "NvshmemConfig",
    "SignalConfig",
    "check_environment",
    "env_value",
    "environment_variables",
    "load_config",
    "parse_size",
]

ENV_PREFIX = "SHMEM_"
ENV_CONFIG_FILE = "SHMEM_CONFIG"

# Every SHMEM_* variable the project reads, besides the SHMEM_<SECTION>_<KEY> overrides of the
# configuration (those are listed by environment_variables()). This module is the only reader:
# other modules call env_value(); an unlisted SHMEM_* variable is refused by load_config().
ENV_VARIABLES: dict[str, str] = {
    "SHMEM_CONFIG": "a TOML configuration file to load (python -m launch --config sets it)",
    "SHMEM_BACKEND": "pins init(backend='auto') to 'host', 'nvshmem' or 'auto'",
    "SHMEM_KERNEL_CACHE": "the NVRTC cubin cache directory, or 'off'",
    "SHMEM_IPC_DIR": "the directory of IPC sockets and the registry (mode 0700)",
    "SHMEM_LAUNCH_LOG_DIR": "set by python -m launch: where each rank writes its log and records",
    "SHMEM_LAUNCH_GPU": "set by python -m launch: the GPU a rank is bound to",
    "SHMEM_VENV": "./dev: the virtualenv directory (read by the script, not by Python)",
    "SHMEM_REQUIRE_NVRTC": "tests: fail instead of skipping NVRTC checks when NVRTC is missing",
    "SHMEM_REQUIRE_GPU": (
        "1: a failed CUDA or nvshmem probe is an error, not 'no GPU' (./dev gpu sets it)"
    ),
    "SHMEM_TEST_VERDICT_TIMEOUT_S": "tests: how long a rank waits for the agreed verdict",
    "SHMEM_TEST_FAILED_RANK_TIMEOUT_S": "tests: the same, for a rank that failed itself",
}
# The OpenSHMEM specification's own variables share the prefix; they belong to an OpenSHMEM
# library that may run in the same environment, so they are known and left alone.
ENV_OPENSHMEM = frozenset({"SHMEM_VERSION", "SHMEM_INFO", "SHMEM_SYMMETRIC_SIZE", "SHMEM_DEBUG"})

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_size(value: object, where: str = "parse_size") -> int:
    """Parse a byte count: an ``int`` or a string like ``"256MiB"``, ``"1.5 GiB"``, ``"64kB"``.

    Parameters
    ----------
    value : int or str
        Bytes, or a number with a unit (``B``, ``kB``/``KiB``, ``MB``/``MiB``, ``GB``/``GiB``...).
    where : str, optional
        What is being parsed, to head the error message (a config key, a function's name).

    Returns
    -------
    int
        The number of bytes.

    Raises
    ------
    ConfigError
        A bool, a negative number, a fraction of a byte, or a string that is no size.
    """
    if isinstance(value, bool):
        raise ConfigError(f"{where}: a size must be bytes or a string (got {value!r})")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"{where}: a size cannot be negative (got {value})")
        return value
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m is not None:
            unit = m.group(2).lower()
            if unit in _SIZE_UNITS:
                nbytes = float(m.group(1)) * _SIZE_UNITS[unit]
                if nbytes != int(nbytes):
                    raise ConfigError(f"{where}: a size must be whole bytes (got {value!r})")
                return int(nbytes)
    raise ConfigError(
        f"{where}: cannot parse size (got {value!r}; expected bytes or a string "
        "like '256MiB', '1GiB', '64kB')"
    )


def _size(default: str) -> Any:
    return field(default=parse_size(default), metadata={"size": True})


def _choice(default: str, *choices: str) -> Any:
    return field(default=default, metadata={"choices": choices})


@dataclass(frozen=True)
class HeapConfig:
    """The symmetric heap.

    nbytes: bytes of heap per rank. alignment: allocation alignment in bytes (a power of two,
    at least 64). check_symmetry: all-gather every alloc/free's arguments and raise
    ``CollectiveMismatchError`` when ranks disagree. node_split: ``"node"`` (ranks sharing
    memory form a node), ``"rank"`` (every rank is its own node, so the off-node RMA path
    runs on one machine) or a number ``"K"`` (nodes of K consecutive ranks of a real node, to
    test hierarchical algorithms with several ranks per node on one machine).
    """

    nbytes: int = _size("256MiB")
    alignment: int = 256
    check_symmetry: bool = False
    node_split: str = "node"


@dataclass(frozen=True)
class SignalConfig:
    """Signal pads: user slots per pad and the default deadline of every wait, in seconds."""

    slots: int = 1024
    timeout_s: float = 60.0


@dataclass(frozen=True)
class CollectivesConfig:
    """Collectives (``collectives.Communicator``).

    scratch_nbytes / scratch_max_nbytes: the symmetric scratch each rank starts with, and the
    most it grows to (larger messages are processed in pieces). algorithm: ``"auto"`` (the
    built-in table) or one of ``one_shot``, ``two_shot``, ``hierarchical`` for every call.
    one_shot_max_nbytes: ``"auto"`` or a size: messages up to it use one-shot on one node.
    float32_accumulate: ``"float32"`` or ``"float64"``. check_args: all-gather every call's
    arguments and raise ``CollectiveMismatchError`` when ranks disagree (debug).
    """

    scratch_nbytes: int = _size("8MiB")
    scratch_max_nbytes: int = _size("64MiB")
    algorithm: str = _choice("auto", "auto", "one_shot", "two_shot", "hierarchical")
    one_shot_max_nbytes: str = "auto"
    float32_accumulate: str = _choice("float32", "float32", "float64")
    check_args: bool = False


@dataclass(frozen=True)
class LogConfig:
    """Logging level for the ``shmem`` loggers (the launcher installs the handler)."""

    level: str = _choice("INFO", "DEBUG", "INFO", "WARNING", "ERROR")


@dataclass(frozen=True)
class DeviceConfig:
    """Device binding: allow several ranks of a node to share one GPU."""

    allow_gpu_sharing: bool = False


@dataclass(frozen=True)
class NvshmemConfig:
    """Environment handed to NVSHMEM by the launcher (empty strings are not set)."""

    bootstrap_ifname: str = ""
    remote_transport: str = ""
    disable_nvls: bool = False
    disable_nccl: bool = False

    def environment(self) -> dict[str, str]:
        """The ``NVSHMEM_*`` variables this configuration sets."""
        env: dict[str, str] = {}
        if self.bootstrap_ifname:
            env["NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME"] = self.bootstrap_ifname
        if self.remote_transport:
            env["NVSHMEM_REMOTE_TRANSPORT"] = self.remote_transport
        if self.disable_nvls:
            env["NVSHMEM_DISABLE_NVLS"] = "1"
        if self.disable_nccl:
            env["NVSHMEM_DISABLE_NCCL"] = "1"
        return env


@dataclass(frozen=True)
class FlightConfig:
    """The flight recorder (:mod:`shmem.flight`) and stalls.

    records: the calls each rank keeps (collective and synchronisation calls: the last
    ``records`` of them; 0 turns the recorder off). stall_timeout_s: ``python -m launch``
    declares the job stalled when no rank has completed a recorded call for this long (0:
    never; ``--stall-timeout`` overrides it).
    """

    records: int = 64
    stall_timeout_s: float = 0.0


@dataclass(frozen=True)
class Config:
    """The whole configuration; ``source`` says where the file part came from.

    Parameters
    ----------
    heap : HeapConfig
        The ``[heap]`` section: heap size per rank, alignment, symmetry checks, node split.
    signal : SignalConfig
        The ``[signal]`` section: signal slots and the deadline of every wait.
    collectives : CollectivesConfig
        The ``[collectives]`` section: algorithm choice and its thresholds.
    log : LogConfig
        The ``[log]`` section.
    device : DeviceConfig
        The ``[device]`` section: the backend and device selection.
    nvshmem : NvshmemConfig
        The ``[nvshmem]`` section: the GPU backend's settings.
    flight : FlightConfig
        The ``[flight]`` section: the flight recorder's size and the launcher's stall timeout.
    source : str
        Where the file part came from (a path, or ``"<defaults>"``).

    See Also
    --------
    load_config : reads a file, the environment and keyword overrides into a Config.
    """

    heap: HeapConfig = field(default_factory=HeapConfig)
    signal: SignalConfig = field(default_factory=SignalConfig)
    collectives: CollectivesConfig = field(default_factory=CollectivesConfig)
    log: LogConfig = field(default_factory=LogConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    nvshmem: NvshmemConfig = field(default_factory=NvshmemConfig)
    flight: FlightConfig = field(default_factory=FlightConfig)
    source: str = "<defaults>"


_SECTIONS: dict[str, type[Any]] = {
    f.name: f.default_factory  # type: ignore[misc]
    for f in dataclasses.fields(Config)
    if f.name != "source"
}


def _convert(section: str, key: str, value: object, origin: str) -> object:
    """Check and convert one value to its field's type (strings from the environment too)."""
    cls = _SECTIONS[section]
    fld = next(f for f in dataclasses.fields(cls) if f.name == key)
    typ = get_type_hints(cls)[key]
    where = f"{origin}: [{section}] {key}"
    from_env = origin.startswith("environment")
    if fld.metadata.get("size"):
        out: object = parse_size(value, where)
    elif typ is bool:
        if isinstance(value, bool):
            out = value
        elif from_env and isinstance(value, str) and value.lower() in {"1", "true", "yes", "on"}:
            out = True
        elif from_env and isinstance(value, str) and value.lower() in {"0", "false", "no", "off"}:
            out = False
        else:
            raise ConfigError(f"{where}: expected a boolean (got {value!r})")
    elif typ is int:
        if isinstance(value, str) and from_env and re.fullmatch(r"-?[0-9]+", value.strip()):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer (got {value!r})")
        out = value
    elif typ is float:
        if isinstance(value, str) and from_env:
            with contextlib.suppress(ValueError):
                value = float(value)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: expected a number (got {value!r})")
        out = float(value)
    else:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string (got {value!r})")
        out = value
    choices = fld.metadata.get("choices")
    if choices and out not in choices:
        raise ConfigError(f"{where}: invalid value (got {out!r}; expected one of {list(choices)})")
    return out


def _validate(cfg: Config) -> Config:
    split = cfg.heap.node_split
    if split not in ("node", "rank") and not (split.isdigit() and int(split) >= 1):
        raise ConfigError(
            f"{cfg.source}: [heap] node_split: invalid value (got {split!r}; expected 'node', "
            "'rank' or a positive number of ranks per node)"
        )
    osm = cfg.collectives.one_shot_max_nbytes
    if osm != "auto":
        parse_size(osm, f"{cfg.source}: [collectives] one_shot_max_nbytes")
    if cfg.collectives.scratch_max_nbytes < cfg.collectives.scratch_nbytes:
        raise ConfigError(
            f"{cfg.source}: [collectives] scratch_max_nbytes: too small (got "
            f"{cfg.collectives.scratch_max_nbytes}; expected >= scratch_nbytes "
            f"{cfg.collectives.scratch_nbytes})"
        )
    a = cfg.heap.alignment
    if a < 64 or a & (a - 1):
        raise ConfigError(
            f"{cfg.source}: [heap] alignment: invalid (got {a}; expected a power of two >= 64)"
        )
    if cfg.heap.nbytes < a:
        raise ConfigError(
            f"{cfg.source}: [heap] nbytes: too small (got {cfg.heap.nbytes}; expected >= {a})"
        )
    if cfg.signal.slots < 1:
        raise ConfigError(
            f"{cfg.source}: [signal] slots: invalid (got {cfg.signal.slots}; expected >= 1)"
        )
    if not cfg.signal.timeout_s > 0:
        raise ConfigError(
            f"{cfg.source}: [signal] timeout_s: invalid (got {cfg.signal.timeout_s}; expected > 0)"
        )
    if not 0 <= cfg.flight.records <= 1 << 20:
        raise ConfigError(
            f"{cfg.source}: [flight] records: invalid (got {cfg.flight.records}; expected 0 "
            "(off) to 1048576 calls)"
        )
    if not cfg.flight.stall_timeout_s >= 0:
        raise ConfigError(
            f"{cfg.source}: [flight] stall_timeout_s: invalid (got {cfg.flight.stall_timeout_s}; "
            "expected seconds >= 0, 0: off)"
        )
    return cfg


def environment_variables() -> dict[str, str]:
    """Every ``SHMEM_*`` variable the project understands, with what it does: the
    ``SHMEM_<SECTION>_<KEY>`` overrides of the configuration and :data:`ENV_VARIABLES`."""
    names = dict(ENV_VARIABLES)
    for section, cls in _SECTIONS.items():
        for f in dataclasses.fields(cls):
            names[f"{ENV_PREFIX}{section.upper()}_{f.name.upper()}"] = f"[{section}] {f.name}"
    return dict(sorted(names.items()))


def _suggest(name: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def check_environment(env: Mapping[str, str] | None = None) -> None:
    """Raise :class:`ConfigError` for a ``SHMEM_*`` variable the project does not know,
    naming the closest valid one (a typo must not be skipped silently)."""
    env = os.environ if env is None else env
    known = environment_variables()
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or name in known or name in ENV_OPENSHMEM:
            continue
        if _split_flat(name[len(ENV_PREFIX) :].lower()) is not None:
            continue  # a known section: load_config names the unknown key and its neighbour
        raise ConfigError(
            f"environment: unknown variable {name}{_suggest(name, list(known))} (the "
            "SHMEM_* variables are listed by shmem.config.environment_variables())"
        )


def env_value(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """The value of the project's environment variable ``name`` (one of
    :data:`ENV_VARIABLES`), or None when it is unset or empty."""
    if name not in ENV_VARIABLES:
        raise ConfigError(
            f"env_value: {name!r} is not one of the project's variables"
            f"{_suggest(name, list(ENV_VARIABLES))}"
        )
    value = (os.environ if env is None else env).get(name, "")
    return value or None


def _merge(
    values: dict[str, dict[str, object]], section: str, key: str, value: object, origin: str
) -> None:
    if section not in _SECTIONS:
        raise ConfigError(
            f"{origin}: unknown section [{section}] (expected one of {sorted(_SECTIONS)})"
        )
    known = [f.name for f in dataclasses.fields(_SECTIONS[section])]
    if key not in known:
        raise ConfigError(
            f"{origin}: unknown key {key!r} in [{section}]{_suggest(key, known)} (expected one "
            f"of {known})"
        )
    values.setdefault(section, {})[key] = _convert(section, key, value, origin)


def _split_flat(name: str) -> tuple[str, str] | None:
    """Split ``heap_check_symmetry`` into ``("heap", "check_symmetry")`` (no ``_`` in sections)."""
    section, sep, key = name.partition("_")
    return (section, key) if sep and section in _SECTIONS else None


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    **overrides: Any,
) -> Config:
    """Load the configuration.

    Parameters
    ----------
    path : path-like, optional
        A TOML file. When None, ``$SHMEM_CONFIG`` names one if set; else only defaults apply.
    env : mapping, optional
        The environment to read ``SHMEM_<SECTION>_<KEY>`` from (default ``os.environ``).
    **overrides
        ``<section>_<key>=value`` keywords, the highest precedence.

    Returns
    -------
    Config
        The frozen configuration, ``source`` naming the file (or ``"<defaults>"``).

    Raises
    ------
    ConfigError
        Unknown section or key (named with its source), wrong type, or invalid value.
    """
    env = os.environ if env is None else env
    values: dict[str, dict[str, object]] = {}
    source = "<defaults>"
    if path is None and env.get(ENV_CONFIG_FILE):
        path = env[ENV_CONFIG_FILE]
    if path is not None:
        p = Path(path)
        source = str(p)
        try:
            with p.open("rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"load_config: config file not found (got {str(p)!r})") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"load_config: {p}: invalid TOML ({exc})") from None
        for section, table in data.items():
            if not isinstance(table, dict):
                raise ConfigError(
                    f"{p}: top-level key {section!r} is not a section (expected [section] tables)"
                )
            for key, value in table.items():
                _merge(values, section, key, value, str(p))
    check_environment(env)
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or name in ENV_VARIABLES or name in ENV_OPENSHMEM:
            continue
        split = _split_flat(name[len(ENV_PREFIX) :].lower())
        if split is not None:  # check_environment() refused every other name
            _merge(values, *split, env[name], f"environment {name}")
    for name, value in overrides.items():
        split = _split_flat(name)
        if split is None:
            raise ConfigError(
                f"load_config: unknown keyword {name!r} (expected <section>_<key> with section "
                f"one of {sorted(_SECTIONS)})"
            )
        _merge(values, *split, value, f"keyword {name}")
    sections = {name: cls(**values.get(name, {})) for name, cls in _SECTIONS.items()}
    return _validate(Config(**sections, source=source))
