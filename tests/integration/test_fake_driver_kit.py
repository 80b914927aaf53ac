"""The fake-driver kit acts like NVIDIA's .run, installer, nvidia-smi, NVML and nvidia-modprobe."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import kit
import pytest
from kit import fake_host, sandbox
from kit.fake_host import FakeGpu
from lib.hostkit import debian_headers

VERSION = "550.54.15"
# The kit compiles against whichever Debian headers install-deps put in /usr/src (the ABI that
# linux-headers-amd64 depends on that day), never a release named here.
_FOUND = debian_headers()
HEADERS_KERNEL = _FOUND[0] if _FOUND else "6.1.0-56-amd64"
HEADERS = Path(f"/usr/src/linux-headers-{HEADERS_KERNEL}")
COMMON = Path(f"/usr/src/linux-headers-{HEADERS_KERNEL.removesuffix('-amd64')}-common")
H100 = FakeGpu("0000:3b:00.0", 0x2330, "NVIDIA H100 80GB HBM3")
V100 = FakeGpu("0000:86:00.0", 0x1DB6, "Tesla V100-PCIE-32GB", minor=1)
B200 = FakeGpu("0000:17:00.0", 0x2901, "NVIDIA B200")
LIBRARIES = (
    "libnvidia-ml",
    "libcuda",
    "libnvidia-ptxjitcompiler",
    "libnvidia-nvvm",
    "libnvidia-cfg",
)
TOOLS = (
    "nvidia-smi",
    "nvidia-modprobe",
    "nvidia-persistenced",
    "nvidia-debugdump",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)

needs_headers = pytest.mark.skipif(not HEADERS.is_dir(), reason="needs Debian's linux-headers")
needs_sandbox = pytest.mark.skipif(not sandbox.available(), reason="needs mount namespaces")


def run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=300, **kwargs)  # type: ignore[call-overload]


@pytest.fixture(scope="session")
def runfile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return kit.build_runfile(VERSION, tmp_path_factory.mktemp("runfile"))


@pytest.fixture(scope="session")
def payload(runfile: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("extracted") / "pkg"
    assert run([str(runfile), "-x", "--target", str(target)]).returncode == 0
    return target


@pytest.fixture
def stubs(tmp_path: Path) -> Path:
    """depmod/ldconfig/modprobe stand-ins first in PATH; each appends its argv to stubs/calls."""
    directory = tmp_path / "stubs"
    directory.mkdir()
    for tool in ("depmod", "ldconfig", "modprobe"):
        script = directory / tool
        script.write_text(f'#!/bin/sh\necho "{tool} $*" >> {directory}/calls\n')
        script.chmod(0o755)
    return directory


def calls(stubs: Path) -> list[str]:
    path = stubs / "calls"
    return path.read_text().splitlines() if path.exists() else []


def env_with(stubs: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", **extra}


def prefix_flags(root: Path) -> list[str]:
    return [
        f"--utility-prefix={root}/usr",
        f"--opengl-prefix={root}/usr",
        f"--documentation-prefix={root}/usr",
        f"--kernel-install-path={root}/modules",
        f"--override-file-type-destination=FIRMWARE:{root}/firmware",
        f"--log-file-name={root}/log/nvidia-installer.log",
    ]


def header_flags() -> list[str]:
    """Debian's split headers: -common is the source path, -amd64 the output path."""
    return [f"--kernel-name={HEADERS_KERNEL}", f"--kernel-source-path={COMMON}",
            f"--kernel-output-path={HEADERS}", "-j2"]


def soname(path: Path) -> str:
    dynamic = run(["readelf", "-d", str(path)]).stdout
    return dynamic.split("Library soname: [")[1].split("]")[0]


# --- the .run archive -------------------------------------------------------------------------


def test_sha256sum_file_names_the_archive(runfile: Path) -> None:
    import hashlib

    text = Path(f"{runfile}.sha256sum").read_text()
    assert text == f"{hashlib.sha256(runfile.read_bytes()).hexdigest()}  {runfile.name}\n"


def test_check_passes_then_fails_after_corruption(runfile: Path, tmp_path: Path) -> None:
    assert run([str(runfile), "--check"]).returncode == 0
    corrupted = tmp_path / runfile.name
    shutil.copy2(runfile, corrupted)
    data = bytearray(corrupted.read_bytes())
    data[-100] ^= 0xFF
    corrupted.write_bytes(bytes(data))
    result = run([str(corrupted), "--check"])
    assert result.returncode == 2
    assert "MD5" in result.stderr


