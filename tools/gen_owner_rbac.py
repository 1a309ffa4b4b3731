"""Write the owner kinds' rules into the chart's ClusterRole from kallot.kube.owners.KINDS.

    .venv/bin/python tools/gen_owner_rbac.py && bash deploy/render.sh

tests/kube/test_owners_table.py fails until both have been run after a change to the table.
"""

from __future__ import annotations

from pathlib import Path

from kallot.kube.owners import rbac

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    path = ROOT / rbac.CHART_FILE
    path.write_text(rbac.replace_block(path.read_text()))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
