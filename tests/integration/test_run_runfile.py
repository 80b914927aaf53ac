"""`installer run` end to end with the fake-driver kit, against a temporary host root holding
real Debian headers at a relocated path (this machine's own headers hidden). Nothing is
loaded here (the host root's running kernel differs from the target): that is the VM tier."""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kit
import pytest
import testinfra
from lib.hostkit import (
    INSTALL_DIR_HOST,
    installer_env,
    make_debian_host,
    ok,
    run_and_kill_at,
    run_installer,
    tree_snapshot,
)
from lib.httpfaults import serve_new_directory
from lib.marks import needs_headers

pytestmark = needs_headers

A = "580.105.08"
B = "580.126.20"


def build_mirror(www: Path) -> None:
    """Fake runfiles for A and B, and a broken one; their digests beside the mirror."""
    for version in (A, B):
        kit.build_runfile(version, www / version)
    kit.build_runfile("570.195.03", www / "broken", compile_error=True)
    kit.write_digests(digests_of(www), www)  # the operator's file: a mirror serves bytes only


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, list[str]]]:
    """The mirror on 127.0.0.1, its requests recorded."""
    yield from serve_new_directory(tmp_path_factory, build_mirror)


def digests_of(www: Path) -> Path:
    return www.parent / f"{www.name}.digests"


@pytest.fixture
def host(tmp_path: Path) -> tuple[Path, str]:
    root = tmp_path / "host"
    kernel = make_debian_host(root)
    return root, kernel


def env_for(
    host: tuple[Path, str], served: tuple[str, Path, list[str]], version: str = A, **settings: str
) -> dict[str, str]:
    root, kernel = host
    base, www, _ = served
    return installer_env(
        root, kernel, NVIDIA_DRIVER_VERSION=version, NVIDIA_DRIVER_MIRRORS=base,
        NVIDIA_DRIVER_DIGESTS_FILE=str(digests_of(www)), **settings
    )


@pytest.fixture
def installed(host: tuple[Path, str], served: Any) -> dict[str, str]:
    """The host after one successful `installer run` of A: the settings that ran it."""
    env = env_for(host, served)
    ok(run_installer(env, "run"))
    return env


def install_dir(root: Path) -> Path:
    return root / INSTALL_DIR_HOST.lstrip("/")



def cached_sonames(root: Path) -> dict[str, str]:
    out = subprocess.run(
        ["ldconfig", "-r", str(root), "-p"], capture_output=True, text=True, check=True
    ).stdout
    entries = {}
    for line in out.splitlines()[1:]:
        if "=>" in line:
            entries[line.split()[0]] = line.split("=>")[1].strip()
    return entries


