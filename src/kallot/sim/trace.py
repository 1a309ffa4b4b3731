"""Readers for the openb trace CSVs (Alibaba cluster-trace-gpu-v2023): node lists and pod lists.

Where it sits: the only file I/O of the simulator's input side. Rows become plain ``NodeRow`` /
``PodRow`` values (then core ``NodeSpec`` / ``Task`` in ``sim.openb``). Both pod formats are
read: the 11-column one (with qos, phase and the three times) and the 5-column ``multigpu*``
one. A bad row is rejected with the file, line and column named and what was expected; every
bad row of a file is reported at once (up to a limit), so a user fixes them in one pass.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from kallot.config.files import read_text
from kallot.core.errors import ConfigError, KallotError
from kallot.core.resources import GPU_MODELS, MILLI

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS_FULL = (
    "name",
    "cpu_milli",
    "memory_mib",
    "num_gpu",
    "gpu_milli",
    "gpu_spec",
    "qos",
    "pod_phase",
    "creation_time",
    "deletion_time",
    "scheduled_time",
)
POD_COLUMNS_SHORT = POD_COLUMNS_FULL[:5]
MAX_REPORTED = 20

BUNDLED_NODES = "openb_node_list_gpu_node.csv"
BUNDLED_DEFAULT = "openb_pod_list_default.csv"
#: Where the trace's other pod lists are published (the FGD paper's simulator, ``data/csv``).
TRACE_URL = "https://github.com/hkust-adsl/kubernetes-scheduler-simulator/tree/main/data/csv"
#: The workloads shipped with kallot (``default`` plain, the others gzipped): every one the
#: README and BENCHMARKS.md run by name.
BUNDLED_WORKLOADS = (
    "default",
    "cpu100",
    "gpushare40",
    "gpushare80",
    "gpuspec10",
    "gpuspec20",
    "multigpu20",
    "multigpu50",
)
#: Every workload of the FGD paper's trace, by name (the others from $KALLOT_OPENB_DIR).
WORKLOADS = (
    "default",
    "cpu050",
    "cpu100",
    "cpu200",
    "cpu250",
    "gpushare40",
    "gpushare60",
    "gpushare80",
    "gpushare100",
    "gpuspec10",
    "gpuspec20",
    "gpuspec25",
    "gpuspec33",
    "multigpu20",
    "multigpu30",
    "multigpu40",
    "multigpu50",
)


@dataclass(frozen=True, slots=True)
class RowError:
    """One rejected cell: ``file:line: column 'c': got 'v', expected ...`` (a whole row:
    ``file:line: got 'v', expected ...``; the file itself, line 0: ``file: expected ...``)."""

    file: str
    line: int
    column: str
    value: str
    expected: str

    def __str__(self) -> str:
        if self.line == 0:  # the file itself
            return f"{self.file}: expected {self.expected}"
        where = f"{self.file}:{self.line}:"
        if self.column != "-":  # "-": the row as a whole
            where += f" column '{self.column}':"
        return f"{where} got {self.value!r}, expected {self.expected}"


class TraceError(KallotError):
    """A trace file could not be read; ``errors`` holds every bad cell found (up to a limit)."""

    def __init__(self, path: str, errors: Sequence[RowError], total: int | None = None) -> None:
        self.path = path
        self.errors = tuple(errors)
        total = len(errors) if total is None else total
        self.total = total
        more = f" (and {total - len(errors)} more)" if total > len(errors) else ""
        if total == 1 and len(errors) == 1:  # one bad value: one line
            super().__init__(str(errors[0]))
            return
        lines = "\n  ".join(str(e) for e in errors)
        super().__init__(f"{path}: {total} bad value{'s' if total != 1 else ''}{more}:\n  {lines}")

    def __reduce__(self) -> tuple[type[TraceError], tuple[str, tuple[RowError, ...], int]]:
        # Raised in a worker process it must come back whole (Exception pickles ``args``).
        return (type(self), (self.path, self.errors, self.total))


@dataclass(frozen=True, slots=True)
class NodeRow:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True, slots=True)
class PodRow:
    """One pod of a pod list. Times are seconds from the trace start (None when absent)."""

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int  # per GPU
    gpu_spec: tuple[str, ...] = ()  # allowed models; empty = any
    qos: str = ""
    phase: str = ""
    creation_time: float | None = None
    deletion_time: float | None = None
    scheduled_time: float | None = None

    @property
    def gpu_milli_total(self) -> int:
        return self.num_gpu * self.gpu_milli


class _Reader:
    """Parses cells of one file, collecting errors instead of stopping at the first."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.errors: list[RowError] = []
        self.total = 0

    def fail(self, line: int, column: str, value: str, expected: str) -> None:
        self.total += 1
        if len(self.errors) < MAX_REPORTED:
            self.errors.append(RowError(self.path, line, column, value, expected))

    def integer(self, row: dict[str, str], line: int, column: str, lo: int, hi: int) -> int:
        raw = (row.get(column) or "").strip()
        try:
            value = int(raw)
        except ValueError:
            self.fail(line, column, raw, f"an integer in [{lo}, {hi}]")
            return lo
        if not lo <= value <= hi:
            self.fail(line, column, raw, f"an integer in [{lo}, {hi}]")
            return lo
        return value

    def time(self, row: dict[str, str], line: int, column: str) -> float | None:
        raw = (row.get(column) or "").strip()
        if raw == "":
            return None
        try:
            value = float(raw)
        except ValueError:
            self.fail(line, column, raw, "seconds (a number >= 0) or empty")
            return None
        if value < 0 or math.isnan(value):
            self.fail(line, column, raw, "seconds (a number >= 0) or empty")
            return None
        return value

    def raise_if_failed(self) -> None:
        if self.total:
            raise TraceError(self.path, self.errors, self.total)


