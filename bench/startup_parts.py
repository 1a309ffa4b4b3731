"""What reading the scheduler configuration document costs the openb simulator's start-up.

In one fresh process, the CPU time (``time.process_time``, all threads) of each part of
``kallot sim openb --policy kallot``'s start-up, in this order: the command's modules other than
the document's (numpy, typer, rich's text, the core, the trace reader), then yaml, pydantic's
import and its first model, the document's models (``config.scheduler``, ``config.autoscale``),
the rest of the command's modules, reading and validating the shipped ``kallot.yaml``, and the
Profile and Framework built from it. yaml, pydantic, the document's models and the reading are
what issue 37 item 6 (one composition: the simulators read the same validated file as the
scheduler) added to the simulator's start-up (BENCHMARKS.md, "Issue 37 item 6's price"). Run it several times: the
first part varies with the machine's load, the others much less.

    .venv/bin/python bench/startup_parts.py [--runs 3]
"""

from __future__ import annotations

import argparse
import subprocess
import sys

PARTS = (
    (
        "other modules",
        "numpy typer rich.text kallot.cli.sim kallot.cli.ui kallot.core.policies "
        "kallot.core.framework.runner kallot.core.provision.shapes kallot.core.k8s kallot.sim.trace",
    ),
    ("yaml", "yaml"),
    ("pydantic (import + first model)", ""),
    ("document models", "kallot.config.autoscale kallot.config.scheduler kallot.config.presets"),
    ("the command", "kallot.sim.openb kallot.sim.replay kallot.cli.sim_openb"),
    ("read + validate kallot.yaml", ""),
    ("Profile + Framework", ""),
)

# One process per run (imports happen once per process): the parts in order, ms each.
CHILD = """
import importlib, time
out = []
def part(fn):
    c = time.process_time(); fn(); out.append(1000 * (time.process_time() - c))
def mods(names):
    return lambda: [importlib.import_module(m) for m in names.split()]
def first_model():
    from pydantic import BaseModel, Field
    class _A(BaseModel):
        x: int = Field(default=0, ge=0)
def read():
    from kallot.config import scheduler
    scheduler.shipped("kallot")
def framework():
    from kallot.config import presets
    presets.framework(presets.document("kallot", None), name="kallot")
for name, modules in PARTS:
    if name.startswith("pydantic"):
        part(first_model)
    elif name.startswith("read"):
        part(read)
    elif name.startswith("Profile"):
        part(framework)
    else:
        part(mods(modules))
print(" ".join(f"{x:.1f}" for x in out))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    runs = []
    for _ in range(args.runs):
        code = f"PARTS = {PARTS!r}\n{CHILD}"
        out = subprocess.run(
            [sys.executable, "-c", code], check=True, capture_output=True, text=True
        ).stdout
        runs.append([float(x) for x in out.split()])
    for i, (name, _) in enumerate(PARTS):
        values = sorted(r[i] for r in runs)
        print(f"{name:34s} CPU ms {' '.join(f'{v:6.1f}' for v in values)}")
    added = sorted(r[1] + r[2] + r[3] + r[5] for r in runs)  # yaml, pydantic, models, reading
    print(f"{'the document (item 6)':34s} CPU ms {' '.join(f'{v:6.1f}' for v in added)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