def test_cold_install_produces_the_gke_layout(host: tuple[Path, str], served: Any) -> None:
    root, kernel = host
    before = tree_snapshot(root)
    ok(run_installer(env_for(host, served), "run"))
    after = tree_snapshot(root)
    machine = testinfra.get_host("local://")
    inst = install_dir(root)

    assert machine.file(str(inst / "current")).linked_to == str(inst / "versions" / A)
    assert machine.file(str(inst / "bin")).is_symlink
    smi = machine.file(str(inst / "bin/nvidia-smi"))
    assert smi.is_file and smi.mode & 0o111
    assert machine.file(str(inst / "bin/nvidia-modprobe")).mode & 0o4000
    for lib in ("libnvidia-ml.so.1", "libcuda.so.1"):
        assert machine.file(str(inst / "lib64" / lib)).linked_to == str(
            inst / "versions" / A / "lib64" / f"{lib[:-2]}.{A}"
        )
    drivers = inst / "drivers"
    assert sorted(p.name for p in drivers.glob("*.ko")) == [
        "nvidia-modeset.ko",
        "nvidia-uvm.ko",
        "nvidia.ko",
    ]
    # GSP firmware from the extracted tree, whichever nvidia-installer pass writes it (the
    # kit's module pass, into the installer's own /lib/firmware, a tmpfs here): on the host.
    for name in ("gsp_ga10x.bin", "gsp_tu10x.bin"):
        assert (inst / "versions" / A / "firmware" / name).is_file()
        host_fw = machine.file(str(root / "lib/firmware/nvidia" / A / name))
        assert host_fw.is_file and host_fw.mode == 0o644
        assert host_fw.content == (inst / "versions" / A / "firmware" / name).read_bytes()

    host_modules = root / "lib/modules" / kernel / "updates/nvidia-driver-installer"
    assert (host_modules / "nvidia.ko").is_file()
    depmod = (root / "lib/modules" / kernel / "modules.dep").read_text()
    assert (
        "updates/nvidia-driver-installer/nvidia-uvm.ko: "
        "updates/nvidia-driver-installer/nvidia.ko" in depmod
    )

    drop_in = machine.file(str(root / "etc/ld.so.conf.d/nvidia-driver-installer.conf"))
    assert drop_in.content_string == f"{INSTALL_DIR_HOST}/lib64\n"
    cached = cached_sonames(root)
    assert cached["libnvidia-ml.so.1"] == f"{INSTALL_DIR_HOST}/lib64/libnvidia-ml.so.1"
    assert cached["libcuda.so.1"] == f"{INSTALL_DIR_HOST}/lib64/libcuda.so.1"

    record = json.loads((inst / "state.json").read_text())
    assert (record["version"], record["flavour"], record["kernel"]) == (A, "open", kernel)
    assert (inst / ".cache").read_text() == (
        f"CACHE_KERNEL_VERSION={kernel}\nCACHE_NVIDIA_DRIVER_VERSION={A}\n"
    )
    # The run's outcome (what `installer metrics` reads): compiled, each applied step timed.
    last = json.loads((inst / "last-run.json").read_text())
    assert (last["outcome"], last["error"], last["modules"]) == ("success", "", "compiled")
    assert (last["version"], last["kernel"], last["source"]) == (A, kernel, "runfile")
    assert {"fetch-runfile", "build-modules", "activate-install"} <= set(
        last["phases"])
    assert last["failures"] == {}
    # Nothing outside the install dir but the drop-in, the ld cache, modules and firmware.
    touched = {
        path
        for path, info in after.items()
        if not stat.S_ISDIR(info[0])
        and before.get(path) != info
        and not path.startswith(INSTALL_DIR_HOST[1:])
    }
    allowed = (
        "etc/ld.so.cache",
        "etc/ld.so.conf.d/",
        f"lib/modules/{kernel}/",
        f"lib/firmware/nvidia/{A}/",
    )
    assert all(t.startswith(allowed) for t in touched), sorted(touched)


def test_warm_rerun_touches_nothing_and_downloads_nothing(
    host: tuple[Path, str], served: Any, installed: dict[str, str]
) -> None:
    root, _ = host
    env = installed
    before = tree_snapshot(root)
    served[2].clear()
    result = ok(run_installer(env, "run"))
    after = tree_snapshot(root)
    lock = str(install_dir(root).relative_to(root) / ".installer.lock")
    before.pop(lock)
    after.pop(lock)
    assert after == before
    assert served[2] == []
    assert "every step was already satisfied" in result.stderr
    assert "step build-modules: already satisfied" in result.stderr


def test_plan_changes_nothing(host: tuple[Path, str], served: Any) -> None:
    root, kernel = host
    env = env_for(host, served)
    before = tree_snapshot(root)
    result = ok(run_installer(env, "plan"))
    assert tree_snapshot(root) == before
    assert f"version: {A}" in result.stdout
    assert "build-modules          would run" in result.stdout
    assert f"building ahead for {kernel}" in result.stdout


def test_kernel_change_builds_once_and_going_back_reuses(tmp_path: Path, served: Any) -> None:
    root = tmp_path / "host"
    other = "6.1.0-99-cloud-amd64"
    kernel = make_debian_host(root, extra_kernels=[other])
    env = env_for((root, kernel), served)
    ok(run_installer(env, "run"))
    second = ok(run_installer({**env, "NVIDIA_KERNEL_RELEASE": other}, "run"))
    assert "step build-modules: compile" in second.stderr
    back = ok(run_installer(env, "run"))
    assert "step build-modules: already satisfied" in back.stderr
    inst = install_dir(root)
    assert os.readlink(inst / "drivers") == f"cache/modules/{A}/{kernel}/open"
    assert (root / "lib/modules" / other / "updates/nvidia-driver-installer/nvidia.ko").is_file()
    record = json.loads((inst / "state.json").read_text())
    assert sorted(record["kernels"]) == sorted([kernel, other])


