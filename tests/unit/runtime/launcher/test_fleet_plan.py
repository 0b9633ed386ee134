"""What `tgictl launch --replicas N` runs: each replica's shards and router (private port and sockets,
pinned to its cores, OpenMP sized to them) and the gateway's command line, checked against what SMG's
own argument parser makes of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tgictl.config import LaunchConfig, LogConfig, RouterConfig
from tgictl.errors import ConfigError
from tgictl.runtime.launcher.fleet_plan import FleetPlan, build_fleet_plan, offset_endpoint, require_gateway

MODEL = Path("/models/tiny")
BASE = Path("/tmp/tgictl-test/shard")


def plan(replicas: int = 2, num_shard: int = 1, env: dict[str, str] | None = None, **router: object) -> FleetPlan:
    config = LaunchConfig(
        router=RouterConfig(master_shard_uds_path="", tokenizer_name="org/model", port=9000, **router),  # type: ignore[arg-type]
        model_id="org/model", num_shard=num_shard, replicas=replicas, gateway_policy="round_robin",
    )
    cpus = [tuple(range(i * 4, i * 4 + 4)) for i in range(replicas)]
    return build_fleet_plan(config, MODEL, BASE, LogConfig(), env or {"PATH": "/bin"}, cpus,
                            [7000 + i for i in range(replicas)], [29500 + i for i in range(replicas)], 7999)


def _flag(argv: tuple[str, ...], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_each_replica_is_a_private_pinned_launch() -> None:
    fleet = plan(num_shard=2)
    for index, replica in enumerate(fleet.replicas):
        launch = replica.launch
        assert replica.url == f"http://127.0.0.1:{7000 + index}"
        assert launch.socket_paths == (Path(f"/tmp/tgictl-test/shard-r{index}-0"), Path(f"/tmp/tgictl-test/shard-r{index}-1"))
        router = launch.router
        assert _flag(router.argv, "--hostname") == "127.0.0.1" and _flag(router.argv, "--port") == str(7000 + index)
        assert router.label == f"replica {index} router" and router.cpus == replica.cpus
        for rank, shard in enumerate(launch.shards):
            assert shard.label == f"replica {index} shard {rank}" and shard.cpus == tuple(range(index * 4, index * 4 + 4))
            assert shard.env["MASTER_PORT"] == str(29500 + index)
            assert shard.env["OMP_NUM_THREADS"] == "2"  # 4 cores, 2 shards
    # A user's OMP_NUM_THREADS is theirs.
    assert plan(env={"OMP_NUM_THREADS": "1"}).replicas[0].launch.shards[0].env["OMP_NUM_THREADS"] == "1"


def test_the_gateway_fronts_every_replica_on_the_public_port_as_smg_parses_it() -> None:
    from smg.launch_router import parse_router_args

    fleet = plan(replicas=3, hostname="0.0.0.0", graceful_termination_timeout_s=20.0)
    argv = fleet.gateway.argv
    assert argv[1:3] == ("-m", "tgictl.runtime.launcher.gateway_process")
    parsed = parse_router_args(list(argv[3:]))
    assert (parsed.host, parsed.port) == ("0.0.0.0", 9000)
    assert parsed.worker_urls == ["http://127.0.0.1:7000", "http://127.0.0.1:7001", "http://127.0.0.1:7002"]
    assert parsed.policy == "round_robin"
    assert parsed.prometheus_host == "127.0.0.1" and parsed.prometheus_port == 7999
    assert parsed.shutdown_grace_period_secs == 20
    assert parsed.model_aliases == {"tgi": "org/model"}
    assert fleet.gateway_address == ("127.0.0.1", 9000) and fleet.gateway_stop_timeout_s == 25.0


def test_the_api_key_reaches_the_gateway_and_routers_in_their_environment_only() -> None:
    fleet = plan(api_key="s3cret", env={"PATH": "/bin", "TGICTL_API_KEY": "inherited"})
    assert fleet.gateway.env["TGICTL_API_KEY"] == "s3cret"
    assert "s3cret" not in " ".join(fleet.gateway.argv)
    router = fleet.replicas[0].launch.router
    assert router.env["TGICTL_API_KEY"] == "s3cret" and "s3cret" not in " ".join(router.argv)
    assert "TGICTL_API_KEY" not in fleet.replicas[0].launch.shards[0].env


def test_replica_settings_are_checked() -> None:
    router = RouterConfig(master_shard_uds_path="", tokenizer_name="m")
    with pytest.raises(ConfigError, match="--replicas must be >= 1"):
        LaunchConfig(router=router, replicas=0)
    with pytest.raises(ConfigError, match="--replica-cpus needs --replicas 2 or more"):
        LaunchConfig(router=router, replica_cpus=("0",))
    with pytest.raises(ConfigError, match="--gateway-policy must be one of cache_aware, round_robin"):
        LaunchConfig(router=router, replicas=2, gateway_policy="fastest")


def test_a_missing_gateway_is_one_line_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    require_gateway(2)  # installed here (the test extra brings it)
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"^--replicas 2 runs .* not installed: pip install 'tgictl\[gateway\]'$"):
        require_gateway(2)


def test_each_replica_publishes_kv_events_on_its_own_endpoint() -> None:
    fleet = plan(kv_events_endpoint="tcp://*:5557", kv_events_replay_endpoint="tcp://*:5600")
    argvs = [r.launch.router.argv for r in fleet.replicas]
    assert [_flag(a, "--kv-events-endpoint") for a in argvs] == ["tcp://*:5557", "tcp://*:5558"]
    assert [_flag(a, "--kv-events-replay-endpoint") for a in argvs] == ["tcp://*:5600", "tcp://*:5601"]
    assert offset_endpoint("ipc:///tmp/kv", 2) == "ipc:///tmp/kv-r2" and offset_endpoint(None, 3) is None
