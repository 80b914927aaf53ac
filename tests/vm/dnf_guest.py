"""What the vm guest needs to pose as a Rocky 9 host for the dnf source: kernel-devel and
kernel-headers RPMs named for the guest's own kernel (its real headers are Debian's, at
/lib/modules/<k>/build), in a repo standing in for AppStream."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from kit.rpm.builder import _rpmbuild, spec_head

OS_RELEASE = """\
NAME="Rocky Linux"
VERSION="9.4 (Blue Onyx)"
ID="rocky"
ID_LIKE="rhel centos fedora"
VERSION_ID="9.4"
PLATFORM_ID="platform:el9"
PRETTY_NAME="Rocky Linux 9.4 (Blue Onyx)"
"""


def build_kernel_repo(release: str, out: Path) -> Path:
    """kernel-devel-<release> and kernel-headers-<release> (a Debian release is no valid
    version-release, so the whole spec is the package name, which dnf and rpm match too)."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vm-kernel-rpm.") as scratch:
        work = Path(scratch)
        for name in (f"kernel-devel-{release}", f"kernel-headers-{release}"):
            stage = work / f"stage-{name}"
            marker = stage / name / "usr/share/doc" / name
            marker.mkdir(parents=True)
            (marker / "README").write_text(
                f"{name}: the guest's headers are /lib/modules/{release}/build (test kit)\n"
            )
            text = spec_head(name, "1", f"{name} marker for the vm guest")
            text += f"\n%install\ncp -a %{{_sourcedir}}/{name}/. %{{buildroot}}/\n"
            text += f"\n%files\n/usr/share/doc/{name}/README\n"
            _rpmbuild(name, text, stage, work, out)
    subprocess.run(["createrepo_c", "--quiet", str(out)], check=True, capture_output=True)
    return out