def test_version_change_switches_everything_to_the_new_version(
    host: tuple[Path, str], served: Any
) -> None:
    root, _ = host
    ok(run_installer(env_for(host, served, A), "run"))
    ok(run_installer(env_for(host, served, B), "run"))
    inst = install_dir(root)
    assert os.readlink(inst / "current") == f"versions/{B}"
    assert os.readlink(inst / "lib64/libnvidia-ml.so.1") == f"libnvidia-ml.so.{B}"
    expected = f"{INSTALL_DIR_HOST}/lib64/libnvidia-ml.so.1"
    assert cached_sonames(root)["libnvidia-ml.so.1"] == expected
    assert f"CACHE_NVIDIA_DRIVER_VERSION={B}" in (inst / ".cache").read_text()
    assert (root / "etc/ld.so.conf.d/nvidia-driver-installer.conf").read_text().count("\n") == 1
    assert [p.name for p in (inst / "versions").iterdir()] == [B]
    assert [p.name for p in (inst / "cache/modules").iterdir()] == [B]
    assert sorted(p.name for p in (inst / "cache/downloads").iterdir()) == [
        f"NVIDIA-Linux-x86_64-{B}.run", f"NVIDIA-Linux-x86_64-{B}.run.download.json"]
    assert not (inst / "cache/extracted").exists() or not any((inst / "cache/extracted").iterdir())


KILL_POINTS = [
    "fetch-runfile",
    "extract-runfile",
    "build-modules",
    "install-userspace",
    "activate-install",
    "install-module-files",
    "configure-ld-cache",
    "record-install",
]


@pytest.mark.parametrize("step", KILL_POINTS)
def test_sigkill_during_an_upgrade_leaves_a_whole_install_and_the_next_run_finishes(
    host: tuple[Path, str], served: Any, step: str
) -> None:
    root, _ = host
    ok(run_installer(env_for(host, served, A), "run"))
    log = run_and_kill_at(env_for(host, served, B), f"step {step}: ")
    assert f"step {step}: " in log
    inst = install_dir(root)
    active = os.readlink(inst / "current").split("/")[-1]
    assert active in (A, B)
    assert (inst / "versions" / active / ".complete").is_file()
    assert (inst / "bin/nvidia-smi").is_file()
    assert os.readlink(inst / "lib64/libnvidia-ml.so.1") == f"libnvidia-ml.so.{active}"
    ok(run_installer(env_for(host, served, B), "run"))
    assert os.readlink(inst / "current") == f"versions/{B}"
    assert json.loads((inst / "state.json").read_text())["version"] == B
    assert not list(inst.rglob(".*.tmp"))


def test_a_run_of_another_version_changes_nothing_and_is_dropped_from_the_cache(
    host: tuple[Path, str], served: Any
) -> None:
    """A DaemonSet that bumps the version but not the URL: the .run it fetches is not the
    version asked for."""
    root, _ = host
    base, _, _ = served
    ok(run_installer(env_for(host, served, A), "run"))
    inst = install_dir(root)
    # What a killed compile leaves in the scratch dir: the next build must not keep it.
    leftover = inst / "cache/tmp/nvidia-installer-build.Zx81Qa/kernel-open"
    leftover.mkdir(parents=True)
    (leftover / "nv-main.o").write_bytes(b"\x7fELF")
    before = tree_snapshot(root)
    a_run = served[1] / A / f"NVIDIA-Linux-x86_64-{A}.run"
    # Vouched for by the operator's pin, yet another version: its header says so.
    wrong = env_for(host, served, B, NVIDIA_DRIVER_DOWNLOAD_URL=f"{base}/{A}/{a_run.name}",
                    NVIDIA_DRIVER_SHA256=hashlib.sha256(a_run.read_bytes()).hexdigest())
    for _ in range(2):  # the file is dropped each time: no cached marker makes it stick
        result = run_installer(wrong, "run")
        assert result.returncode == 25, result.stderr
        assert "error[runfile-mismatch]" in result.stderr
        assert f"NVIDIA-Linux-x86_64-{B}.run is not the x86_64 driver {B}" in result.stderr
        assert f"its label names version {A}" in result.stderr
        assert "step build-modules" not in result.stderr
    after = tree_snapshot(root)
    cache = str((inst / "cache").relative_to(root))
    changed = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
    # Besides the cache and the lock, only the runs' outcome record (a report, not the install)
    # and so the install dir's own entry.
    assert all(p.startswith(cache) or p.endswith((".installer.lock", "/last-run.json"))
               or p == str(inst.relative_to(root)) for p in changed), changed
    last = json.loads((inst / "last-run.json").read_text())
    assert (last["error"], last["failures"]) == ("runfile-mismatch", {"runfile-mismatch": 2})
    assert not list((inst / "cache/downloads").glob(f"*{B}*"))
    assert not (inst / "cache/extracted" / B).exists()
    assert os.readlink(inst / "current") == f"versions/{A}"

    ok(run_installer(env_for(host, served, B), "run"))
    assert os.readlink(inst / "current") == f"versions/{B}"
    assert (root / "lib/firmware/nvidia" / B / "gsp_ga10x.bin").is_file()
    assert not (inst / "cache/tmp").exists()


