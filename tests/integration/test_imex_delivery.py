"""IMEX from NVIDIA's driver redist layout served on 127.0.0.1: the imex entry of the driver's
redistrib JSON (a mirror's JSON vouches for nothing; the digests file does), nvidia-imex and
nvidia-imex-ctl of exactly the driver's version into versions/<ver>/bin; the kit's stand-in
nvidia-imex refuses a driver of another version."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import kit
import pytest
from kit.fabricmanager import build_fabricmanager
from kit.imex import build_imex, relative_path
from lib.hosttrees import GB200, make_host, write_driver_version
from lib.httpfaults import serve_directory

from installer.components import imex
from installer.config import from_env
from installer.errors import ImexMismatch, UnverifiedDownload
from installer.layout import Layout

V = "580.105.08"
W = "580.126.20"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, list[str]]]:
    www = tmp_path_factory.mktemp("www")
    build_fabricmanager(V, www / "redist")
    build_imex(V, www / "redist")
    build_imex(V, www / "wrong", listed=W)  # a JSON whose imex entry is another version's
    build_fabricmanager(V, www / "fmonly")  # a mirror whose JSON lists no imex
    with serve_directory(www) as (base, requests):
        yield base, www, requests


def gb200_host(tmp_path: Path, gpus: int) -> tuple[Path, Path, dict[str, str]]:
    """A fake host of `gpus` GB200s under tmp_path/host: its top, its root and the env that
    points the installer at it (no container-side install dir)."""
    top = tmp_path / "host"
    root = make_host(top, gpus=[GB200] * gpus)
    return top, root, {"ROOT_MOUNT_DIR": str(top),
                       "NVIDIA_INSTALL_DIR_CONTAINER": str(top) + "-none"}


def test_imex_of_the_drivers_version_goes_into_the_version_dir(
        tmp_path: Path, served: tuple[str, Path, list[str]]) -> None:
    base, www, requests = served
    top, root, host_env = gb200_host(tmp_path, 4)
    env = {**host_env, "NVIDIA_FABRICMANAGER_REDIST": f"{base}/redist"}
    layout = Layout.from_config(from_env(env), root)
    with pytest.raises(UnverifiedDownload):
        imex.fetch(from_env(env), layout, V, "x86_64")
    assert f"/redist/{relative_path(V)}" not in requests  # refused before any archive byte
    digests = kit.write_digests(tmp_path / "digests", www / "redist")
    config = from_env({**env, "NVIDIA_DRIVER_DIGESTS_FILE": str(digests)})
    archive = imex.fetch(config, layout, V, "x86_64")
    assert imex.install(archive, tmp_path / "work", layout, V) == [
        "bin/nvidia-imex", "bin/nvidia-imex-ctl"]
    assert imex.installed(layout, V)
    binary = layout.version_dir(V) / "bin" / "nvidia-imex"
    said = subprocess.run([str(binary), "--version"], capture_output=True, text=True,
                          check=True)
    assert said.stdout.strip() == f"IMEX version is: {V}"
    # No daemon answers on the command socket: not READY (`installer imex` runs the daemon).
    ctl = subprocess.run([str(binary.with_name("nvidia-imex-ctl")), "-q",
                          f"--u={tmp_path / 'none.sock'}"], capture_output=True, text=True)
    assert ctl.returncode == 1 and "READY" not in ctl.stdout
    # The stand-in aborts on a driver of another version, as the real one does.
    write_driver_version(top, W)
    cfg = tmp_path / "imexd.cfg"
    cfg.write_text("IMEX_CMD_PORT=50005\n")
    refused = subprocess.run([str(binary), "-c", str(cfg)], capture_output=True, text=True,
                             env={"NVFAKE_TEST_ROOT": str(top), "PATH": "/usr/bin:/bin"})
    assert refused.returncode == 1
    assert f"driver version {W} is not compatible with IMEX {V}" in refused.stderr


def test_an_imex_entry_of_another_version_is_refused(
        tmp_path: Path, served: tuple[str, Path, list[str]]) -> None:
    base, www, _ = served
    _, root, host_env = gb200_host(tmp_path, 1)
    digests = kit.write_digests(tmp_path / "digests", www / "wrong")
    config = from_env({**host_env, "NVIDIA_FABRICMANAGER_REDIST": f"{base}/wrong",
                       "NVIDIA_DRIVER_DIGESTS_FILE": str(digests)})
    layout = Layout.from_config(config, root)
    with pytest.raises(ImexMismatch, match=f"lists imex '{W}', not {V}"):
        imex.fetch(config, layout, V, "x86_64")
    assert not imex.installed(layout, V)


def test_a_mirror_without_the_entry_or_of_another_version_is_passed_over(
        tmp_path: Path, served: tuple[str, Path, list[str]]) -> None:
    base, www, _ = served
    _, root, host_env = gb200_host(tmp_path, 1)
    digests = kit.write_digests(tmp_path / "digests", www / "redist")
    env = {**host_env, "NVIDIA_DRIVER_DIGESTS_FILE": str(digests)}
    config = from_env({**env, "NVIDIA_FABRICMANAGER_REDIST":
                       f"{base}/fmonly,{base}/wrong,{base}/redist"})
    layout = Layout.from_config(config, root)
    archive = imex.fetch(config, layout, V, "x86_64")
    assert archive.name == Path(relative_path(V)).name
    # No base lists it: the error says what each one said.
    config = from_env({**env, "NVIDIA_FABRICMANAGER_REDIST": f"{base}/fmonly,{base}/wrong"})
    with pytest.raises(ImexMismatch) as raised:
        imex.fetch(config, Layout.from_config(config, root), V, "x86_64")
    assert "fmonly/redistrib_" in raised.value.message
    assert "lists no imex archive" in raised.value.message
    assert f"lists imex '{W}', not {V}" in raised.value.message
