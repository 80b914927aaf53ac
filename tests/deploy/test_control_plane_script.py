"""scripts/control-plane: where it keeps what it builds (keyed by Kubernetes release and Go
version, outside the clone), and a second run that finds everything builds nothing: it needs
neither Go nor the network."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from lib.manifests import REPO

SCRIPT = REPO / "scripts" / "control-plane"
TOOLS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")


def run(cache: Path, *args: str, path: str = "/usr/bin:/bin") -> subprocess.CompletedProcess[str]:
    return subprocess.run(["/bin/bash", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=60,
                          env={**os.environ, "CONTROL_PLANE_CACHE": str(cache), "PATH": path})


def toolbox(directory: Path) -> str:
    """A PATH with the coreutils the script uses, and no go, curl, jq or apt-get."""
    directory.mkdir()
    for tool in ("mkdir", "mktemp", "sed", "rm", "mv", "chmod", "cat", "sha256sum"):
        (directory / tool).symlink_to(f"/usr/bin/{tool}" if Path(f"/usr/bin/{tool}").exists()
                                      else f"/bin/{tool}")
    return str(directory)


def test_paths_are_keyed_by_release_and_go_version(tmp_path: Path) -> None:
    done = run(tmp_path, "--paths")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(tmp_path / "v1.36.3-go1.26.8"),
                                   str(tmp_path / "etcd-3.5.16" / "usr" / "bin" / "etcd")]
    assert list(tmp_path.iterdir()) == []  # asking builds nothing


def test_a_second_run_builds_nothing(tmp_path: Path) -> None:
    bin_dir, etcd = (Path(p) for p in run(tmp_path, "--paths").stdout.split())
    etcd.parent.mkdir(parents=True)
    bin_dir.mkdir()
    for tool in (*(bin_dir / t for t in TOOLS), etcd):
        tool.write_text("#!/bin/sh\nexit 1\n")
        tool.chmod(0o755)
    # No go, curl or apt-get on PATH: any attempt to build would fail.
    done = run(tmp_path, path=toolbox(tmp_path / "tools"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(bin_dir)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "etcd-3.5.16", "tools", "v1.36.3-go1.26.8"]


def test_a_missing_binary_means_a_build(tmp_path: Path) -> None:
    """What the test above rests on: with kubectl missing the script goes on to build: without
    Go it fetches the toolchain (here there is no curl, so it fails rather than pretending)."""
    bin_dir, etcd = (Path(p) for p in run(tmp_path, "--paths").stdout.split())
    etcd.parent.mkdir(parents=True)
    bin_dir.mkdir()
    for tool in (*(bin_dir / t for t in TOOLS[:-1]), etcd):
        tool.write_text("#!/bin/sh\nexit 1\n")
        tool.chmod(0o755)
    done = run(tmp_path, path=toolbox(tmp_path / "tools"))
    assert done.returncode != 0
    assert "curl: command not found" in done.stderr
    assert not (bin_dir / "kubectl").exists()
    assert not list(tmp_path.glob(".*"))  # its temp dirs went with it
