"""tgictl.env: the typed environment snapshot."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tgictl.env import Env, inherited_environ
from tgictl.errors import ConfigError


def test_defaults_from_an_empty_environment() -> None:
    env = Env.from_environ({"HOME": "/home/u"})
    assert env.hf_hub_offline is False
    assert env.json_output is False
    assert env.log_level is None
    assert env.rank is None
    assert env.hub_cache_dir == Path("/home/u/.cache/huggingface/hub")
    assert env.cache_dir == Path("/home/u/.cache/tgictl")
    assert env.native_kernels is True and env.c_compiler is None


def test_values_are_typed() -> None:
    env = Env.from_environ(
        {
            "HOME": "/h",
            "HF_HOME": "/hf",
            "HF_HUB_OFFLINE": "1",
            "HF_ENDPOINT": "http://127.0.0.1:9",
            "HF_TOKEN": "secret",
            "HF_HUB_ETAG_TIMEOUT": "2.5",
            "TGICTL_CACHE_DIR": "/c",
            "LOG_LEVEL": "warning",
            "TGICTL_LOG_LEVEL": "debug",
            "TGICTL_JSON_OUTPUT": "true",
            "RANK": "1",
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29500",
        }
    )
    assert env.hub_cache_dir == Path("/hf/hub")
    assert env.cache_dir == Path("/c")
    assert env.hf_hub_offline is True
    assert env.hf_hub_etag_timeout == 2.5
    assert env.log_level == "debug"  # TGICTL_LOG_LEVEL wins over LOG_LEVEL
    assert env.json_output is True
    assert (env.rank, env.world_size, env.master_addr, env.master_port) == (1, 2, "127.0.0.1", 29500)
    assert "secret" not in repr(env)


def test_hf_hub_cache_wins_over_hf_home() -> None:
    env = Env.from_environ({"HOME": "/h", "HF_HOME": "/hf", "HF_HUB_CACHE": "/hub"})
    assert env.hub_cache_dir == Path("/hub")


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("HF_HUB_OFFLINE", "maybe", "HF_HUB_OFFLINE must be a boolean"),
        ("RANK", "one", "RANK must be an integer, got 'one'"),
        ("WORLD_SIZE", "0", "WORLD_SIZE must be >= 1, got 0"),
        ("MASTER_PORT", "70000", "MASTER_PORT must be <= 65535, got 70000"),
        ("HF_HUB_ETAG_TIMEOUT", "-1", "HF_HUB_ETAG_TIMEOUT must be > 0"),
        ("CUDA_VISIBLE_DEVICES", "0,a", "CUDA_VISIBLE_DEVICES must be a comma-separated list of GPU indices"),
        ("CUDA_VISIBLE_DEVICES", "0,,1", "got '0,,1'"),
        ("TGICTL_NATIVE_KERNELS", "sometimes", "TGICTL_NATIVE_KERNELS must be a boolean"),
    ],
)
def test_malformed_values_fail_loudly(name: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Env.from_environ({"HOME": "/h", name: value})


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),  # unset: every GPU
        ("", ()),  # set but empty: CUDA shows no GPU
        ("1,0", (1, 0)),  # CUDA's order, which is not NVML's
        (" 2 , 3 ", (2, 3)),
        ("-1", (-1,)),  # kept: discovery ends the list at the first index that does not exist
        ("GPU-8a2f9c1e-4b1d-4f55-9a6b-0c1d2e3f4a5b", None),  # UUIDs are not narrowed (see env.py)
        ("MIG-GPU-8a2f9c1e/1/0", None),
    ],
)
def test_cuda_visible_devices(value: str | None, expected: tuple[int, ...] | None) -> None:
    environ = {"HOME": "/h"} | ({"CUDA_VISIBLE_DEVICES": value} if value is not None else {})
    assert Env.from_environ(environ).cuda_visible_devices == expected


def test_inherited_environ_is_a_copy_children_may_change(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TGICTL_TEST_INHERITED", "kept")
    monkeypatch.delenv("TGICTL_TEST_ADDED", raising=False)
    child = inherited_environ()
    assert child["TGICTL_TEST_INHERITED"] == "kept"
    assert type(child) is dict
    child["TGICTL_TEST_ADDED"] = "1"
    del child["TGICTL_TEST_INHERITED"]
    # The launcher edits the copy per child; this process's own environment stays as it was.
    assert os.environ["TGICTL_TEST_INHERITED"] == "kept"
    assert "TGICTL_TEST_ADDED" not in os.environ


def test_the_api_key_is_read_but_never_printed() -> None:
    env = Env.from_environ({"HOME": "/h", "TGICTL_API_KEY": "s3cret"})
    assert env.api_key == "s3cret"
    assert "s3cret" not in repr(env)
    assert Env.from_environ({"HOME": "/h", "TGICTL_API_KEY": ""}).api_key is None


def test_native_kernels_switch_and_compiler() -> None:
    env = Env.from_environ({"HOME": "/h", "TGICTL_NATIVE_KERNELS": "0", "CC": "clang"})
    assert env.native_kernels is False and env.c_compiler == "clang"
    assert Env.from_environ({"HOME": "/h", "TGICTL_NATIVE_KERNELS": "on"}).native_kernels is True


def test_shard_library_defaults_leave_a_users_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from tgictl.env import (
        ONEDNN_CACHE_VAR,
        SHARD_ONEDNN_CACHE_CAPACITY,
        THP_VAR,
        apply_shard_library_defaults,
    )

    monkeypatch.delenv(ONEDNN_CACHE_VAR, raising=False)
    monkeypatch.delenv(THP_VAR, raising=False)
    apply_shard_library_defaults()
    assert os.environ[ONEDNN_CACHE_VAR] == str(SHARD_ONEDNN_CACHE_CAPACITY)
    assert os.environ[THP_VAR] == "1"
    monkeypatch.setenv(ONEDNN_CACHE_VAR, "500")
    monkeypatch.setenv(THP_VAR, "0")
    apply_shard_library_defaults()
    assert os.environ[ONEDNN_CACHE_VAR] == "500"
    assert os.environ[THP_VAR] == "0"


@pytest.mark.parametrize(("raw", "policy"), [(None, "auto"), ("auto", "auto"), ("1", "on"), ("on", "on"),
                                             ("0", "off"), ("false", "off")])
def test_prepack_weights_policy(raw: str | None, policy: str) -> None:
    environ = {"HOME": "/h"} if raw is None else {"HOME": "/h", "TGICTL_PREPACK_WEIGHTS": raw}
    assert Env.from_environ(environ).prepack_weights == policy


def test_a_malformed_prepack_policy_is_refused() -> None:
    with pytest.raises(ConfigError, match="TGICTL_PREPACK_WEIGHTS"):
        Env.from_environ({"HOME": "/h", "TGICTL_PREPACK_WEIGHTS": "sometimes"})


def test_thread_binding_switch_and_a_users_placement() -> None:
    env = Env.from_environ({"HOME": "/h"})
    assert env.bind_threads is True and env.user_thread_affinity is False
    assert Env.from_environ({"HOME": "/h", "TGICTL_BIND_THREADS": "off"}).bind_threads is False
    for name in ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY"):
        assert Env.from_environ({"HOME": "/h", name: "x"}).user_thread_affinity is True
    assert Env.from_environ({"HOME": "/h", "OMP_PROC_BIND": ""}).user_thread_affinity is False


def test_a_malformed_thread_binding_switch_is_refused() -> None:
    with pytest.raises(ConfigError, match="TGICTL_BIND_THREADS"):
        Env.from_environ({"HOME": "/h", "TGICTL_BIND_THREADS": "sometimes"})


@pytest.mark.parametrize(("raw", "threads"), [(None, None), ("", None), ("4", 4), ("4,2", 4), (" 3 ", 3)])
def test_omp_num_threads(raw: str | None, threads: int | None) -> None:
    environ = {"HOME": "/h"} if raw is None else {"HOME": "/h", "OMP_NUM_THREADS": raw}
    assert Env.from_environ(environ).omp_num_threads == threads


@pytest.mark.parametrize("raw", ["0", "many"])
def test_a_malformed_omp_num_threads_is_refused(raw: str) -> None:
    with pytest.raises(ConfigError, match="OMP_NUM_THREADS"):
        Env.from_environ({"HOME": "/h", "OMP_NUM_THREADS": raw})


def test_shard_openmp_defaults_leave_a_users_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from tgictl.env import SHARD_SPIN_COUNT, SPIN_COUNT_VAR, WAIT_POLICY_VAR, apply_shard_openmp_defaults

    monkeypatch.delenv(SPIN_COUNT_VAR, raising=False)
    monkeypatch.delenv(WAIT_POLICY_VAR, raising=False)
    assert apply_shard_openmp_defaults() is True
    assert os.environ[SPIN_COUNT_VAR] == str(SHARD_SPIN_COUNT)
    monkeypatch.setenv(SPIN_COUNT_VAR, "1000")
    assert apply_shard_openmp_defaults() is False
    assert os.environ[SPIN_COUNT_VAR] == "1000"
    # A wait policy decides the spin itself (passive: none); no count is added beside it.
    monkeypatch.delenv(SPIN_COUNT_VAR)
    monkeypatch.setenv(WAIT_POLICY_VAR, "passive")
    assert apply_shard_openmp_defaults() is False
    assert SPIN_COUNT_VAR not in os.environ
