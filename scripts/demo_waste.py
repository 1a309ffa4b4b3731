"""Demo of the waste report for docs/rightsizing.md: one node agent's exporter on the fake
backend with eight pods in three namespaces playing scripted use (a generator of the elapsed
seconds), a real Prometheus (tools/testenv/build-prometheus.sh) scraping it every second for
``--minutes``, then ``kallot report waste`` and ``kallot rightsize`` on it.

    .venv/bin/python scripts/demo_waste.py --minutes 3 --out /tmp/kallot-waste
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import time
from pathlib import Path

from kallot.config.device_record import DeviceRecord, RecordDevice, RecordMig
from kallot.node.allocate import PodRecord
from kallot.node.discovery import MIB, GpuProcess, build_inventory
from kallot.node.exporter import ExporterState, GpuCollector, make_registry, serve
from kallot.node.fake import FakeBackend, InventoryFile
from kallot.testing.prometheus import Prometheus

H100 = 81559
# (namespace, pod, owner, GPU index, milli, MiB, MIG profile, base MiB, swing MiB, SM %, period s)
PODS = [
    ("search", "embed-6f7d9-a", "Deployment/embed", 0, 1000, H100, "", 3000, 500, 6, 40),
    ("search", "embed-6f7d9-b", "Deployment/embed", 1, 1000, H100, "", 3000, 700, 8, 55),
    ("search", "rerank-0", "StatefulSet/rerank", 2, 1000, H100, "", 2500, 300, 4, 30),
    ("chat", "llm-8b-5c4b-x", "Deployment/llm-8b", 3, 1000, H100, "", 17000, 4000, 35, 60),
    ("chat", "llm-8b-5c4b-y", "Deployment/llm-8b", 4, 1000, H100, "", 17000, 3500, 30, 45),
    ("chat", "llm-70b-0", "StatefulSet/llm-70b", 5, 1000, H100, "", 72000, 5000, 70, 80),
    ("research", "notebook", "", 6, 300, 24576, "", 6000, 2000, 3, 90),
    ("research", "train-1-abc", "Job/train-1", 7, 1000, H100, "", 60000, 8000, 85, 20),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=3.0)
    ap.add_argument("--out", type=Path, default=Path("/tmp/kallot-waste"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    gpus = [
        {"uuid": f"GPU-demo-{i}", "name": "NVIDIA H100 80GB HBM3", "memoryMiB": H100}
        for i in range(8)
    ]
    backend = FakeBackend(InventoryFile.model_validate({"gpus": gpus}))
    inv = build_inventory(backend.raw(), backend.sharing())
    pods, owners = [], {}
    for k, (ns, name, owner, g, milli, mib, prof, *_rest) in enumerate(PODS):
        uid = f"00000000-0000-0000-0000-{k:012d}"
        mig = RecordMig(profile=prof, start=0) if prof else None
        rec = DeviceRecord(
            node="demo",
            devices=(
                RecordDevice(
                    index=g, uuid=f"GPU-demo-{g}", milli=milli, mem_mib=mib, mode="mps", mig=mig
                ),
            ),
        )
        pods.append(PodRecord(namespace=ns, name=name, uid=uid, record=rec, owner=owner))
        owners[100 + k] = uid

    def use(t: float) -> list[GpuProcess]:
        out = []
        for k, (_ns, _n, _o, g, _m, _mib, _p, base, swing, sm, period) in enumerate(PODS):
            phase = 0.5 + 0.5 * math.sin(2 * math.pi * t / period + k)
            mem = int(base + swing * phase)
            util = min(100.0, sm * (0.5 + phase))  # NVML reports at most 100%
            out.append(GpuProcess(f"GPU-demo-{g}", 100 + k, mem * MIB, sm_util_pct=util))
        return out

    backend.play(use)
    collector = GpuCollector(ExporterState(node="demo", inventory=inv), pod_of_pid=owners.get)
    httpd, port = serve(make_registry(collector), "127.0.0.1:0")
    try:
        with Prometheus([f"127.0.0.1:{port}"]) as prom:
            end = time.monotonic() + args.minutes * 60
            while time.monotonic() < end:
                collector.update(processes=backend.processes(), pods=pods)
                time.sleep(0.5)  # the agent's refresh loop, not synchronization
            prices = args.out / "prices.yaml"
            prices.write_text("currency: USD\nperGpuHour: {H100-80GB: 4.00}\n")
            window = ["--prometheus", prom.url, "--since", f"{int(args.minutes * 60) - 5}s"]
            kallot = str(Path(sys.executable).with_name("kallot"))
            subprocess.run(
                [
                    kallot,
                    "report",
                    "waste",
                    *window,
                    "--step",
                    "2",
                    "--prices",
                    str(prices),
                    "--json",
                    str(args.out / "waste.json"),
                    "--html",
                    str(args.out / "waste.html"),
                ],
                check=True,
            )
            subprocess.run(
                [
                    kallot,
                    "rightsize",
                    *window,
                    "--step",
                    "2",
                    "--json",
                    str(args.out / "rightsize.json"),
                    "--patches",
                    str(args.out / "patches.sh"),
                ],
                check=True,
            )
    finally:
        httpd.shutdown()


if __name__ == "__main__":
    main()
