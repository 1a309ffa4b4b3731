"""The openb CSV readers: both pod formats, and bad rows named by file, line and column."""

from __future__ import annotations

from pathlib import Path

import pytest

from kallot.core.errors import ConfigError
from kallot.sim import trace

FULL = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time\n"
)
SHORT = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"


def write(tmp_path: Path, text: str, name: str = "pods.csv") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_full_format_reads_times_spec_and_shares(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        FULL
        + "p0,8000,30000,1,500,V100M16|V100M32,LS,Running,100,700,160\n"
        + "p1,4000,1000,0,0,,BE,Succeeded,5,,\n",
    )
    a, b = trace.read_pods(p)
    assert (a.name, a.cpu_milli, a.memory_mib, a.num_gpu, a.gpu_milli) == (
        "p0",
        8000,
        30000,
        1,
        500,
    )
    assert a.gpu_spec == ("V100M16", "V100M32")
    assert (a.creation_time, a.deletion_time, a.scheduled_time) == (100.0, 700.0, 160.0)
    assert b.gpu_spec == () and b.deletion_time is None and b.gpu_milli_total == 0


def test_short_format_has_no_times(tmp_path: Path) -> None:
    (pod,) = trace.read_pods(write(tmp_path, SHORT + "m0,32000,64000,4,1000\n"))
    assert pod.gpu_milli_total == 4000  # 4 whole GPUs = 4 x 1000 milli
    assert pod.creation_time is None and pod.gpu_spec == ()


@pytest.mark.parametrize(
    ("row", "line_col"),
    [
        pytest.param("p,abc,1,1,500", ":2: column 'cpu_milli': got 'abc'", id="not-an-integer"),
        pytest.param("p,1,1,1,1500", ":2: column 'gpu_milli': got '1500'", id="share-over-1000"),
        pytest.param("p,1,1,2,500", ":2: column 'gpu_milli': got '500'", id="multi-gpu-share"),
        pytest.param("p,1,1,0,300", ":2: column 'gpu_milli': got '300'", id="share-without-gpu"),
        pytest.param(
            "p,1,1,1", ":2: got 'p,1,1,1', expected 5 columns, not 4", id="missing-column"
        ),
    ],
)
def test_bad_row_names_file_line_column(tmp_path: Path, row: str, line_col: str) -> None:
    p = write(tmp_path, SHORT + row + "\n")
    with pytest.raises(trace.TraceError) as err:
        trace.read_pods(p)
    assert f"{p}{line_col}" in str(err.value)


def test_every_bad_row_is_reported_at_once(tmp_path: Path) -> None:
    p = write(tmp_path, SHORT + "a,x,1,1,500\nb,1,1,1,500\nc,1,y,1,500\n")
    with pytest.raises(trace.TraceError) as err:
        trace.read_pods(p)
    assert [(e.line, e.column) for e in err.value.errors] == [(2, "cpu_milli"), (4, "memory_mib")]
    assert "2 bad values" in str(err.value)


def test_bad_header_says_what_was_expected(tmp_path: Path) -> None:
    p = write(tmp_path, "name,cpu\np,1\n")
    with pytest.raises(trace.TraceError, match=r"column 'header'.*expected name,cpu_milli"):
        trace.read_pods(p)


def test_nodes_duplicate_name_and_missing_model(tmp_path: Path) -> None:
    p = write(tmp_path, "sn,cpu_milli,memory_mib,gpu,model\nn,1,1,2,T4\nn,1,1,2,\n", "nodes.csv")
    with pytest.raises(trace.TraceError) as err:
        trace.read_nodes(p)
    assert {(e.line, e.column) for e in err.value.errors} == {(3, "sn"), (3, "model")}
    assert "a unique node name (also on line 2)" in str(err.value)


def test_missing_file_is_a_trace_error(tmp_path: Path) -> None:
    with pytest.raises(trace.TraceError, match="a readable file"):
        trace.read_pods(tmp_path / "nope.csv")


def test_bundled_trace_loads() -> None:
    nodes = trace.read_nodes(trace.bundled(trace.BUNDLED_NODES))
    pods = trace.read_pods(trace.bundled(trace.BUNDLED_DEFAULT))
    # The paper's cluster: 1,213 GPU nodes, 6,212 GPUs.
    assert len(nodes) == 1213 and sum(n.gpus for n in nodes) == 6212
    assert len(pods) > 8000


def test_unknown_workload_name_lists_the_known_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KALLOT_OPENB_DIR", raising=False)
    with pytest.raises(ConfigError, match="gpushare40"):
        trace.resolve_workload("no-such-workload")


