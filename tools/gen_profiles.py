"""Regenerate the shipped scheduler configuration files (src/kallot/config/profiles/*.yaml) from
the presets in kallot.core.policies.PROFILES, keeping each file's comment header.

    .venv/bin/python tools/gen_profiles.py

tests/config/test_scheduler_config.py checks that every shipped file equals its preset, so run
this after changing a preset (a plugin added to every profile, a weight).
"""

from __future__ import annotations

from pathlib import Path

from kallot.core import policies

OUT = Path(__file__).resolve().parents[1] / "src" / "kallot" / "config" / "profiles"
POINTS = (
    ("queueSort", "queue_sort"),
    ("preFilter", "pre_filter"),
    ("filter", "filter"),
    ("score", "score"),
    ("deviceScore", "device_score"),
)


def render(name: str, header: str) -> str:
    p = policies.PROFILES[name]
    lines = [
        header.rstrip("\n"),
        "apiVersion: kallot.io/v1alpha1",
        "kind: KallotSchedulerConfiguration",
        "profiles:",
        "  - schedulerName: kallot",
        f"    mig: {p.mig}",
        f"    gangTopology: {p.gang_topology}",
        "    plugins:",
    ]
    for point, attr in POINTS:
        value = getattr(p, attr)
        lines += [f"      {point}:", "        disabled: [{name: '*'}]"]
        if attr == "queue_sort":
            entries = [f"{{name: {value}}}"]
        elif attr == "score":
            entries = [f"{{name: {n}, weight: {w}}}" for n, w in value]
        else:
            entries = [f"{{name: {n}}}" for n in value]
        if entries:
            lines.append("        enabled:")
            lines += [f"          - {e}" for e in entries]
        else:
            lines.append("        enabled: []")
    return "\n".join(lines) + "\n"


def main() -> None:
    for path in sorted(OUT.glob("*.yaml")):
        text = path.read_text()
        header = text[: text.index("apiVersion:")]
        path.write_text(render(path.stem, header))
        print(path)


if __name__ == "__main__":
    main()
