"""The fake-driver kit: a makeself .run whose payload behaves like NVIDIA's tools (see README)."""

from __future__ import annotations

from kit.builder import build_runfile, runfile_name

__all__ = ["build_runfile", "runfile_name"]