def test_info_and_version_string(runfile: Path) -> None:
    info = run([str(runfile), "--info"])
    assert info.returncode == 0
    assert f"Target directory: NVIDIA-Linux-x86_64-{VERSION}" in info.stdout
    assert "./nvidia-installer" in info.stdout
    assert run([str(runfile), "--version-string"]).stdout == f"{VERSION}\n"


def test_extract_only_yields_nvidia_layout(payload: Path) -> None:
    for name in (*TOOLS, "nvidia-installer"):
        assert os.access(payload / name, os.X_OK), name
    assert (payload / "nvidia-installer").read_text().startswith("#!/usr/bin/env python3\n")
    for directory in ("kernel", "kernel-open"):
        assert (payload / directory / "Kbuild").is_file()
    assert (payload / "firmware/gsp_ga10x.bin").is_file()
    assert (payload / "firmware/gsp_tu10x.bin").is_file()
    assert (payload / "supported-gpus/supported-gpus.json").is_file()
    assert (payload / "LICENSE").is_file()
    assert soname(payload / f"libnvidia-ml.so.{VERSION}") == "libnvidia-ml.so.1"
    assert soname(payload / f"libcuda.so.{VERSION}") == "libcuda.so.1"
    exported = run(["nm", "-D", "--defined-only", str(payload / f"libcuda.so.{VERSION}")]).stdout
    assert " T cuInit" in exported and " T cuDriverGetVersion" in exported


def test_extract_default_target_is_in_cwd_and_existing_target_is_refused(
    runfile: Path, tmp_path: Path
) -> None:
    assert run([str(runfile), "--extract-only"], cwd=tmp_path).returncode == 0
    assert (tmp_path / f"NVIDIA-Linux-x86_64-{VERSION}/nvidia-installer").is_file()
    (tmp_path / "taken").mkdir()
    refused = run([str(runfile), "-x", "--target", str(tmp_path / "taken")])
    assert refused.returncode != 0
    assert "already exists" in refused.stderr
    assert list((tmp_path / "taken").iterdir()) == []


def test_unknown_option_reaches_the_installer_and_is_rejected(runfile: Path) -> None:
    result = run([str(runfile), "--silent", "--no-such-option"])
    assert result.returncode == 1
    assert 'ERROR: Unrecognized option: "--no-such-option"' in result.stderr


def test_other_arguments_are_forwarded_to_the_installer(runfile: Path, tmp_path: Path) -> None:
    result = run([str(runfile), "--tmpdir", str(tmp_path), "-v"])
    assert result.returncode == 0
    assert f"nvidia-installer:  version {VERSION}" in result.stdout


# --- nvidia-installer -------------------------------------------------------------------------


