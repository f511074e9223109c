"""Configuration: defaults, files, environment, keywords, sizes, and the errors."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from shmem.config import (
    ENV_VARIABLES,
    Config,
    env_value,
    environment_variables,
    load_config,
    parse_size,
)
from shmem.errors import ConfigError, ShmemError

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.toml"))


def test_configs_dir_is_not_empty() -> None:
    assert {p.name for p in CONFIGS} >= {"default.toml", "ci.toml", "gpu.toml"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_config_file_loads(path: Path) -> None:
    cfg = load_config(path, env={})
    assert cfg.source == str(path)
    assert cfg.heap.nbytes >= cfg.heap.alignment


def test_default_toml_equals_builtin_defaults() -> None:
    from_file = load_config(next(p for p in CONFIGS if p.name == "default.toml"), env={})
    assert dataclasses.replace(from_file, source="<defaults>") == Config()


@pytest.mark.parametrize(
    ("text", "nbytes"),
    [
        ("256MiB", 256 << 20),
        ("1GiB", 1 << 30),
        ("1.5 GiB", 3 << 29),
        ("64kB", 64_000),
        ("64KiB", 65536),
        ("512", 512),
        (4096, 4096),
        ("2 mib", 2 << 20),
        ("0", 0),
    ],
)
def test_parse_size(text: object, nbytes: int) -> None:
    assert parse_size(text) == nbytes


@pytest.mark.parametrize("bad", ["", "12XB", "-1", "1.3B", "MiB", True, -5, 1.5, None])
def test_parse_size_rejects(bad: object) -> None:
    with pytest.raises(ConfigError, match="parse_size"):
        parse_size(bad)


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "c.toml"
    p.write_text(text)
    return p


def test_precedence_defaults_file_env_keyword(tmp_path: Path) -> None:
    path = _write(tmp_path, '[heap]\nnbytes = "32MiB"\nalignment = 512\n[signal]\nslots = 8\n')
    assert load_config(env={}).heap.nbytes == 256 << 20
    cfg = load_config(path, env={})
    assert (cfg.heap.nbytes, cfg.heap.alignment, cfg.signal.slots) == (32 << 20, 512, 8)
    env = {"SHMEM_HEAP_NBYTES": "16MiB", "SHMEM_SIGNAL_SLOTS": "4"}
    cfg = load_config(path, env=env)
    assert (cfg.heap.nbytes, cfg.heap.alignment, cfg.signal.slots) == (16 << 20, 512, 4)
    cfg = load_config(path, env=env, heap_nbytes="8MiB")
    assert (cfg.heap.nbytes, cfg.signal.slots) == (8 << 20, 4)


def test_env_names_the_config_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "[signal]\ntimeout_s = 5\n")
    cfg = load_config(env={"SHMEM_CONFIG": str(path)})
    assert cfg.signal.timeout_s == 5.0
    assert cfg.source == str(path)


def test_env_types_are_parsed() -> None:
    env = {
        "SHMEM_HEAP_CHECK_SYMMETRY": "yes",
        "SHMEM_HEAP_NODE_SPLIT": "rank",
        "SHMEM_SIGNAL_TIMEOUT_S": "2.5",
        "SHMEM_DEVICE_ALLOW_GPU_SHARING": "0",
        "SHMEM_LAUNCH_LOG_DIR": "/tmp/x",  # the launcher's, not configuration
        "SHMEM_SYMMETRIC_SIZE": "1G",  # another library's (OpenSHMEM): left alone
    }
    cfg = load_config(env=env)
    assert cfg.heap.check_symmetry is True
    assert cfg.heap.node_split == "rank"
    assert cfg.signal.timeout_s == 2.5
    assert cfg.device.allow_gpu_sharing is False


def test_unknown_key_names_file_section_and_key(tmp_path: Path) -> None:
    path = _write(tmp_path, "[heap]\nnbytez = 1\n")
    with pytest.raises(ConfigError, match=r"c\.toml: unknown key 'nbytez' in \[heap\]"):
        load_config(path, env={})


def test_unknown_section_is_named(tmp_path: Path) -> None:
    path = _write(tmp_path, "[heapp]\nnbytes = 1\n")
    with pytest.raises(ConfigError, match=r"c\.toml: unknown section \[heapp\]"):
        load_config(path, env={})


def test_top_level_key_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a section"):
        load_config(_write(tmp_path, "nbytes = 1\n"), env={})


def test_unknown_env_key_is_named() -> None:
    with pytest.raises(ConfigError, match=r"environment SHMEM_HEAP_NBYTE: unknown key 'nbyte'"):
        load_config(env={"SHMEM_HEAP_NBYTE": "1MiB"})


def test_unknown_keyword_is_named() -> None:
    with pytest.raises(ConfigError, match="unknown keyword 'heapnbytes'"):
        load_config(env={}, heapnbytes=1)
    with pytest.raises(ConfigError, match=r"keyword heap_bytes: unknown key 'bytes'"):
        load_config(env={}, heap_bytes=1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"heap_node_split": "socket"}, r"\[heap\] node_split: invalid value"),
        ({"heap_alignment": 100}, r"\[heap\] alignment: invalid"),
        ({"heap_alignment": "256"}, "expected an integer"),
        ({"heap_check_symmetry": "yes"}, "expected a boolean"),
        ({"signal_timeout_s": 0}, r"\[signal\] timeout_s: invalid"),
        ({"signal_slots": 0}, r"\[signal\] slots: invalid"),
        ({"heap_nbytes": "8"}, r"\[heap\] nbytes: too small"),
        ({"log_level": "LOUD"}, "invalid value"),
        ({"nvshmem_bootstrap_ifname": 3}, "expected a string"),
    ],
)
def test_invalid_values(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(env={}, **kwargs)


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.toml", env={})
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(_write(tmp_path, "[heap\n"), env={})


def test_config_is_frozen_and_errors_share_a_base() -> None:
    cfg = load_config(env={})
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.heap.nbytes = 1  # type: ignore[misc]
    assert issubclass(ConfigError, ShmemError)
    assert issubclass(ConfigError, ValueError)


def test_nvshmem_environment() -> None:
    cfg = load_config(env={}, nvshmem_bootstrap_ifname="lo", nvshmem_disable_nvls=True)
    assert cfg.nvshmem.environment() == {
        "NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME": "lo",
        "NVSHMEM_DISABLE_NVLS": "1",
    }


def test_an_unknown_shmem_variable_is_refused_with_the_closest_name() -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'nbyte' in \[heap\]; did you mean nbytes"):
        load_config(env={"SHMEM_HEAP_NBYTE": "1GiB"})
    with pytest.raises(ConfigError, match=r"unknown variable SHMEM_HEAPS_NBYTES; did you mean "):
        load_config(env={"SHMEM_HEAPS_NBYTES": "1GiB"})
    with pytest.raises(ConfigError, match=r"SHMEM_KERNEL_CACH; did you mean SHMEM_KERNEL_CACHE\?"):
        load_config(env={"SHMEM_KERNEL_CACH": "off"})
    with pytest.raises(ConfigError, match=r"unknown variable SHMEM_XYZZY_QQQQ \(the SHMEM_\*"):
        load_config(env={"SHMEM_XYZZY_QQQQ": "1"})
    # the project's own variables and OpenSHMEM's standard ones are not configuration keys
    env = {name: "x" for name in ENV_VARIABLES} | {"SHMEM_DEBUG": "1", "SHMEM_INFO": "1"}
    env["SHMEM_CONFIG"] = ""
    load_config(env=env)


def test_every_variable_is_listed_once_with_what_it_does() -> None:
    names = environment_variables()
    assert "SHMEM_HEAP_NBYTES" in names and names["SHMEM_HEAP_NBYTES"] == "[heap] nbytes"
    assert "SHMEM_BACKEND" in names and "SHMEM_IPC_DIR" in names
    assert all(name.startswith("SHMEM_") and text for name, text in names.items())


def test_env_value_reads_only_the_projects_variables() -> None:
    assert env_value("SHMEM_BACKEND", {"SHMEM_BACKEND": "host"}) == "host"
    assert env_value("SHMEM_BACKEND", {"SHMEM_BACKEND": ""}) is None
    assert env_value("SHMEM_IPC_DIR", {}) is None
    with pytest.raises(ConfigError, match=r"'SHMEM_BACKEN' is not one of .*SHMEM_BACKEND\?"):
        env_value("SHMEM_BACKEN", {})
