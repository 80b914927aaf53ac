"""Demo: a fake driver served on 127.0.0.1 inside a VM with two simulated H100s; `installer
plan`, `installer run` (cold), `installer run` (warm) and `installer verify --json`."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

import kit  # noqa: E402
from vm.harness import FakeGpu, VmError, boot_and_run  # noqa: E402

VERSION = "580.105.08"
SCENARIO = """
ip link set lo up
cd "$VM_FILES"
python3 -m http.server --bind 127.0.0.1 8000 --directory "$VM_FILES/www" >/dev/null 2>&1 &
for _ in $(seq 50); do python3 -c 'import socket; socket.create_connection(("127.0.0.1", 8000))' \
  2>/dev/null && break; sleep 0.1; done
export PYTHONPATH={repo}
export NVIDIA_DRIVER_VERSION={version} NVIDIA_DRIVER_MIRRORS=http://127.0.0.1:8000
# A mirror serves bytes only: the operator's digests file (as `installer download` writes it)
# vouches for the .run.
export NVIDIA_DRIVER_DIGESTS_FILE="$VM_FILES/www/digests"
export NVIDIA_INSTALL_DIR_HOST=/home/kubernetes/bin/nvidia
installer() {{ {python} -m installer "$@"; }}
echo "@@ plan"
installer plan
echo "@@ run (cold)"
installer run 2>&1
echo "@@ run (warm)"
/usr/bin/time -f "wall time %e s" {python} -m installer run 2>&1
echo "@@ verify"
installer verify --json
echo "@@ host"
ls -l /dev/nvidia*
grep nvidia /proc/modules
head -1 /proc/driver/nvidia/version
ldconfig -p | grep -E 'libnvidia-ml|libcuda'
cat /run/nvidia-driver-installer/driver-ready
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="installer-demo-") as scratch:
        www = Path(scratch) / "www"
        print(f"building a fake NVIDIA {VERSION} .run with the test kit ...", flush=True)
        kit.build_runfile(VERSION, www / VERSION)
        kit.write_digests(www / "digests", www / VERSION)
        script = SCENARIO.format(repo=REPO, version=VERSION, python=sys.executable)
        gpus = [FakeGpu("0000:00:04.0", "0x2330"), FakeGpu("0000:00:05.0", "0x2330")]
        print("booting Debian's kernel under qemu with two simulated H100s ...", flush=True)
        try:
            result = boot_and_run(script, gpus=gpus, files={"www": www},
                                  state_dir=Path(scratch) / "state", timeout=args.timeout)
        except VmError as error:
            print(error, file=sys.stderr)
            return 1
        for name in ("plan", "run (cold)", "run (warm)", "verify", "host"):
            print(f"\n===== {name} =====")
            try:
                print(result.section(name))
            except KeyError:
                print("(not reached)")
        print(f"\nVM exit code {result.exit_code}, {result.duration:.0f} s including boot")
        return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