def _read(path: Path) -> str:
    """The text of a trace file, gunzipped when it ends in ``.gz``."""
    if path.suffix != ".gz":
        return read_text(path, str(path))
    try:
        data = gzip.decompress(path.read_bytes())
    except (OSError, EOFError) as exc:  # missing, a directory, not gzip, cut short
        why = getattr(exc, "strerror", None) or str(exc) or "cut short"
        raise ConfigError(str(path), str(path), f"a readable gzip file ({why})") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(
            str(path), str(path), f"a gzipped UTF-8 CSV (line {line} is not text)"
        ) from None


def _rows(
    path: str, allowed: Sequence[Sequence[str]], reader: _Reader
) -> Iterator[tuple[int, dict[str, str]]]:
    try:
        text = _read(Path(path))
    except ConfigError as exc:  # missing, a directory, not UTF-8 text
        raise TraceError(path, [RowError(path, 0, "-", "", exc.expected)]) from None
    with io.StringIO(text, newline="") as handle:
        table = csv.reader(handle)
        header = next(table, None)
        if header is None:
            raise TraceError(path, [RowError(path, 1, "-", "", "a header line")])
        header = [h.strip() for h in header]
        if tuple(header) not in {tuple(a) for a in allowed}:
            want = " or ".join(",".join(a) for a in allowed)
            raise TraceError(path, [RowError(path, 1, "header", ",".join(header), want)])
        for index, cells in enumerate(table, start=2):
            if not cells or all(not c.strip() for c in cells):
                continue
            if len(cells) != len(header):
                reader.fail(index, "-", ",".join(cells), f"{len(header)} columns, not {len(cells)}")
                continue
            yield index, dict(zip(header, cells, strict=True))


def read_nodes(path: str | os.PathLike[str]) -> list[NodeRow]:
    """Read a node list (``sn,cpu_milli,memory_mib,gpu,model``); raises TraceError."""
    p = str(path)
    reader = _Reader(p)
    out: list[NodeRow] = []
    first: dict[str, int] = {}  # name -> its line
    for line, row in _rows(p, [NODE_COLUMNS], reader):
        name = row["sn"].strip()
        if not name:
            reader.fail(line, "sn", name, "a node name")
        elif name in first:
            reader.fail(line, "sn", name, f"a unique node name (also on line {first[name]})")
        else:
            first[name] = line
        cpu = reader.integer(row, line, "cpu_milli", 0, 10**9)
        mem = reader.integer(row, line, "memory_mib", 0, 10**12)
        gpus = reader.integer(row, line, "gpu", 0, 64)
        model = row["model"].strip()
        if gpus > 0 and not model:
            reader.fail(line, "model", model, "a GPU model for a node with GPUs")
        elif gpus > 0 and model not in GPU_MODELS:  # its memory and shares would be guessed
            known = ", ".join(sorted(GPU_MODELS))
            reader.fail(line, "model", model, f"a GPU model kallot knows ({known})")
        out.append(NodeRow(name, cpu, mem, gpus, model))
    reader.raise_if_failed()
    if not out:
        raise TraceError(p, [RowError(p, 2, "-", "", "at least one node row after the header")])
    return out