def test_every_workload_the_docs_run_by_name_is_bundled(monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's headline (`--workload default --workload gpushare40`) and BENCHMARKS.md's
    eight workloads run on a fresh clone: no $KALLOT_OPENB_DIR needed."""
    monkeypatch.delenv("KALLOT_OPENB_DIR", raising=False)
    for name in trace.BUNDLED_WORKLOADS:
        path = trace.resolve_workload(name)
        assert path.is_file(), name
        assert trace.workload_name(path) == name
    pods = trace.read_pods(trace.resolve_workload("gpushare40"))
    assert len(pods) > 8000 and pods[0].name.startswith("openb-pod-")


def test_a_name_not_bundled_says_why_it_was_not_found(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("KALLOT_OPENB_DIR", raising=False)
    with pytest.raises(ConfigError, match=r"\$KALLOT_OPENB_DIR is unset; .* at https://"):
        trace.resolve_workload("cpu050")
    monkeypatch.setenv("KALLOT_OPENB_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match=r"nowhere is not a folder"):
        trace.resolve_workload("cpu050")
    monkeypatch.setenv("KALLOT_OPENB_DIR", str(tmp_path))
    with pytest.raises(ConfigError, match=r"openb_pod_list_cpu050.csv does not exist"):
        trace.resolve_workload("cpu050")
    (tmp_path / "openb_pod_list_cpu050.csv").write_text("x\n")
    assert trace.resolve_workload("cpu050") == tmp_path / "openb_pod_list_cpu050.csv"


def test_meaningless_lists_are_refused(tmp_path: Path) -> None:
    header = ",".join(trace.POD_COLUMNS_FULL)
    late = tmp_path / "late.csv"
    late.write_text(f"{header}\np,1000,100,1,1000,,LS,Running,500,100,500\n")
    with pytest.raises(trace.TraceError, match=r"late.csv:2: column 'deletion_time': got '100'"):
        trace.read_pods(late)
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,64000,262144,8,X100\n")
    with pytest.raises(trace.TraceError, match=r"column 'model': got 'X100', expected a GPU model"):
        trace.read_nodes(nodes)
    spec = tmp_path / "spec.csv"
    spec.write_text(f"{header}\np,1000,100,1,1000,H100-80GB,LS,Running,0,100,0\n")
    node_rows = trace.read_nodes(trace.bundled(trace.BUNDLED_NODES))
    with pytest.raises(ConfigError, match=r"pod p: column 'gpu_spec': got 'H100-80GB'"):
        trace.check_gpu_specs(
            trace.read_pods(spec), node_rows, pods_file="spec.csv", nodes_file="nodes"
        )


def test_errors_raised_in_a_worker_process_come_back_whole(tmp_path: Path) -> None:
    # `kallot sim openb --jobs N` runs experiments in worker processes: an error raised there is
    # pickled back to the parent, which must get the same one-line error (a class whose
    # __init__ takes other arguments than its message used to break the pool instead).
    import pickle
    from concurrent.futures import ProcessPoolExecutor

    from kallot.core.errors import ConfigError

    p = write(tmp_path, SHORT + "a,x,1,1,500\nb,1,1,1,500\nc,1,y,1,500\n")
    with ProcessPoolExecutor(1) as pool, pytest.raises(trace.TraceError) as err:
        pool.submit(trace.read_pods, p).result()
    assert [(e.line, e.column) for e in err.value.errors] == [(2, "cpu_milli"), (4, "memory_mib")]
    assert "2 bad values" in str(err.value)
    config = ConfigError("--seeds", "x", "seeds >= 0")
    back = pickle.loads(pickle.dumps(config))
    assert (type(back), str(back), back.field) == (ConfigError, str(config), "--seeds")


def test_a_spreadsheet_byte_order_mark_is_read(tmp_path: Path) -> None:
    p = tmp_path / "pods.csv"
    p.write_bytes(b"\xef\xbb\xbf" + (SHORT + "p,1000,100,1,500\n").encode())
    assert [(r.name, r.gpu_milli) for r in trace.read_pods(p)] == [("p", 500)]


def test_a_bad_gpu_count_is_one_error_not_two(tmp_path: Path) -> None:
    # gpu_milli is not also blamed for disagreeing with a num_gpu that could not be read.
    p = write(tmp_path, SHORT + "p,1000,100,-1,500\n")
    with pytest.raises(trace.TraceError) as err:
        trace.read_pods(p)
    assert [(e.line, e.column) for e in err.value.errors] == [(2, "num_gpu")]


def test_a_file_that_is_not_text_is_one_error_naming_the_line(tmp_path: Path) -> None:
    # A binary file (or one saved in another encoding) used to end in a UnicodeDecodeError
    # traceback from inside the CSV reader.
    p = tmp_path / "pods.csv"
    p.write_bytes((SHORT + "p,1000,100,1,500\n").encode() + b"q\xff,1,1,1,500\n")
    with pytest.raises(trace.TraceError) as err:
        trace.read_pods(p)
    assert str(err.value).endswith("expected a readable file of UTF-8 text (line 3 has byte 0xff)")
    assert "\n" not in str(err.value)


def test_a_pod_name_used_twice_is_named_with_both_lines(tmp_path: Path) -> None:
    # The simulators key tasks by name: a repeated name used to fail later, mid-run, as
    # "task ... placed while it runs", with no line to fix.
    p = write(tmp_path, SHORT + "a,1,1,1,500\nb,1,1,0,0\na,2,2,1,300\n")
    with pytest.raises(trace.TraceError) as err:
        trace.read_pods(p)
    assert [(e.line, e.column, e.value) for e in err.value.errors] == [(4, "name", "a")]
    assert "a unique pod name (also on line 2)" in str(err.value)
