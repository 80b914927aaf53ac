from __future__ import annotations

import dataclasses
from pathlib import Path, PurePosixPath

import pytest

from installer.config import (
    SETTINGS,
    Config,
    Setting,
    build_config,
    from_env,
    known_env_vars,
    setting,
    settings_of,
)
from installer.errors import ConfigError

GKE_ENV = {
    "NVIDIA_INSTALL_DIR_HOST": "/home/kubernetes/bin/nvidia",
    "NVIDIA_INSTALL_DIR_CONTAINER": "/usr/local/nvidia",
    "ROOT_MOUNT_DIR": "/root",
    "NVIDIA_DRIVER_VERSION": "460.56",
}


def test_defaults_follow_gke_and_a_bare_host_root() -> None:
    config = from_env({})
    assert config.root == Path("/")
    assert config.version == "auto"
    assert config.branch_path == "tesla"
    assert config.install_dir_host == PurePosixPath("/var/lib/nvidia")
    assert config.install_dir_container == Path("/usr/local/nvidia")
    assert config.download_url is None


def test_gke_daemonset_environment_is_understood() -> None:
    config = from_env(GKE_ENV)
    assert config.root == Path("/root")
    assert config.install_dir_host == PurePosixPath("/home/kubernetes/bin/nvidia")
    assert config.version == "460.56"


def test_flags_override_environment() -> None:
    config = build_config({"NVIDIA_DRIVER_VERSION": "550"}, {"version": "535", "root": None})
    assert config.version == "535"


def test_every_gke_variable_is_known() -> None:
    assert {
        "NVIDIA_DRIVER_VERSION",
        "NVIDIA_DRIVER_BRANCH",
        "NVIDIA_DRIVER_DOWNLOAD_URL",
        "NVIDIA_INSTALL_DIR_HOST",
        "NVIDIA_INSTALL_DIR_CONTAINER",
        "ROOT_MOUNT_DIR",
    } <= known_env_vars()


def test_settings_have_unique_names_and_variables() -> None:
    assert len({s.name for s in SETTINGS}) == len(SETTINGS)
    assert len({s.env for s in SETTINGS}) == len(SETTINGS)


def test_every_config_field_is_exactly_one_setting_in_the_same_order() -> None:
    names = [f.name for f in dataclasses.fields(Config)]
    assert names == [s.name for s in SETTINGS]
    assert all(isinstance(f.metadata.get("setting"), Setting) for f in dataclasses.fields(Config))


def test_a_field_without_its_setting_is_refused_when_the_table_is_read() -> None:
    @dataclasses.dataclass(frozen=True)
    class Half:
        named: str = setting("X_NAMED", "a", lambda v, s: v, "named once")
        bare: str = "b"

    with pytest.raises(KeyError):
        settings_of(Half)


def test_the_defaults_are_what_each_parser_makes_of_the_default_text() -> None:
    built = from_env({})
    assert built == Config()
    for s in SETTINGS:
        assert getattr(built, s.name) == s.parse(s.default, s), s.name
    assert built.lock_timeout == 600.0 and built.retries == 5
    assert built.install_dir_host == PurePosixPath("/var/lib/nvidia")


def test_a_secret_setting_stays_out_of_the_repr() -> None:
    config = from_env({"NVIDIA_MODULE_REGISTRY_PASSWORD": "hunter2-token"})
    assert config.module_registry_password == "hunter2-token"
    assert "hunter2" not in repr(config)


def test_mirrors_and_module_args_are_parsed() -> None:
    config = from_env(
        {
            "NVIDIA_DRIVER_MIRRORS": "http://127.0.0.1:8000/a, file:///srv/mirror",
            "NVIDIA_MODULE_ARGS": "nvidia.NVreg_EnableGpuFirmware=0 nvidia-uvm.uvm_disable_hmm=1",
        }
    )
    assert config.mirrors == ("http://127.0.0.1:8000/a", "file:///srv/mirror")
    assert config.module_args_for("nvidia") == ["NVreg_EnableGpuFirmware=0"]
    assert config.module_args_for("nvidia_uvm") == ["uvm_disable_hmm=1"]


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"NVIDIA_DRIVER_SOURCE": "apt"}, "NVIDIA_DRIVER_SOURCE"),
        ({"NVIDIA_KERNEL_MODULE_TYPE": "closed"}, "NVIDIA_KERNEL_MODULE_TYPE"),
        ({"NVIDIA_INSTALL_DIR_HOST": "relative/dir"}, "NVIDIA_INSTALL_DIR_HOST"),
        ({"NVIDIA_INSTALL_DIR_HOST": "/var/../etc"}, "NVIDIA_INSTALL_DIR_HOST"),
        ({"NVIDIA_INSTALL_DIR_HOST": "/"}, "NVIDIA_INSTALL_DIR_HOST"),
        ({"NVIDIA_DRIVER_DOWNLOAD_URL": "ftp://x/y.run"}, "NVIDIA_DRIVER_DOWNLOAD_URL"),
        ({"NVIDIA_DRIVER_SHA256": "abc"}, "NVIDIA_DRIVER_SHA256"),
        ({"NVIDIA_INSTALLER_RETRIES": "0"}, "NVIDIA_INSTALLER_RETRIES"),
        ({"NVIDIA_INSTALLER_READ_TIMEOUT": "soon"}, "NVIDIA_INSTALLER_READ_TIMEOUT"),
        ({"NVIDIA_MODULE_ARGS": "nvidia.x=1;reboot"}, "NVIDIA_MODULE_ARGS"),
        ({"NVIDIA_DRIVER_BRANCH": "../../x"}, "NVIDIA_DRIVER_BRANCH"),
        ({"NVIDIA_KERNEL_RELEASE": "6.1; rm -rf /"}, "NVIDIA_KERNEL_RELEASE"),
        ({"NVIDIA_INSTALLER_ALLOW_NO_GPU": "maybe"}, "NVIDIA_INSTALLER_ALLOW_NO_GPU"),
        ({"NVIDIA_MODULE_SIGNING_KEY": "/k.priv"}, "NVIDIA_MODULE_SIGNING_CERT"),
        # Paths that reach make's M=/--tmpdir: make would evaluate $(...).
        ({"NVIDIA_INSTALL_DIR_HOST": "/var/lib/$(reboot)"}, "NVIDIA_INSTALL_DIR_HOST"),
        ({"NVIDIA_INSTALL_DIR_HOST": "/var/lib/nvidia driver"}, "NVIDIA_INSTALL_DIR_HOST"),
        ({"NVIDIA_INSTALL_DIR_CONTAINER": "/usr/local/`id`"}, "NVIDIA_INSTALL_DIR_CONTAINER"),
        ({"NVIDIA_INSTALLER_CACHE_DIR": "/var/cache/a b"}, "NVIDIA_INSTALLER_CACHE_DIR"),
        ({"ROOT_MOUNT_DIR": "/ro ot"}, "ROOT_MOUNT_DIR"),
        ({"NVIDIA_INSTALL_DIR_HOST": "/var/lib/nvidia\n"}, "NVIDIA_INSTALL_DIR_HOST"),
    ],
)
def test_bad_values_name_the_variable(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        from_env(env)
    assert fragment in info.value.message
    assert info.value.exit_code == 10


def test_credentials_in_a_bad_url_are_not_echoed() -> None:
    with pytest.raises(ConfigError) as info:
        from_env({"NVIDIA_DRIVER_DOWNLOAD_URL": "ftp://user:secret@host/x.run"})
    assert "secret" not in info.value.message