@needs_headers
def test_install_with_prefix_flags_stays_in_the_prefix(
    payload: Path, stubs: Path, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    argv = [str(payload / "nvidia-installer"), "-s", *header_flags(), *prefix_flags(root)]
    result = run(argv, env=env_with(stubs))
    assert result.returncode == 0, result.stderr
    libdir = root / "usr/lib/x86_64-linux-gnu"
    for library in LIBRARIES:
        assert (libdir / f"{library}.so.{VERSION}").is_file()
    assert not list(libdir.glob("*.so.1")), "soname links are ldconfig's job"
    for tool in TOOLS:
        assert (root / "usr/bin" / tool).is_file()
    assert stat.S_IMODE((root / "usr/bin/nvidia-modprobe").stat().st_mode) == 0o4755
    assert (root / "firmware/gsp_ga10x.bin").is_file()
    assert (root / "usr/share/doc/NVIDIA_GLX-1.0/supported-gpus/supported-gpus.json").is_file()
    built = sorted(path.name for path in (root / "modules").iterdir())
    assert built == ["nvidia-drm.ko", "nvidia-modeset.ko", "nvidia-uvm.ko", "nvidia.ko"]
    assert calls(stubs) == [f"depmod -a {HEADERS_KERNEL}", "ldconfig "]
    assert "No NVIDIA GPU was detected" in result.stderr

    uninstall = run(
        [
            str(payload / "nvidia-installer"),
            "-s",
            "--uninstall",
            *header_flags(),
            *prefix_flags(root),
        ],
        env=env_with(stubs),
    )
    assert uninstall.returncode == 0, uninstall.stderr
    assert not (root / "modules/nvidia.ko").exists()
    assert not (libdir / f"libnvidia-ml.so.{VERSION}").exists()


@needs_headers
@needs_sandbox
def test_without_prefix_flags_it_writes_to_usr(runfile: Path, stubs: Path, tmp_path: Path) -> None:
    devices = tmp_path / "pci"
    fake_host.write_pci_gpu(devices, H100)
    (stubs / "ldconfig").unlink()  # the real ldconfig, inside the overlaid /etc and /usr
    result = sandbox.run(
        [str(runfile), "-s", f"-k{HEADERS_KERNEL}", f"--tmpdir={tmp_path}"],
        work=tmp_path / "sandbox",
        overlays=["/usr", "/etc", "/var/log"],
        binds={"/sys/bus/pci/devices": devices},
        env=env_with(stubs),
    )
    assert result.returncode == 0, result.stderr
    usr = sandbox.upper_dir(tmp_path / "sandbox", "/usr")
    assert (usr / "bin/nvidia-smi").is_file()
    assert (usr / f"lib/x86_64-linux-gnu/libnvidia-ml.so.{VERSION}").is_file()
    assert (
        os.readlink(usr / "lib/x86_64-linux-gnu/libnvidia-ml.so.1") == f"libnvidia-ml.so.{VERSION}"
    )
    assert (usr / f"lib/firmware/nvidia/{VERSION}/gsp_tu10x.bin").is_file()
    assert (usr / f"lib/modules/{HEADERS_KERNEL}/kernel/drivers/video/nvidia.ko").is_file()
    assert (usr / "share/doc/NVIDIA_GLX-1.0/LICENSE").is_file()
    assert (sandbox.upper_dir(tmp_path / "sandbox", "/var/log") / "nvidia-installer.log").is_file()
    assert calls(stubs) == [f"depmod -a {HEADERS_KERNEL}", "modprobe nvidia"]
    assert not Path(f"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{VERSION}").exists()


def test_missing_kernel_source_tree_fails_like_nvidia(
    payload: Path, stubs: Path, tmp_path: Path
) -> None:
    argv = [
        str(payload / "nvidia-installer"),
        "-s",
        "-k",
        "0.0.0-no-such-kernel",
        *prefix_flags(tmp_path),
    ]
    result = run(argv, env=env_with(stubs))
    assert result.returncode == 1
    assert (
        "ERROR: Unable to find the kernel source tree for the currently running kernel."
        in result.stderr
    )
    assert calls(stubs) == []


@needs_headers
def test_compile_error_fails_with_compiler_output_in_log(stubs: Path, tmp_path: Path) -> None:
    broken = kit.build_runfile(VERSION, tmp_path / "broken", compile_error=True)
    argv = [str(broken), "-s", *header_flags(), *prefix_flags(tmp_path / "root")]
    result = run(argv, env=env_with(stubs))
    assert result.returncode != 0
    assert 'An error occurred while performing the step: "Building kernel modules"' in result.stderr
    log = (tmp_path / "root/log/nvidia-installer.log").read_text()
    assert "nvfake_injected_compile_error" in log and "error:" in log
    assert not (tmp_path / "root/modules").exists()


@needs_headers
def test_modules_are_signed_with_the_given_keys(payload: Path, stubs: Path, tmp_path: Path) -> None:
    key, cert = kit.make_signing_key(tmp_path)
    base = [
        str(payload / "nvidia-installer"),
        "-s",
        "-K",
        "--skip-depmod",
        *header_flags(),
        *prefix_flags(tmp_path / "root"),
    ]
    half = run([*base, f"--module-signing-secret-key={key}"], env=env_with(stubs))
    assert half.returncode == 1 and "both" in half.stderr
    signed = run(
        [
            *base,
            f"--module-signing-secret-key={key}",
            f"--module-signing-public-key={cert}",
            "--module-signing-hash=sha512",
        ],
        env=env_with(stubs),
    )
    assert signed.returncode == 0, signed.stderr
    for module in (tmp_path / "root/modules").iterdir():
        assert module.read_bytes().endswith(b"~Module signature appended~\n"), module
    assert run(
        ["modinfo", "-F", "signer", str(tmp_path / "root/modules/nvidia.ko")]
    ).stdout.strip() == ("installer test signing key")
    assert not (tmp_path / "root/usr/bin").exists(), "-K installs kernel modules only"


@needs_sandbox
def test_nouveau_in_proc_modules_stops_the_install(
    payload: Path, stubs: Path, tmp_path: Path
) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "modules").write_text("nouveau 2404352 0 - Live 0x0000000000000000\n")
    argv = [str(payload / "nvidia-installer"), "-s", *prefix_flags(tmp_path / "root")]
    result = sandbox.run(
        argv, work=tmp_path / "sandbox", binds={"/proc": proc}, env=env_with(stubs)
    )
    assert result.returncode == 1
    assert "ERROR: The Nouveau kernel driver is currently in use by your system." in result.stderr


