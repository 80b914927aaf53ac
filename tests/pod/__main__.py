"""`python3 -m pod run|probe|stop`: a DaemonSet's pod, run with runc (see pod/run.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml
from lib.podspec import Image

from pod.run import Pod


def pod_spec(manifest: Path) -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all(manifest.read_text()) if d and d["kind"] == "DaemonSet"]
    spec = dict(doc["spec"]["template"]["spec"])
    spec["_name"] = doc["metadata"]["name"]
    return spec


def image_arg(text: str) -> tuple[str, Image]:
    """REF=ROOTFS:CONFIG (CONFIG: a JSON file with the image's OCI config)."""
    ref, _, rest = text.rpartition("=")
    rootfs, _, config = rest.partition(":")
    return ref, Image(Path(rootfs), json.loads(Path(config).read_text()) if config else {})


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="pod")
    parser.add_argument("action", choices=["run", "probe", "stop"])
    parser.add_argument("--manifest", type=Path, required=True)
    parser.add_argument("--image", action="append", default=[], type=image_arg)
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--runtime", default="runc")
    parser.add_argument("--timeout", type=float, default=1200)
    parser.add_argument("--pci-tree", type=Path, help="the simulated GPUs' PCI tree (pod/run.py)")
    parser.add_argument("--sys-class", type=Path,
                        help="the simulated IB ports' /sys/class (pod/run.py)")
    args = parser.parse_args(argv)
    pod = Pod(pod_spec(args.manifest), dict(args.image), args.state, args.runtime, args.pci_tree,
              args.sys_class)
    if args.action == "run":
        report: Any = pod.run(args.timeout)
    elif args.action == "probe":
        report = pod.probe()
    else:
        pod.stop()
        report = {}
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