def test_missing_headers_name_the_package_and_kernel(tmp_path: Path, served: Any) -> None:
    root = tmp_path / "host"
    kernel = make_debian_host(root, headers=False)
    result = run_installer(env_for((root, kernel), served), "run")
    assert result.returncode == 30, result.stderr
    assert "error[kernel-headers-missing]" in result.stderr
    assert f"linux-headers-{kernel}" in result.stderr
    assert not (install_dir(root) / "current").exists()


def test_compile_failure_shows_the_compilers_last_lines(
    host: tuple[Path, str], served: Any
) -> None:
    root, _ = host
    base, _, _ = served
    env = env_for(
        host,
        served,
        "570.195.03",
        NVIDIA_DRIVER_DOWNLOAD_URL=(f"{base}/broken/NVIDIA-Linux-x86_64-570.195.03.run"),
    )
    result = run_installer(env, "run")
    assert result.returncode == 31, result.stderr
    assert "error[module-build-failed]" in result.stderr
    message = result.stderr.split("error[module-build-failed]")[1]
    # gcc's own lines, quoted before the log's tail (make -k buries them in the log)
    said = message.split("the compiler said:\n")[1].split("; last lines of")[0]
    assert re.search(r"\.c:\d+:\d+: error: .*nvfake_injected_compile_error|"
                     r"\.c:\d+:\d+: error: expected expression", said), said
    assert not (install_dir(root) / "cache/modules/570.195.03").exists() or not any(
        (install_dir(root) / "cache/modules/570.195.03").rglob("*.ko")
    )
    assert not (install_dir(root) / "current").exists()
    last = json.loads((install_dir(root) / "last-run.json").read_text())
    assert (last["outcome"], last["error"], last["failed_step"]) == (
        "failure", "module-build-failed", "build-modules")
    assert last["failures"] == {"module-build-failed": 1}


def test_secure_boot_without_keys_fails_before_any_download(tmp_path: Path, served: Any) -> None:
    root = tmp_path / "host"
    kernel = make_debian_host(root, secure_boot=True)
    served[2].clear()
    result = run_installer(env_for((root, kernel), served), "run")
    assert result.returncode == 32, result.stderr
    assert "error[secure-boot-unsigned]" in result.stderr
    assert "NVIDIA_MODULE_SIGNING_KEY" in result.stderr
    assert served[2] == []


def test_secure_boot_with_keys_signs_the_modules(tmp_path: Path, served: Any) -> None:
    root = tmp_path / "host"
    kernel = make_debian_host(root, secure_boot=True)
    kit.make_signing_key(root / "etc/mok")
    env = env_for(
        (root, kernel),
        served,
        NVIDIA_MODULE_SIGNING_KEY="/etc/mok/signing.key",
        NVIDIA_MODULE_SIGNING_CERT="/etc/mok/signing.der",
    )
    ok(run_installer(env, "run"))
    module = (install_dir(root) / "drivers/nvidia.ko").read_bytes()
    assert module.endswith(b"~Module signature appended~\n")


