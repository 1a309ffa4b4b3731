"""sim.rightsize: the usage model with worked numbers for one request, the replay's counting on
a hand-made series, the bundled trace, and ``kallot sim rightsize`` end to end (JSON, PNG)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kallot.cli.main import app
from kallot.sim import rightsize as rs


def test_bundled_trace() -> None:
    arr = rs.load_arrivals()
    # the conversation service's hour: 19366 requests, sorted, from 0 s
    assert arr.t.size == 19366 and arr.t[0] == 0.0 and np.all(np.diff(arr.t) >= 0)
    assert 3000 < arr.span_s <= 3600 and arr.context.min() >= 1


def test_usage_of_one_request() -> None:
    # llama-3.1-8b: KV 2 x 32 x 8 x 128 x 2 B = 131072 B = 0.125 MiB per token
    m = rs.MODELS[2]
    assert m.kv_mib_per_token == 0.125
    # one request at t=0: 1000 context, 100 generated; prefill 1000 / (395.6e12 / 16.06e9)
    # = 0.0406 s; decode 100 x 0.015 = 1.5 s -> running during seconds 0 and 1
    arr = rs.Arrivals(
        t=np.array([0.0, 9.0]), context=np.array([1000.0, 1.0]), generated=np.array([100.0, 1.0])
    )
    svc = rs.Service("s", m, rate=1e9, shift_s=0.0)  # keep every request
    mem, milli = rs.usage(svc, arr, np.random.default_rng(0))
    assert mem.size == 10
    # second 0: context 1000 + 0 generated -> 1008 tokens in 16-token pages = 126 MiB
    assert mem[0] - m.base_mib == pytest.approx(1008 * 0.125)
    # second 1: elapsed 1 s -> (1 - 0.0406) / 0.015 = 63.96 -> 63 generated, 1063 -> 1072 tokens
    assert mem[1] - m.base_mib == pytest.approx(1072 * 0.125)
    assert mem[2] == pytest.approx(m.base_mib)  # finished at 1.54 s
    # compute at second 0: 1000 prefill tokens + 66.7 decode tokens, x 2 x 8.03e9 / 395.6e12
    assert milli[0] == pytest.approx((1000 + 1 / 0.015) * 2 * 8.03e9 / (989e12 * 0.4) * 1000)


def test_replay_counts_overruns_and_contention() -> None:
    services = [rs.Service(n, rs.MODELS[0], 1.0, 0.0) for n in ("a", "b")]
    # a: 100 MiB then 3 s at 150 (> share 120); b: always 50. Compute: 600 + 500 for 2 s.
    series = {
        "a": (np.array([0, 100, 150, 150, 150, 100.0]), np.array([0, 600, 600, 0, 0, 0.0])),
        "b": (np.full(6, 50.0), np.array([0, 500, 500, 500, 0, 0.0])),
    }
    placed = rs.Placed(gpus_needed=1, gpu_of={"a": (0, 0), "b": (0, 0)})
    r = rs.replay(services, series, 1, {"a": 120, "b": 60}, placed)
    assert r.memory_overruns == 1 and r.overrun_pod_minutes == pytest.approx(3 / 60)
    assert r.contention_gpu_minutes == pytest.approx(2 / 60)
    assert r.peak_ratio["a"] == pytest.approx(150 / 120)


def test_sim_rightsize_cli(tmp_path: Path) -> None:
    out, png = tmp_path / "rs.json", tmp_path / "rs.png"
    args = ["sim", "rightsize", "--services", "20", "--seed", "3", "--json", str(out)]
    args += ["--report", str(tmp_path / "rs.html")]
    result = CliRunner().invoke(app, [*args, "--plot", str(png)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["seed"] == 3
    assert data["gpus_needed"]["as_requested"] == 20
    assert 0 < data["gpus_needed"]["rightsized"] < 20
    assert {"memory_overruns", "overrun_pod_minutes"} <= set(data)
    assert png.stat().st_size > 10_000


def test_sim_rightsize_bad_trace(tmp_path: Path) -> None:
    bad = tmp_path / "t.csv"
    bad.write_text("a,b\n1,2\n")
    result = CliRunner().invoke(app, ["sim", "rightsize", "--trace", str(bad)])
    assert result.exit_code == 2
    assert "got 'a,b', expected 'TIMESTAMP,ContextTokens,GeneratedTokens'" in result.output


@pytest.mark.parametrize(
    ("name", "content", "error"),
    [
        ("missing.csv", None, "--trace: got '{path}', expected a readable arrivals CSV"),
        ("t.csv.gz", b"not gzip", "--trace: got '{path}', expected a readable arrivals CSV"),
        ("t.csv", b"\xff\xfe\x00bad", "--trace: got '{path}', expected a UTF-8 text CSV"),
        (
            "t.csv",
            b"TIMESTAMP,ContextTokens,GeneratedTokens\n",
            "{path}:2: got '', expected at least one arrival",
        ),
        (
            "t.csv",
            b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374\n",
            "{path}:2: got '2023-11-16 18:15:46.6805900,374', expected an ISO timestamp",
        ),
        (
            "t.csv",
            b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,44\n"
            b"2023-11-16 18:15:47.00,-1,44\n",
            "{path}:3: got '2023-11-16 18:15:47.00,-1,44', expected an ISO timestamp and two token",
        ),
    ],
)
def test_sim_rightsize_bad_trace_is_one_line(
    tmp_path: Path, name: str, content: bytes | None, error: str
) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    result = CliRunner().invoke(app, ["sim", "rightsize", "--trace", str(path)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and error.format(path=path) in lines[0].replace("\n", ""), lines