def read_pods(path: str | os.PathLike[str]) -> list[PodRow]:
    """Read a pod list in the 11-column or the 5-column format; raises TraceError."""
    p = str(path)
    reader = _Reader(p)
    out: list[PodRow] = []
    first: dict[str, int] = {}  # name -> its line: a name is one task in every simulation
    for line, row in _rows(p, [POD_COLUMNS_FULL, POD_COLUMNS_SHORT], reader):
        name = row["name"].strip()
        if not name:
            reader.fail(line, "name", name, "a pod name")
        elif name in first:
            reader.fail(line, "name", name, f"a unique pod name (also on line {first[name]})")
        else:
            first[name] = line
        cpu = reader.integer(row, line, "cpu_milli", 0, 10**9)
        mem = reader.integer(row, line, "memory_mib", 0, 10**12)
        failed = reader.total
        num_gpu = reader.integer(row, line, "num_gpu", 0, 64)
        gpu_milli = reader.integer(row, line, "gpu_milli", 0, MILLI)
        if reader.total > failed:
            pass  # a bad num_gpu or gpu_milli: no second error about how the two agree
        elif num_gpu == 0 and gpu_milli != 0:
            reader.fail(line, "gpu_milli", row["gpu_milli"], "0 for a pod with num_gpu 0")
        elif num_gpu > 0 and gpu_milli == 0:
            reader.fail(line, "gpu_milli", row["gpu_milli"], "1..1000 for a pod with GPUs")
        elif num_gpu > 1 and gpu_milli != MILLI:
            reader.fail(
                line, "gpu_milli", row["gpu_milli"], "1000 when num_gpu > 1 (shares are per GPU)"
            )
        spec = tuple(m.strip() for m in (row.get("gpu_spec") or "").split("|") if m.strip())
        created = reader.time(row, line, "creation_time")
        deleted = reader.time(row, line, "deletion_time")
        if created is not None and deleted is not None and deleted < created:
            reader.fail(
                line,
                "deletion_time",
                row["deletion_time"].strip(),
                f"a time >= creation_time ({row['creation_time'].strip()}): a pod ends after it starts",
            )
        out.append(
            PodRow(
                name=name,
                cpu_milli=cpu,
                memory_mib=mem,
                num_gpu=num_gpu,
                gpu_milli=gpu_milli,
                gpu_spec=spec,
                qos=(row.get("qos") or "").strip(),
                phase=(row.get("pod_phase") or "").strip(),
                creation_time=created,
                deletion_time=deleted,
                scheduled_time=reader.time(row, line, "scheduled_time"),
            )
        )
    reader.raise_if_failed()
    if not out:
        raise TraceError(p, [RowError(p, 2, "-", "", "at least one pod row after the header")])
    return out


def existing(path: Path, flag: str) -> Path:
    """``path``, refused with the flag that named it unless it is a file (the readers then say
    what is wrong inside it)."""
    if not path.is_file():
        why = "a directory" if path.is_dir() else "no such file"
        raise ConfigError(flag, str(path), f"a readable CSV file ({why})")
    return path


def check_gpu_specs(
    pods: Sequence[PodRow], nodes: Sequence[NodeRow], *, pods_file: str, nodes_file: str
) -> None:
    """Refuse a pod list whose ``gpu_spec`` names only models no node of the node list has:
    such pods could never be placed, and the run would measure nothing but that."""
    models = sorted({n.model for n in nodes if n.gpus > 0})
    bad = [p for p in pods if p.num_gpu > 0 and p.gpu_spec and not set(p.gpu_spec) & set(models)]
    if not bad:
        return
    more = f" (and {len(bad) - 1} more pods)" if len(bad) > 1 else ""
    raise ConfigError(
        f"{pods_file}: pod {bad[0].name}: column 'gpu_spec'",
        "|".join(bad[0].gpu_spec),
        f"a model a node of {nodes_file} has ({', '.join(models)}){more}",
    )


def bundled(name: str) -> Path:
    """Path of a file shipped with kallot (src/kallot/data/openb)."""
    return Path(str(resources.files("kallot").joinpath("data", "openb", name)))


def resolve_workload(name_or_path: str) -> Path:
    """A workload name (``default``, ``gpushare40``, ...) or a CSV path -> the pod list's path.

    A name is looked up in ``$KALLOT_OPENB_DIR`` (a copy of the trace's csv folder), then among
    the bundled workloads. A name found in neither says which of the three is the matter: the
    variable unset, pointing at no folder, or the folder without the file.
    """
    if name_or_path.endswith((".csv", ".csv.gz")) or os.sep in name_or_path:
        return Path(name_or_path)
    file = f"openb_pod_list_{name_or_path}.csv"
    env = os.environ.get("KALLOT_OPENB_DIR", "")
    if env and (Path(env) / file).is_file():
        return Path(env) / file
    if name_or_path in BUNDLED_WORKLOADS:
        return bundled(BUNDLED_DEFAULT if name_or_path == "default" else f"{file}.gz")
    if not env:
        where = f"$KALLOT_OPENB_DIR is unset; the trace's other pod lists are at {TRACE_URL}"
    elif not Path(env).is_dir():
        where = f"$KALLOT_OPENB_DIR={env} is not a folder"
    else:
        where = f"{Path(env) / file} does not exist; the trace's pod lists are at {TRACE_URL}"
    known = "a workload of the trace" if name_or_path in WORKLOADS else "a known workload name"
    raise ConfigError(
        "--workload",
        name_or_path,
        f"a pod-list CSV, a bundled workload ({', '.join(BUNDLED_WORKLOADS)}) or {known} "
        f"in $KALLOT_OPENB_DIR ({where})",
    )


def workload_name(path: str | os.PathLike[str]) -> str:
    """``.../openb_pod_list_gpushare40.csv`` -> ``gpushare40`` (the file stem otherwise)."""
    name = Path(path).name.removesuffix(".gz").removesuffix(".csv")
    return name.removeprefix("openb_pod_list_")
