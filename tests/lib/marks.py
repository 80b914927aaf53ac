"""Skip marks shared by test files: what this machine must have for their tests to mean
anything."""

from __future__ import annotations

import pytest

from lib.hostkit import debian_headers

# The installer compiles against this machine's Debian kernel headers, relocated into each host
# root (lib.hostkit.make_debian_host).
needs_headers = pytest.mark.skipif(debian_headers() is None, reason="needs linux-headers-amd64")
