"""The kit's nvidia.ko stamps its build date into /proc/driver/nvidia/version as NVIDIA's banner
does (date(1)'s shape, "Sat Dec  5"), whatever day of the month it is built on: kbuild squeezes
spaces in compiler flags, which once made the banner read "Dec 5" on the 1st to the 9th."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import kit
import pytest
from kit.fake_host import BUILD_DATE_PATTERN
from lib.hostkit import debian_headers

KERNEL = (debian_headers() or ("6.1.0-56-amd64", ()))[0]
HEADERS = Path(f"/usr/src/linux-headers-{KERNEL}")
# 2025-12-05 and 2025-12-25, 09:24:50 UTC.
FIFTH, TWENTY_FIFTH = 1764926690, 1766654690

pytestmark = pytest.mark.skipif(
    not HEADERS.is_dir(), reason=f"needs Debian's linux-headers-{KERNEL} (scripts/install-deps)")


def banner_date(tmp_path: Path, epoch: int) -> str:
    """The date the kit's proprietary nvidia.ko, built at `epoch`, carries in its banner."""
    tree = tmp_path / f"kernel-{epoch}"
    shutil.copytree(Path(kit.__file__).parent / "kernel", tree)
    subprocess.run(
        ["make", "-s", "-C", str(HEADERS), f"M={tree}", "NV_VERSION=550.54.15",
         "NV_FLAVOUR=proprietary", "NV_BUILD_UVM=0", "NV_BUILD_MODESET=0", "NV_BUILD_DRM=0",
         f"SOURCE_DATE_EPOCH={epoch}", "modules"],
        check=True, capture_output=True, timeout=300)
    found = re.findall(rb"[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d UTC \d{4}",
                       (tree / "nvidia.ko").read_bytes())
    assert len(found) == 1, found
    return found[0].decode()


@pytest.mark.parametrize(("epoch", "expected"), [(FIFTH, "Fri Dec  5 09:24:50 UTC 2025"),
                                                 (TWENTY_FIFTH, "Thu Dec 25 09:24:50 UTC 2025")])
def test_the_banner_keeps_dates_shape_on_any_day(tmp_path: Path, epoch: int,
                                                 expected: str) -> None:
    date = banner_date(tmp_path, epoch)
    assert date == expected
    assert re.fullmatch(BUILD_DATE_PATTERN, date)