def test_nouveau_detection_parses_proc_modules(payload: Path) -> None:
    sys.path.insert(0, str(payload))
    try:
        from nvidia_installer.errors import InstallerError
        from nvidia_installer.modules import check_nouveau
    finally:
        sys.path.remove(str(payload))
    check_nouveau("nvidia 56799232 2 nvidia_uvm,nvidia_modeset, Live 0x0 (POE)\n")
    with pytest.raises(InstallerError, match="Nouveau"):
        check_nouveau("drm 1 2 nouveau, Live 0x0\nnouveau 2404352 0 - Live 0x0\n")


@needs_sandbox
@pytest.mark.parametrize(
    ("version", "gpus", "expected"),
    [
        ("550.54.15", [H100], "proprietary"),
        ("580.95.05", [H100], "open"),
        ("550.54.15", [V100], "proprietary"),
        ("580.95.05", [B200], "open"),
        ("580.95.05", [V100, B200], None),
    ],
)
def test_print_recommended_kernel_module_type(
    version: str, gpus: list[FakeGpu], expected: str | None, tmp_path: Path
) -> None:
    devices = tmp_path / "pci"
    devices.mkdir()
    for gpu in gpus:
        fake_host.write_pci_gpu(devices, gpu)
    runfile = kit.build_runfile(version, tmp_path / "run")
    result = sandbox.run(
        [str(runfile), "--print-recommended-kernel-module-type", f"--log-file-name={tmp_path}/log"],
        work=tmp_path / "sandbox",
        binds={"/sys/bus/pci/devices": devices},
    )
    if expected is None:
        assert result.returncode == 1
        assert "different kernel module types" in result.stderr
    else:
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines()[-1] == expected


# --- nvidia-smi and libnvidia-ml.so.1 ---------------------------------------------------------


