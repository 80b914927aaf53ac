"""installer.steps.ldcache reads an ld.so.cache as the real `ldconfig -p` prints it (the warm
run's ld cache probe reads the file instead of spawning ldconfig): caches the real ldconfig writes
in each of glibc's formats, and this machine's own cache."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from installer.steps.ldcache import read_cache

LDCONFIG = shutil.which("ldconfig") or shutil.which("ldconfig", path="/sbin:/usr/sbin")

pytestmark = pytest.mark.skipif(LDCONFIG is None or shutil.which("gcc") is None,
                                reason="needs ldconfig and gcc")


def printed(*args: str) -> list[tuple[str, str]]:
    """(soname, path) of each line `ldconfig -p` prints, in its order."""
    assert LDCONFIG is not None
    out = subprocess.run([LDCONFIG, *args, "-p"], capture_output=True, text=True,
                         check=True).stdout
    return [(line.split()[0], line.rpartition(" => ")[2]) for line in out.splitlines()
            if " => " in line]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A root with two small libraries in two directories that its ld.so.conf names."""
    root = tmp_path_factory.mktemp("ldroot")
    source = root / "empty.c"
    source.write_text("int nothing(void) { return 0; }\n")
    for directory, soname in (("opt/a", "liballeph.so.1"), ("opt/b", "libbeth.so.2")):
        (root / directory).mkdir(parents=True)
        subprocess.run(["gcc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o",
                        str(root / directory / f"{soname}.0.0"), str(source)], check=True)
    (root / "etc").mkdir()
    (root / "etc/ld.so.conf").write_text("/opt/a\n/opt/b\n")
    return root


@pytest.mark.parametrize("layout", ["new", "old", "compat"])
def test_each_format_ldconfig_writes_reads_as_it_prints(root: Path, layout: str) -> None:
    assert LDCONFIG is not None
    subprocess.run([LDCONFIG, "-r", str(root), "-c", layout], check=True, capture_output=True)
    found = read_cache((root / "etc/ld.so.cache").read_bytes())
    assert found == printed("-r", str(root))
    assert sorted(found) == [("liballeph.so.1", "/opt/a/liballeph.so.1"),
                             ("libbeth.so.2", "/opt/b/libbeth.so.2")]


def test_this_machines_cache_reads_as_ldconfig_prints_it() -> None:
    cache = Path("/etc/ld.so.cache")
    if not cache.is_file():
        pytest.skip("this machine has no /etc/ld.so.cache")
    found = read_cache(cache.read_bytes())
    assert found is not None and len(found) > 0
    assert found == printed()
