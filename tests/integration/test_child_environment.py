"""Issue 20: registry credentials stay in the installer. Every child process (make, the .run,
nvidia-installer, apt-get, dnf and its scriptlets, dkms) starts through runner.SubprocessRunner,
which hands it an environment without them, whatever the caller passes."""

from __future__ import annotations

from installer.runner import SubprocessRunner

SECRETS = {"NVIDIA_MODULE_REGISTRY_PASSWORD": "pa55-in-env",
           "NVIDIA_MODULE_REGISTRY_USERNAME": "robot-in-env", "ORAS_PASS": "oras-pa55"}


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