@pytest.fixture(scope="session")
def libdir(payload: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The payload's libraries with the soname links `ldconfig -n` makes."""
    directory = tmp_path_factory.mktemp("libs")
    for library in LIBRARIES:
        shutil.copy2(payload / f"{library}.so.{VERSION}", directory)
    subprocess.run(["ldconfig", "-n", str(directory)], check=True)
    return directory


def nvml_env(libdir: Path, root: Path) -> dict[str, str]:
    return {**os.environ, "LD_LIBRARY_PATH": str(libdir), fake_host.TEST_ROOT_ENV: str(root)}


def test_nvidia_smi_without_driver_exits_9(payload: Path, libdir: Path, tmp_path: Path) -> None:
    result = run([str(payload / "nvidia-smi")], env=nvml_env(libdir, tmp_path))
    assert result.returncode == 9
    assert (
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"
        in result.stdout
    )


def test_nvidia_smi_answers_from_kernel_state(payload: Path, libdir: Path, tmp_path: Path) -> None:
    fake_host.write_loaded_driver(tmp_path, VERSION, [H100, V100])
    env = nvml_env(libdir, tmp_path)
    smi = str(payload / "nvidia-smi")
    query = "--query-gpu=driver_version,name,uuid,pci.bus_id,memory.total"
    result = run([smi, query, "--format=csv,noheader"], env=env)
    assert result.returncode == 0, result.stderr
    h100, v100 = fake_host.gpu_uuid(H100), fake_host.gpu_uuid(V100)
    assert result.stdout.splitlines() == [
        f"{VERSION}, NVIDIA H100 80GB HBM3, {h100}, 00000000:3B:00.0, 81559 MiB",
        f"{VERSION}, Tesla V100-PCIE-32GB, {v100}, 00000000:86:00.0, 32768 MiB",
    ]
    nounits = run([smi, query, "--format=csv,noheader,nounits"], env=env).stdout
    assert nounits.splitlines()[0].endswith(", 81559")
    assert f"Driver Version: {VERSION}" in run([smi], env=env).stdout
    assert run([smi, "-L"], env=env).stdout.startswith("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-")
    unknown = run([smi, "--query-gpu=name,bogus", "--format=csv"], env=env)
    assert unknown.returncode != 0 and '"bogus" is not a valid field' in unknown.stderr


def test_nvidia_smi_reports_a_module_of_another_version(
    payload: Path, libdir: Path, tmp_path: Path
) -> None:
    fake_host.write_loaded_driver(tmp_path, "535.183.01", [H100])
    result = run([str(payload / "nvidia-smi")], env=nvml_env(libdir, tmp_path))
    assert result.returncode == 18
    assert "Failed to initialize NVML: Driver/library version mismatch" in result.stdout


PYNVML_PROBE = """
import pynvml
try:
    pynvml.nvmlInit()
except pynvml.NVMLError_DriverNotLoaded:
    print("DriverNotLoaded")
    raise SystemExit
handle = pynvml.nvmlDeviceGetHandleByIndex(0)
print(pynvml.nvmlSystemGetDriverVersion(), pynvml.nvmlDeviceGetCount(),
      pynvml.nvmlDeviceGetName(handle), pynvml.nvmlDeviceGetUUID(handle),
      pynvml.nvmlDeviceGetPciInfo(handle).busId, pynvml.nvmlDeviceGetMemoryInfo(handle).total,
      pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2).total,
      pynvml.nvmlDeviceGetMinorNumber(handle))
pynvml.nvmlShutdown()
"""


def test_real_pynvml_sees_no_driver_then_the_loaded_one(libdir: Path, tmp_path: Path) -> None:
    absent = run([sys.executable, "-c", PYNVML_PROBE], env=nvml_env(libdir, tmp_path))
    assert absent.stdout == "DriverNotLoaded\n", absent.stderr
    fake_host.write_loaded_driver(tmp_path, VERSION, [H100], open_flavour=False)
    loaded = run([sys.executable, "-c", PYNVML_PROBE], env=nvml_env(libdir, tmp_path))
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split() == [
        VERSION,
        "1",
        "NVIDIA",
        "H100",
        "80GB",
        "HBM3",
        fake_host.gpu_uuid(H100),
        "00000000:3B:00.0",
        str(81559 * 2**20),
        str(81559 * 2**20),
        "0",
    ]


# --- nvidia-modprobe --------------------------------------------------------------------------


@needs_sandbox
def test_nvidia_modprobe_loads_modules_and_makes_nodes(payload: Path, tmp_path: Path) -> None:
    proc, dev, devices = tmp_path / "proc", tmp_path / "dev", tmp_path / "pci"
    (proc / "sys/kernel").mkdir(parents=True)
    dev.mkdir()
    fake_host.write_pci_gpu(devices, H100)
    (proc / "modules").write_text("")
    (proc / "devices").write_text(
        "Character devices:\n195 nvidia\n508 nvidia-uvm\n\nBlock devices:\n  8 sd\n"
    )
    modprobe = tmp_path / "modprobe"
    modprobe.write_text(
        '#!/bin/sh\ncase "$1" in\nnvidia-uvm) name=nvidia_uvm ;;\n'
        'nvidia-modeset) name=nvidia_modeset ;;\n*) name="$1" ;;\nesac\n'
        'echo "$name 1000 0 - Live 0x0" >> /proc/modules\n'
    )
    modprobe.chmod(0o755)
    (proc / "sys/kernel/modprobe").write_text(f"{modprobe}\n")
    binds = {"/proc": proc, "/dev": dev, "/sys/bus/pci/devices": devices}
    tool = str(payload / "nvidia-modprobe")

    def nvidia_modprobe(*args: str) -> int:
        return sandbox.run([tool, *args], work=tmp_path / "sandbox", binds=binds).returncode

    assert nvidia_modprobe("-c", "0", "-c=255", "-m") == 0
    assert nvidia_modprobe("-u", "-c0") == 0
    nodes = {path.name: path.stat() for path in dev.iterdir()}
    expected = {
        "nvidia0": (195, 0),
        "nvidiactl": (195, 255),
        "nvidia-modeset": (195, 254),
        "nvidia-uvm": (508, 0),
        "nvidia-uvm-tools": (508, 1),
    }
    assert {
        name: (os.major(s.st_rdev), os.minor(s.st_rdev)) for name, s in nodes.items()
    } == expected
    assert all(stat.S_ISCHR(s.st_mode) and stat.S_IMODE(s.st_mode) == 0o666 for s in nodes.values())
    assert (proc / "modules").read_text().split("\n")[0].startswith("nvidia ")
    assert nvidia_modprobe("--bogus") == 1


@needs_sandbox
def test_nvidia_modprobe_without_gpu_fails_without_loading(payload: Path, tmp_path: Path) -> None:
    proc, devices = tmp_path / "proc", tmp_path / "pci"
    proc.mkdir()
    devices.mkdir()
    (proc / "modules").write_text("")
    result = sandbox.run(
        [str(payload / "nvidia-modprobe")],
        work=tmp_path / "sandbox",
        binds={"/proc": proc, "/sys/bus/pci/devices": devices},
    )
    assert result.returncode == 1
    assert (proc / "modules").read_text() == ""