def test_read_only_lib_modules_falls_back_without_failing(tmp_path: Path, served: Any) -> None:
    root = tmp_path / "host"
    kernel = make_debian_host(root)
    modules_dir = root / "lib/modules" / kernel
    env = env_for((root, kernel), served)
    from lib.hostkit import hidden_headers_argv, installer_argv, private_mounts_argv

    read_only = [f"mount --bind {modules_dir} {modules_dir}",
                 f"mount -o remount,ro,bind {modules_dir}"]
    result = subprocess.run(
        private_mounts_argv(read_only, hidden_headers_argv(installer_argv("run"))),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    ok(result)
    assert not (modules_dir / "updates").exists()
    assert (install_dir(root) / "drivers/nvidia.ko").is_file()


def test_concurrent_runs_wait_for_each_other_and_build_once(
    host: tuple[Path, str], served: Any
) -> None:
    from lib.hostkit import hidden_headers_argv, installer_argv

    env = env_for(host, served)
    procs = [
        subprocess.Popen(
            hidden_headers_argv(installer_argv("run")),
            env=env,
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        for _ in range(2)
    ]
    logs = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs
    assert sum("step build-modules: compile" in log for log in logs) == 1
    assert any("waiting for another installer" in log for log in logs)


def test_gkes_old_layout_is_adopted(host: tuple[Path, str], served: Any) -> None:
    root, kernel = host
    inst = install_dir(root)
    (inst / "bin").mkdir(parents=True)
    (inst / "bin/nvidia-smi").write_text("old")
    (inst / "lib64").mkdir()
    (inst / "lib64/libcuda.so.1").write_text("old")
    (inst / "drivers").mkdir()
    (inst / "current").write_text("a file where a link belongs")
    (inst / ".cache").write_text(
        f"CACHE_KERNEL_VERSION={kernel}\nCACHE_NVIDIA_DRIVER_VERSION=460.56\n"
    )
    conf = root / "etc/ld.so.conf"
    conf.write_text(conf.read_text() + f"{INSTALL_DIR_HOST}/lib64\n{INSTALL_DIR_HOST}/lib64\n")
    ok(run_installer(env_for(host, served), "run"))
    assert (inst / "bin").is_symlink()
    kept = list((inst / "previous-layout").glob("*/bin/nvidia-smi"))
    assert len(kept) == 1 and kept[0].read_text() == "old"
    assert os.readlink(inst / "current") == f"versions/{A}"
    assert f"{INSTALL_DIR_HOST}/lib64" not in conf.read_text()
    assert f"CACHE_NVIDIA_DRIVER_VERSION={A}" in (inst / ".cache").read_text()


def test_no_gpu_fails_unless_told_to_install_ahead(tmp_path: Path, served: Any) -> None:
    root = tmp_path / "host"
    kernel = make_debian_host(root, gpus=())
    env = env_for((root, kernel), served)
    result = run_installer(env, "run")
    assert result.returncode == 16, result.stderr
    assert "error[no-nvidia-gpu]" in result.stderr
    plan = ok(run_installer(env, "plan"))
    assert "gpu: none found" in plan.stdout
    ok(run_installer({**env, "NVIDIA_INSTALLER_ALLOW_NO_GPU": "true"}, "run"))
    assert (install_dir(root) / "bin/nvidia-smi").is_file()


def test_uninstall_removes_only_what_the_installer_put_down(
    host: tuple[Path, str], installed: dict[str, str]
) -> None:
    root, kernel = host
    inst = install_dir(root)
    (inst / "operator-notes.txt").write_text("keep me")
    result = ok(run_installer(installed, "uninstall"))
    assert "removed /etc/ld.so.conf.d/nvidia-driver-installer.conf" in result.stdout
    assert not (root / "etc/ld.so.conf.d/nvidia-driver-installer.conf").exists()
    assert not (root / "lib/modules" / kernel / "updates/nvidia-driver-installer").exists()
    assert not (root / "lib/firmware/nvidia" / A).exists()
    assert "libnvidia-ml.so.1" not in cached_sonames(root)
    assert sorted(p.name for p in inst.iterdir()) == [".installer.lock", "operator-notes.txt"]
    assert (root / "etc/os-release").is_file()


@pytest.mark.parametrize(
    ("value", "code", "reference"),
    [
        ("550; rm -rf /", 11, "invalid-version"),
        ("../../x", 11, "invalid-version"),
        ("newest", 11, "invalid-version"),
        ("R999", 12, "unknown-version"),
    ],
)
def test_bad_versions_fail_with_their_reference(
    host: tuple[Path, str], served: Any, value: str, code: int, reference: str
) -> None:
    result = run_installer(env_for(host, served, value), "run")
    assert result.returncode == code, result.stderr
    assert f"error[{reference}]" in result.stderr
    assert "hint: " in result.stderr


def test_unreachable_catalog_is_its_own_error(host: tuple[Path, str], served: Any) -> None:
    env = env_for(
        host,
        served,
        NVIDIA_DRIVER_CATALOG="http://127.0.0.1:9/releases.json",
        NVIDIA_INSTALLER_CONNECT_TIMEOUT="1",
    )
    result = run_installer(env, "plan")
    assert result.returncode == 13, result.stderr
    assert "error[catalog-unavailable]" in result.stderr


def test_an_older_installers_extracted_tree_is_extracted_anew(
    host: tuple[Path, str], served: Any
) -> None:
    """An older installer took a .run on a mirror's own checksum; the tree it extracted is
    marked with the version alone. It is not built from: the .run is fetched on the current
    rules and extracted again over it."""
    root, _ = host
    planted = install_dir(root) / "cache/extracted" / A
    planted.mkdir(parents=True)
    pwned = root / "pwned"
    (planted / "nvidia-installer").write_text(f"#!/bin/sh\ntouch {pwned}\nexit 1\n")
    (planted / "nvidia-installer").chmod(0o755)
    (planted / f"libnvidia-ml.so.{A}").write_bytes(b"")
    (planted / ".extracted").write_text(f"{A}\n")
    served[2].clear()
    result = ok(run_installer(env_for(host, served), "run"))
    assert not pwned.exists()
    assert any(r.endswith(f"NVIDIA-Linux-x86_64-{A}.run") for r in served[2])
    assert "step extract-runfile: done" in result.stderr
