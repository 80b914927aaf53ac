"""Credentials stay in the installer. Every child process (make, the .run, nvidia-installer,
apt-get, dnf and its scriptlets, dkms, the daemons beside the driver) starts through
installer.runner, which hands it an environment without the registry credentials and without
any URL-valued setting (a mirror's `user:password@`, a signed query), whatever the caller
passes: no child reads those settings, so none needs them."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import kit
import pytest
from lib.hostkit import debian_headers, installer_env, make_debian_host, run_installer
from lib.httpfaults import serve_directory

from installer import runner
from installer.runner import SubprocessRunner

SECRETS = {"NVIDIA_MODULE_REGISTRY_PASSWORD": "pa55-in-env",
           "NVIDIA_MODULE_REGISTRY_USERNAME": "robot-in-env", "ORAS_PASS": "oras-pa55"}
# URL settings as an operator might write them for a private mirror: userinfo, a signed query.
URL_SECRETS = {
    "NVIDIA_DRIVER_MIRRORS": "http://mirror-user:mirror-secret@127.0.0.1:9/nvidia",
    "NVIDIA_DRIVER_DOWNLOAD_URL": "https://127.0.0.1:9/a.run?X-Amz-Signature=signed-secret",
    "NVIDIA_FABRICMANAGER_REDIST": "https://redist-user:redist-secret@127.0.0.1:9/redist",
    "NVIDIA_INSTALLER_HEADERS_MIRROR": "http://hdr:headers-secret@127.0.0.1:9/debian",
    "NVIDIA_DNF_REPO_URL": "https://127.0.0.1:9/cuda.repo?token=dnf-secret",
    "NVIDIA_DRIVER_CATALOG": "https://cat:catalog-secret@127.0.0.1:9/releases.json",
}
WORDS = ("pa55", "robot-in-env", "dl-secret", "mirror-secret", "signed-secret", "redist-secret",
         "headers-secret", "dnf-secret", "catalog-secret")


def _clean(output: str) -> None:
    for word in WORDS:
        assert word not in output


def test_children_never_see_registry_credentials() -> None:
    runner = SubprocessRunner({"PATH": "/usr/bin:/bin", "KEEP": "me", **SECRETS})
    inherited = runner.run(["env"]).output
    passed = runner.run(["env"], env={"NVIDIA_MODULE_REGISTRY_PASSWORD": "pa55-passed"}).output
    for output in (inherited, passed):
        assert "KEEP=me" in output and "LC_ALL=C" in output
        assert "NVIDIA_MODULE_REGISTRY_PASSWORD" not in output
        assert "NVIDIA_MODULE_REGISTRY_USERNAME" not in output
        assert "ORAS_PASS" not in output
        assert "pa55" not in output


def test_children_never_see_url_settings() -> None:
    """Not even a URL setting without credentials: which URL carries one is the operator's
    business, and no child reads them. Settings that are not URLs pass (no child reads them
    either, but nothing is gained by dropping them)."""
    runner = SubprocessRunner({"PATH": "/usr/bin:/bin", "NVIDIA_DRIVER_VERSION": "580",
                               "NVIDIA_INSTALLER_ROCKY_VAULT": "https://dl.rockylinux.org/v",
                               **URL_SECRETS})
    for output in (runner.run(["env"]).output,
                   runner.run(["env"], env={"NVIDIA_DRIVER_MIRRORS": URL_SECRETS[
                       "NVIDIA_DRIVER_MIRRORS"]}).output):
        _clean(output)
        for name in (*URL_SECRETS, "NVIDIA_INSTALLER_ROCKY_VAULT"):
            assert f"{name}=" not in output
        assert "NVIDIA_DRIVER_VERSION=580" in output


def test_a_spawned_daemon_sees_no_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemons beside the driver (Fabric Manager, persistenced) start through
    runner.spawn, from the installer's own environment."""
    for name, value in {**SECRETS, **URL_SECRETS}.items():
        monkeypatch.setenv(name, value)
    lines: list[str] = []
    child = runner.spawn(["env"], env={"LD_LIBRARY_PATH": "/opt/x"}, on_line=lines.append)
    assert child.wait(timeout=30) == 0
    output = "\n".join(lines)
    assert "LD_LIBRARY_PATH=/opt/x" in output and "LC_ALL=C" in output
    _clean(output)


SPIED = ("make", "depmod", "ldconfig", "modinfo")


@pytest.mark.skipif(debian_headers() is None, reason="needs linux-headers-amd64")
def test_a_run_with_credentials_in_url_settings_leaks_them_nowhere(tmp_path: Path) -> None:
    """`installer run` from a mirror whose URL carries `user:password@` (and every other URL
    setting carrying a credential): every child the run starts (make and the tools the .run
    starts) dumps its environment; no secret is in any of them, nor in the log, nor on the
    host (the state record, the cache). The .run comes through a URL with `user:password@`
    and a signed query."""
    version = "580.105.08"
    www = tmp_path / "www"
    runfile = kit.build_runfile(version, www / version)
    dumps, spy = tmp_path / "dumps", tmp_path / "spy"
    dumps.mkdir()
    spy.mkdir()
    for name in SPIED:
        real = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
        assert real, name
        wrapper = spy / name
        wrapper.write_text(f'#!/bin/sh\nenv > "{dumps}/{name}.$$"\nexec {real} "$@"\n')
        wrapper.chmod(0o755)
    root = tmp_path / "host"
    kernel = make_debian_host(root)
    with serve_directory(www) as (base, requests):
        port = base.rsplit(":", 1)[1]
        settings = {k: v.replace("127.0.0.1:9", f"127.0.0.1:{port}")
                    for k, v in URL_SECRETS.items() if k != "NVIDIA_DRIVER_CATALOG"}
        # The download itself through a URL with both: userinfo and a signed query.
        settings["NVIDIA_DRIVER_DOWNLOAD_URL"] = (
            f"http://dl-user:dl-secret@127.0.0.1:{port}/{version}/{runfile.name}"
            "?X-Amz-Signature=signed-secret")
        env = installer_env(root, kernel, NVIDIA_DRIVER_VERSION=version,
                            NVIDIA_DRIVER_SHA256=hashlib.sha256(runfile.read_bytes()).hexdigest(),
                            **settings)
        env["PATH"] = f"{spy}:{env['PATH']}"
        result = run_installer(env, "run")
    assert result.returncode == 0, result.stderr[-3000:]
    assert [p for p in requests if p.startswith(f"/{version}/")]  # that URL served the .run
    dumped = sorted(dumps.iterdir())
    assert {p.name.split(".")[0] for p in dumped} >= {"make", "depmod"}, dumped
    for dump in dumped:
        text = dump.read_text()
        assert "LC_ALL=C" in text
        _clean(text)
    _clean(result.stdout + result.stderr)
    found = subprocess.run(["grep", "-rlE", "|".join(WORDS), str(root)], capture_output=True,
                           text=True, check=False)
    assert found.stdout == ""
