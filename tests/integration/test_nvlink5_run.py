"""`installer run` on an HGX B200 host root (ConnectX-7 Limited PFs, B200 GPUs): the plan says
NVLink5, and one run puts NVLSM (the driver's redistrib JSON entry), Fabric Manager and IMEX
(NVIDIA_IMEX=install) of the driver's redist tree, served on 127.0.0.1 and vouched for by the
digests file, into versions/<ver>/; a second run asks the tree for nothing."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import kit
import pytest
from kit.fabricmanager import build_fabricmanager
from kit.imex import build_imex
from kit.nvlink5 import hgx_b200_ports, write_cx7_port, write_module_tree
from kit.nvlsm import build_nvlsm
from lib.hostkit import INSTALL_DIR_HOST, installer_env, make_debian_host, ok, run_installer
from lib.hosttrees import B200
from lib.httpfaults import serve_new_directory
from lib.marks import needs_headers

pytestmark = needs_headers

V = "580.105.08"
SM = "2025.10.12"


def build_mirror(www: Path) -> None:
    """The driver's runfile, and its redist tree with Fabric Manager, NVLSM and IMEX."""
    kit.build_runfile(V, www / V)
    build_fabricmanager(V, www / "redist")
    build_nvlsm(SM, www / "redist", driver=V)
    build_imex(V, www / "redist")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, list[str]]]:
    yield from serve_new_directory(tmp_path_factory, build_mirror)



def test_one_run_installs_nvlsm_fabric_manager_and_imex_on_a_b200(
        tmp_path: Path, served: tuple[str, Path, list[str]]) -> None:
    base, www, requests = served
    root = tmp_path / "host"
    kernel = make_debian_host(root, gpus=(B200,) * 8)
    for port in hgx_b200_ports():
        write_cx7_port(root, port)
    write_module_tree(root, kernel)
    digests = kit.write_digests(tmp_path / "digests", www / V, www / "redist")
    env = installer_env(root, kernel, NVIDIA_DRIVER_VERSION=V, NVIDIA_DRIVER_MIRRORS=base,
                        NVIDIA_DRIVER_DIGESTS_FILE=str(digests), NVIDIA_IMEX="install",
                        NVIDIA_FABRICMANAGER_REDIST=f"{base}/redist")
    plan = ok(run_installer(env, "plan")).stdout
    assert ("nvlink5: yes\n      because NVLink5 node: 2 ConnectX-7 Limited PF port(s) whose "
            "VPD says SW_MNG, first 0000:c1:00.1 (15b3:1021, mlx5_1), port GUID "
            "0xb8cef60300e61201: NVLSM runs on that port before Fabric Manager") in plan
    assert f"imex: nvidia-imex {V}\n" in plan
    result = ok(run_installer(env, "run"))
    for step in ("install-nvlsm", "install-imex", "install-fabricmanager"):
        assert f"step {step}: done" in result.stderr
    version_dir = root / INSTALL_DIR_HOST.lstrip("/") / "versions" / V
    for name in ("nvlsm", "nv-fabricmanager", "nvidia-imex", "nvidia-imex-ctl"):
        assert (version_dir / "bin" / name).stat().st_mode & 0o111, name
    assert (version_dir / "share/nvidia/nvlsm/nvlsm.conf").is_file()
    said = subprocess.run([str(version_dir / "bin/nvlsm"), "--version"], capture_output=True,
                          text=True, check=True)
    assert said.stdout.strip() == f"nvlsm {SM}"
    requests.clear()
    warm = ok(run_installer(env, "run"))
    assert "step install-nvlsm: already satisfied" in warm.stderr
    assert not [r for r in requests if "redist" in r]
