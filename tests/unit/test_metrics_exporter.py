"""Records on the node read as untrusted input: a malformed last-run.json, state.json,
readiness or restart file never crashes a command or a scrape. The exporter then answers every
scrape with ready 0 and `record_valid{record=...} 0` (so the alerts fire: an absent series never
would), and `installer status` reads the record as absent and names what is wrong."""

from __future__ import annotations

import json
import socket
import urllib.request
from pathlib import Path

import pytest
from kit.fake_host import FakeGpu, write_loaded_driver
from lib.cli import invoke
from lib.hosttrees import make_host, root_env

from installer import app, state
from installer.config import from_env
from installer.hostroot import HostRoot
from installer.layout import Layout
from installer.metrics import exporter, snapshot

VERSION, KERNEL = "580.105.08", "6.1.0-28-amd64"
INSTALL = "/var/lib/nvidia"
GPU = FakeGpu("0000:18:00.0", 0x2330, "NVIDIA H100 80GB HBM3", 0)
P = "nvidia_driver_installer"
GOOD_RUN = {"format": 1, "outcome": "success", "error": "", "failed_step": "",
            "version": VERSION, "phases": {"build-modules": 12.5}, "seconds": 14.0,
            "modules": "compiled", "failures": {"lock-timeout": 1}}
GOOD_RECORD = {"format": 1, "version": VERSION, "flavour": "open", "kernel": KERNEL,
               "source": "runfile", "install_dir": INSTALL, "kernels": [KERNEL]}

# (record label, file under the host root, content): each one broke every scrape (a 500, all
# series gone) or `installer status` (a traceback) before records were checked field by field.
CRAFTED = [
    ("last-run", "var/lib/nvidia/last-run.json",
     json.dumps({**GOOD_RUN, "phases": {"build-modules": "n/a"}})),
    ("last-run", "var/lib/nvidia/last-run.json", json.dumps({**GOOD_RUN, "seconds": "x"})),
    ("last-run", "var/lib/nvidia/last-run.json", json.dumps({**GOOD_RUN, "seconds": None})),
    ("state", "var/lib/nvidia/state.json", json.dumps({**GOOD_RECORD, "version": 5})),
    ("state", "var/lib/nvidia/state.json", json.dumps({**GOOD_RECORD, "source": 7})),
    ("state", "var/lib/nvidia/state.json", json.dumps([GOOD_RECORD])),
    ("fabricmanager-restarts", "run/nvidia-driver-installer/fabricmanager-restarts", "\u00b2\n"),
    ("fabricmanager-restarts", "run/nvidia-driver-installer/fabricmanager-restarts",
     "9" * 5000 + "\n"),
]


def node(root: Path) -> dict[str, str]:
    """A node whose driver the installer verified and which is loaded, with well-formed
    records; returns its settings."""
    make_host(root, distro="debian-12", kernel=KERNEL)
    write_loaded_driver(root, VERSION, [GPU])
    run = root / "run/nvidia-driver-installer"
    run.mkdir(parents=True)
    (run / "driver-ready").write_text(state.ready_text(VERSION, "open", INSTALL, KERNEL))
    install = root / INSTALL.lstrip("/")
    install.mkdir(parents=True)
    (install / "state.json").write_text(json.dumps(GOOD_RECORD))
    (install / "last-run.json").write_text(json.dumps(GOOD_RUN))
    return root_env(root, NVIDIA_INSTALL_DIR_HOST=INSTALL)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape(env: dict[str, str]) -> tuple[int, dict[str, float]]:
    """One scrape of the real exporter on 127.0.0.1: its status and its samples."""
    config = from_env(env)
    root = HostRoot(config.root)
    layout = Layout.from_config(config, root)
    gpus = snapshot.CachedGpus(lambda: [], 60)
    port = free_port()
    stop = exporter.start(lambda: snapshot.take(config, root, layout, gpus), f"127.0.0.1:{port}")
    try:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as got:
                status, body = got.status, got.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, {}
    finally:
        stop()
    samples = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return status, samples


def test_well_formed_records_read_as_valid(tmp_path: Path) -> None:
    status, samples = scrape(node(tmp_path / "root"))
    assert status == 200
    assert samples[f"{P}_driver_ready"] == 1
    for record in ("state", "last-run", "driver-ready"):
        assert samples[f'{P}_record_valid{{record="{record}"}}'] == 1
    assert samples[f'{P}_last_install_phase_duration_seconds{{phase="build-modules"}}'] == 12.5


@pytest.mark.parametrize(("record", "path", "content"), CRAFTED)
def test_a_crafted_record_turns_the_node_red_not_dark(tmp_path: Path, record: str, path: str,
                                                      content: str) -> None:
    env = node(tmp_path / "root")
    (tmp_path / "root" / path).write_text(content)
    status, samples = scrape(env)
    assert status == 200
    assert samples[f'{P}_record_valid{{record="{record}"}}'] == 0
    assert samples[f"{P}_driver_ready"] == 0
    assert samples[f"{P}_node_ready"] == 0
    others = {"state", "last-run", "driver-ready"} - {record}
    assert all(samples[f'{P}_record_valid{{record="{o}"}}'] == 1 for o in others)


def test_a_driver_ready_file_without_a_version_is_invalid(tmp_path: Path) -> None:
    env = node(tmp_path / "root")
    (tmp_path / "root/run/nvidia-driver-installer/driver-ready").write_text("\0\0garbage\n")
    status, samples = scrape(env)
    assert status == 200
    assert samples[f'{P}_record_valid{{record="driver-ready"}}'] == 0
    assert samples[f"{P}_driver_ready"] == 0


def test_a_scrape_answers_when_reading_the_node_fails_outright(tmp_path: Path) -> None:
    port = free_port()

    def broken() -> snapshot.Snapshot:
        raise RuntimeError("unexpected")

    stop = exporter.start(broken, f"127.0.0.1:{port}")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as got:
            body = got.read().decode()
    finally:
        stop()
    assert f"{P}_driver_ready 0.0" in body.splitlines()
    assert f'{P}_record_valid{{record="snapshot"}} 0.0' in body.splitlines()


@pytest.mark.parametrize(("record", "path", "content"), CRAFTED)
def test_installer_status_reads_a_crafted_record_as_absent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        record: str, path: str, content: str) -> None:
    env = node(tmp_path / "root")
    (tmp_path / "root" / path).write_text(content)
    code = invoke(monkeypatch, ["status"], env)
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "Traceback" not in err
    report = json.loads(out)
    if record == "state":
        assert report["record"] is None
    if record == "last-run":
        assert report["last_run"] is None
    assert record in report["invalid_records"]


def test_installer_status_names_no_invalid_record_on_a_sound_node(tmp_path: Path) -> None:
    report = app.status(from_env(node(tmp_path / "root")))
    assert report["record"]["version"] == VERSION
    assert report["last_run"]["outcome"] == "success"
    assert report["invalid_records"] == {}
