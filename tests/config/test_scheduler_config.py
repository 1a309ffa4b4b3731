"""The scheduler configuration (config.scheduler): the shipped files are the presets, plugin
merging follows kube-scheduler, defaults equal the flags' defaults, bad input names the field,
and the command line overrides the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import typer
import yaml
from typer.testing import CliRunner

from kallot.cli import scheduler as cli_scheduler
from kallot.config import presets
from kallot.config import scheduler as sc
from kallot.core import policies
from kallot.core.errors import ConfigError
from kallot.core.framework.runner import Framework
from kallot.core.queueing.queue_tree import Queue, QueueTree
from kallot.core.scheduler import Scheduler
from kallot.kube.app import ControllerConfig
from kallot.kube.state.cache import CacheTuning
from kallot.sim import openb, trace

HEAD = {"apiVersion": sc.API_VERSION, "kind": sc.KIND}
SHIPPED = Path(sc.__file__).parent / "profiles"


def doc(**fields: Any) -> dict[str, Any]:
    return {**HEAD, **fields}


def test_the_shipped_files_are_exactly_the_presets() -> None:
    assert set(sc.shipped_names()) == set(presets.PROFILES)
    for name in sc.shipped_names():
        built = sc.to_profile(sc.shipped(name), name=name)
        preset = presets.PROFILES[name]
        # Same plugins at every point, in the same order, with the same weights and args.
        assert built == preset, name


def test_an_empty_document_is_the_default_policy_and_the_flags_defaults() -> None:
    config = sc.parse(HEAD)
    assert sc.to_profile(config, name="kallot") == presets.PROFILES[cli_scheduler.DEFAULT_POLICY]
    # Every file field a flag also sets has the flag's default (so --policy NAME with no flags
    # runs what it ran before the file existed).
    app = typer.Typer()
    cli_scheduler.register(app)
    command = typer.main.get_command(app).commands["scheduler"]  # type: ignore[attr-defined]
    flags = {p.name: p.default for p in command.params}
    e, s, q = config.leader_election, config.session_sizing, config.queue
    pairs = {
        "leader_elect": e.leader_elect,
        "lease_namespace": e.lease_namespace,
        "lease_name": e.lease_name,
        "lease_duration": e.lease_duration,
        "renew_deadline": e.renew_deadline,
        "retry_period": e.retry_period,
        "acquire_period": e.acquire_period,
        "max_clock_skew": e.max_clock_skew,
        "metrics_address": config.metrics_address,
        "bind_workers": config.bind_workers,
        "session_target": s.target_seconds,
        "min_session_pods": s.min_pods,
        "max_session_pods": s.max_pods,
        "session_max_wall": s.max_wall_seconds,
        "seed": config.seed,
        "retry_interval": q.retry_interval,
        "resync": config.resync_seconds,
        "scheduled_events": config.scheduled_events,
        "tolerated_taint": config.tolerated_taints,
        "disruption_grace": config.disruption_grace_seconds,
    }
    assert {k: flags[k] for k in pairs} == pairs
    assert config.profile.scheduler_name is None  # the flag's default: kube.translate's
    tuning = CacheTuning()
    assert (q.flush_interval, q.backoff_initial, q.backoff_max) == (
        tuning.flush_interval,
        tuning.backoff_initial,
        tuning.backoff_max,
    )


@pytest.fixture(scope="module")
def openb_small() -> tuple[Any, list[Any]]:
    nodes = [n for n in trace.read_nodes(trace.bundled(trace.BUNDLED_NODES)) if n.gpus > 0][:40]
    pods = trace.read_pods(trace.bundled(trace.BUNDLED_DEFAULT))[:300]
    return openb.snapshot_of(nodes), [openb.task_of(p, i) for i, p in enumerate(pods)]


def _decide(scheduler: Scheduler, cluster: tuple[Any, list[Any]], seed: int = 5) -> Any:
    snapshot, tasks = cluster
    return scheduler.run_session(snapshot, tasks, now=0.0, rng=np.random.default_rng(seed))


@pytest.mark.parametrize("name", sorted(presets.PROFILES))
def test_policy_flag_config_file_and_preset_code_decide_identically(
    name: str, openb_small: tuple[Any, list[Any]]
) -> None:
    # --policy NAME (the shipped file), --config FILE (the same file read from disk) and the
    # preset as core.policies builds it.
    _, by_flag = cli_scheduler.build_scheduler(name)
    path = SHIPPED / f"{name}.yaml"
    by_file = cli_scheduler.scheduler_from(sc.load(path), name=path.stem)
    by_code = Scheduler(Framework(presets.PROFILES[name], policies.builtin_registry()))
    want = _decide(by_code, openb_small)
    assert len(want.placements) > 100  # the trace's first pods mostly fit on 40 nodes
    assert _decide(by_flag, openb_small) == want
    assert _decide(by_file, openb_small) == want


def test_enabled_and_disabled_merge_into_the_default_plugins() -> None:
    config = sc.parse(
        doc(
            profiles=[
                {
                    "schedulerName": "gpu",
                    "plugins": {
                        # The defaults minus MemoryFit, KallotScore re-weighted in place, FGD
                        # appended with the default weight 1.
                        "score": {
                            "disabled": [{"name": "MemoryFit"}],
                            "enabled": [{"name": "KallotScore", "weight": 3}, {"name": "FGD"}],
                        },
                        "deviceScore": {"disabled": [{"name": "*"}], "enabled": [{"name": "FGD"}]},
                    },
                    "pluginConfig": [{"name": "FGD", "args": {"quantize": False}}],
                }
            ]
        )
    )
    profile = sc.to_profile(config)
    base = presets.PROFILES["kallot"]
    assert profile.name == "gpu"
    assert profile.filter == base.filter
    assert profile.score == (
        ("KallotScore", 3),
        ("ModelCache", 1),
        ("TaintToleration", 1),
        ("NodeAffinity", 1),
        ("InterPodAffinity", 1),
        ("PodTopologySpread", 1),
        ("NominatedNode", 1000),
        ("DraAllocation", 10),
        ("FGD", 1),
    )
    assert profile.device_score == ("FGD",)
    assert profile.args == {"FGD": {"quantize": False}}
    framework = sc.build_framework(profile)
    assert framework.plugins["FGD"]._quantize is False


BAD: list[tuple[dict[str, Any], str]] = [
    (
        {"apiVersion": "v1", "kind": sc.KIND},
        "f.yaml: apiVersion: got 'v1', expected 'kallot.io/v1alpha1'",
    ),
    (doc(bindWorkers=0), "f.yaml: bindWorkers: got 0, expected a number >= 1"),
    (
        doc(sessionSizng={}),
        "f.yaml: sessionSizng: got {}, expected no such field (see docs/scheduler-config.md)",
    ),
    (
        doc(queue={"backoffMax": "soon"}),
        "f.yaml: queue.backoffMax: got 'soon', expected a number",
    ),
    (
        doc(profiles=[]),
        "f.yaml: profiles: got [], expected exactly one profile (one kallot process runs one profile)",
    ),
    (
        doc(profiles=[{"plugins": {"score": {"enabled": [{"name": "FGD", "weight": -2}]}}}]),
        "f.yaml: profiles.0.plugins.score.enabled.0.weight: got -2, expected a number >= 0",
    ),
    (
        doc(profiles=[{"plugins": {"filter": {"enabled": [{"name": "Fast"}]}}}]),
        "f.yaml: profiles.0.plugins.filter.enabled.0.name: got 'Fast', expected a plugin, one of ",
    ),
    (
        doc(profiles=[{"plugins": {"filter": {"enabled": [{"name": "DeviceFit", "weight": 2}]}}}]),
        "f.yaml: profiles.0.plugins.filter.enabled.0.weight: got 2, expected no weight (only score plugins)",
    ),
    (
        doc(profiles=[{"plugins": {"queueSort": {"enabled": [{"name": "RandomScore"}]}}}]),
        "f.yaml: profiles.0.plugins.queueSort: got ['PrioritySort', 'RandomScore'], expected exactly one plugin",
    ),
    (
        doc(profiles=[{"plugins": {"score": {"enabled": [{"name": "NodePorts"}]}}}]),
        "f.yaml: profiles.0.plugins.score.enabled: got 'NodePorts', expected a plugin with score() (a score plugin)",
    ),
    (
        doc(profiles=[{"pluginConfig": [{"name": "FGD", "args": {}}]}]),
        "f.yaml: profiles.0.pluginConfig.0.name: got 'FGD', expected a plugin the profile enables",
    ),
    (
        doc(profiles=[{"pluginConfig": [{"name": "KallotScore", "args": {"tail": "none"}}]}]),
        "f.yaml: profiles.0.pluginConfig: KallotScore args.tail: got 'none', expected one of lp, learned, closed",
    ),
    (doc(actions={"maxAttempts": 0}), "f.yaml: actions.maxAttempts: got 0, expected a number >= 1"),
    (
        doc(sessionSizing={"minPods": 50, "maxPods": 10}),
        "f.yaml: sessionSizing.maxPods: got 10, expected 0 (no bound) or at least minPods (50)",
    ),
]


@pytest.mark.parametrize(("document", "line"), BAD, ids=[line.split(":")[1] for _, line in BAD])
def test_bad_input_names_the_field_the_value_and_what_was_expected(
    document: dict[str, Any], line: str
) -> None:
    with pytest.raises(ConfigError) as err:
        config = sc.parse(document, where="f.yaml")
        sc.build_framework(sc.to_profile(config, where="f.yaml"), where="f.yaml")
    assert str(err.value).startswith(line)
    assert "\n" not in str(err.value)


def test_a_file_that_is_not_yaml_or_not_a_mapping(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("profiles: [oops\n")
    with pytest.raises(ConfigError, match=r"^--config: got '.*a.yaml', expected YAML \("):
        sc.load(tmp_path / "a.yaml")
    (tmp_path / "b.yaml").write_text("- 1\n")
    with pytest.raises(ConfigError, match=r"^b.yaml: got \[1\], expected a KallotScheduler"):
        sc.load(tmp_path / "b.yaml")


def test_libyaml_reads_what_the_pure_python_reader_reads(tmp_path: Path) -> None:
    """The files are read by libyaml when PyYAML has it (config.scheduler._yaml): the shipped
    files give the documents the pure-Python reader gives, and a file that is not YAML the
    pure-Python reader's message."""
    for name in sc.shipped_names():
        text = (SHIPPED / f"{name}.yaml").read_text()
        assert sc.shipped(name) == sc.parse(yaml.safe_load(text), where=f"{name}.yaml"), name
        assert sc.shipped(name) is sc.shipped(name)  # read once per process
    bad = "profiles:\n  - schedulerName: a\n   plugins: {}\n"
    (tmp_path / "c.yaml").write_text(bad)
    with pytest.raises(yaml.YAMLError) as pure:
        yaml.safe_load(bad)
    with pytest.raises(ConfigError) as err:
        sc.load(tmp_path / "c.yaml")
    assert str(err.value).endswith(f"expected YAML ({' '.join(str(pure.value).split())})")


