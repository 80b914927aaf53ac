"""The image's entrypoint with the DaemonSet's environment: `installer plan` (and later `run`)
against a temporary host root mounted where the DaemonSet mounts the host's /."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from lib.manifests import (
    DAEMONSET_DIR,
    REPO,
    container_env,
    installer_container,
    installer_daemonset,
    load_all,
)

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("installer.cli") is None,
    reason="installer.cli (the CLI) has not landed yet",
)

NO_GPU_EXIT = 16  # installer.errors.NoNvidiaGpu


def _host_root(tmp_path: Path) -> Path:
    """A small Ubuntu 24.04 host tree with no NVIDIA PCI device."""
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "os-release").write_text(
        'NAME="Ubuntu"\nID=ubuntu\nID_LIKE=debian\nVERSION_ID="24.04"\nVERSION_CODENAME=noble\n',
        encoding="utf-8",
    )
    (root / "sys" / "bus" / "pci" / "devices").mkdir(parents=True)
    (root / "proc").mkdir()
    (root / "proc" / "modules").write_text("", encoding="utf-8")
    (root / "home" / "kubernetes" / "bin" / "nvidia").mkdir(parents=True)
    (root / "run" / "nvidia").mkdir(parents=True)
    return root


def _daemonset_env(tmp_path: Path) -> dict[str, str]:
    """The rendered DaemonSet's env, with the two container paths moved under tmp_path."""
    ds = installer_daemonset(load_all(DAEMONSET_DIR / "nvidia-driver-installer.yaml"))
    env = container_env(installer_container(ds))
    assert env["ROOT_MOUNT_DIR"] == "/root"
    assert env["NVIDIA_INSTALL_DIR_CONTAINER"] == "/usr/local/nvidia"
    root = _host_root(tmp_path)
    env["ROOT_MOUNT_DIR"] = str(root)
    # The DaemonSet mounts the host's install dir there; here it is the same directory.
    env["NVIDIA_INSTALL_DIR_CONTAINER"] = str(root / "home" / "kubernetes" / "bin" / "nvidia")
    return env


def _installer(args: list[str], env: dict[str, str], home: Path) -> subprocess.CompletedProcess:
    full_env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "PYTHONPATH": str(REPO),
        # Nothing may leave the machine: a download attempt fails at once instead.
        "HTTP_PROXY": "http://127.0.0.1:9",
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "NO_PROXY": "",
        **env,
    }
    return subprocess.run([sys.executable, "-m", "installer", *args], capture_output=True,
                          text=True, timeout=120, check=False, env=full_env, cwd=home)


def test_python_m_installer_is_the_image_entrypoint() -> None:
    """The image's ENTRYPOINT is the `installer` console script; these tests call
    `python -m installer`. Both must reach the same function."""
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert 'installer = "installer.cli:main"' in text
    main = (REPO / "installer" / "__main__.py").read_text(encoding="utf-8")
    assert "from installer.cli import main" in main


def test_plan_with_the_daemonset_environment(tmp_path: Path) -> None:
    result = _installer(["plan"], _daemonset_env(tmp_path), tmp_path)
    output = result.stdout + result.stderr
    if result.returncode == NO_GPU_EXIT:
        assert "error[no-nvidia-gpu]" in output
        assert "hint:" in output
    else:
        assert result.returncode == 0, output
        assert "580.105.08" in output, "the plan must show the pinned version"


def test_plan_changes_nothing_on_the_host(tmp_path: Path) -> None:
    env = _daemonset_env(tmp_path)
    root = Path(env["ROOT_MOUNT_DIR"])
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    _installer(["plan"], env, tmp_path)
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before


def test_run_with_the_daemonset_environment(tmp_path: Path) -> None:
    """The DaemonSet's exact environment, the host root where the manifest mounts it (here a
    temp dir), a fake driver from file://; built for the headers' kernel so nothing is loaded
    into this machine's kernel (loading is the vm tier's)."""
    import kit
    from lib.hostkit import hidden_headers_argv, installer_argv, make_debian_host

    ds = installer_daemonset(load_all(DAEMONSET_DIR / "nvidia-driver-installer.yaml"))
    env = container_env(installer_container(ds))
    root = tmp_path / "root"
    kernel = make_debian_host(root)
    version = env["NVIDIA_DRIVER_VERSION"]
    runfile = kit.build_runfile(version, tmp_path / "www")
    env.update({
        "ROOT_MOUNT_DIR": str(root),
        "NVIDIA_INSTALL_DIR_CONTAINER": str(tmp_path / "not-mounted"),
        "NVIDIA_DRIVER_DOWNLOAD_URL": f"file://{runfile}",
        "NVIDIA_KERNEL_RELEASE": kernel,
        "NVIDIA_INSTALLER_FETCH_HEADERS": "false",
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(REPO),
    })
    result = subprocess.run(hidden_headers_argv(installer_argv("run")), env=env,
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    install = root / env["NVIDIA_INSTALL_DIR_HOST"].lstrip("/")
    assert (install / "bin/nvidia-smi").is_file()
    assert (install / "lib64/libnvidia-ml.so.1").is_symlink()
    assert (install / "drivers/nvidia.ko").is_file()
    assert (install / ".cache").read_text().endswith(f"CACHE_NVIDIA_DRIVER_VERSION={version}\n")
