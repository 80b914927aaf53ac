"""Flags and environment to a Config, for the door's bare `installer run` and every click command;
where the termination message goes."""

from __future__ import annotations

import os
from typing import Any

from installer import logs
from installer.config import Config, build_config

# Where report_error writes the termination message: --termination-log when the command got
# one (taken before the other settings are checked, so a bad setting is reported there too),
# else the environment, else Kubernetes' default.
_termination_log: dict[str, str] = {}


def make_config(options: dict[str, Any]) -> Config:
    verbose = bool(options.pop("verbose", False))
    if options.get("termination_log"):
        _termination_log["path"] = str(options["termination_log"])
    config = build_config(os.environ, options)
    logs.setup(config.log_format, verbose)
    return config