def test_actions_turn_the_disruptive_ones_off_keeping_the_core_order() -> None:
    tree = QueueTree(queues=(Queue(name="team"),))
    every = [a.name for a in sc.actions_factory(sc.parse(HEAD))(tree)]
    assert every == ["queue-allocate", "reclaim", "preempt", "reject-remaining"]
    off = sc.parse(doc(actions={"reclaim": False, "maxAttempts": 3}))
    actions = sc.actions_factory(off)(tree)
    assert [a.name for a in actions] == ["queue-allocate", "preempt", "reject-remaining"]
    assert actions[1].max_attempts == 3  # type: ignore[attr-defined]


def test_the_command_line_overrides_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}

    def capture(**kwargs: Any) -> int:  # stands in for connecting to a cluster
        seen.update(kwargs)
        return 0

    monkeypatch.setattr(cli_scheduler, "run_scheduler", capture)
    path = tmp_path / "gpu.yaml"
    path.write_text(
        yaml.safe_dump(
            doc(
                profiles=[{"schedulerName": "from-file"}],
                bindWorkers=4,
                seed=7,
                leaderElection={"leaseName": "file-lease"},
                queue={"retryInterval": 9.0, "backoffMax": 12.0},
                toleratedTaints=["a"],
            )
        )
    )
    app = typer.Typer()
    cli_scheduler.register(app)
    args = ["scheduler", "--config", str(path), "--bind-workers", "8", "--tolerated-taint", "b"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    config: ControllerConfig = seen["config"]
    assert config.bind_workers == 8  # the flag
    assert config.tolerated_taints == frozenset({"b"})  # the flag
    assert config.seed == 7  # the file
    assert config.scheduler_name == "from-file"
    assert config.lease_name == "file-lease"
    assert (config.tuning.retry_interval, config.tuning.backoff_max) == (9.0, 12.0)
    assert seen["scheduler"].framework.profile.name == "gpu"


def test_the_documented_example_is_valid() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "scheduler-config.md").read_text()
    example = text.split("## An example", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    config = sc.parse(yaml.safe_load(example), where="example")
    profile = sc.to_profile(config, where="example")
    framework = sc.build_framework(profile, where="example")
    assert "MemoryFit" not in dict(profile.score)
    assert dict(profile.score)["ModelCache"] == 2
    assert framework.plugins["KallotScore"]._tail == "learned"
    assert not config.actions.preempt


def test_check_validates_file_and_flags_offline(tmp_path: Path) -> None:
    """`kallot scheduler --check`: OK and exit 0 without a cluster; a flag is held to the rules
    of its field in the file (config.scheduler.with_flags)."""
    from typer.testing import CliRunner

    from kallot.cli.main import app

    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(doc(bindWorkers=4)))
    runner = CliRunner()
    ok = runner.invoke(app, ["scheduler", "--config", str(path), "--check"], env={"HOME": "/"})
    assert ok.exit_code == 0, ok.output
    assert ok.output.startswith("kallot scheduler: gpu.yaml: OK (profile gpu, schedulerName kallot")
    for flags, line in (
        (["--bind-workers", "0"], "--bind-workers: got 0, expected a number >= 1"),
        (
            ["--renew-deadline", "12"],
            "--renew-deadline: got 12.0, expected seconds < leaseDuration",
        ),
        (
            ["--metrics-address", ":99999"],
            "--metrics-address: got ':99999', expected a port from 0 to 65535",
        ),
    ):
        bad = runner.invoke(app, ["scheduler", "--config", str(path), "--check", *flags])
        assert bad.exit_code == 2, bad.output
        assert bad.output.startswith(f"kallot scheduler: {line}"), bad.output


def test_with_flags_overrides_and_revalidates() -> None:
    config = sc.parse(doc(leaderElection={"leaseDuration": 20, "renewDeadline": 15}))
    merged = sc.with_flags(config, {"--bind-workers": 3, "--tolerated-taint": ("a",)})
    assert merged.bind_workers == 3 and merged.tolerated_taints == ("a",)
    assert merged.leader_election.renew_deadline == 15
    with pytest.raises(ConfigError, match=r"^--lease-duration: got 10.0, expected a value that"):
        sc.with_flags(config, {"--lease-duration": 10.0})  # below the file's renewDeadline
