"""Write a PrometheusRule manifest's rule groups as a Prometheus rules file (what promtool and a
plain Prometheus read), so the manifest shipped is the one tested.

    python3 scripts/prometheus_rules.py daemonset/components/metrics/prometheusrule.yaml OUT
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml


def rule_groups(manifest: Path) -> dict[str, object]:
    """The `spec.groups` of the one PrometheusRule in `manifest`, as a rules file's document.
    Raises ValueError when the file holds no PrometheusRule or it has no groups."""
    rules = [doc for doc in yaml.safe_load_all(manifest.read_text())
             if isinstance(doc, dict) and doc.get("kind") == "PrometheusRule"]
    if len(rules) != 1:
        raise ValueError(f"{manifest}: expected one PrometheusRule, found {len(rules)}")
    groups = (rules[0].get("spec") or {}).get("groups")
    if not groups:
        raise ValueError(f"{manifest}: the PrometheusRule has no spec.groups")
    return {"groups": groups}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("manifest", type=Path)
    parser.add_argument("out", type=Path, nargs="?", help="the rules file (default: stdout)")
    args = parser.parse_args(argv)
    try:
        text = yaml.safe_dump(rule_groups(args.manifest), sort_keys=False)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
