"""Shell fragments that several vm scenarios run in the guest (no braces: safe in a template),
and how their output reads."""

from __future__ import annotations

import json
import re
from typing import Any

# The scenario's www folder (files={"www": ...}) on 127.0.0.1:8000; the script goes on once the
# server answers.
SERVE_WWW = """\
ip link set lo up
python3 -m http.server --bind 127.0.0.1 8000 --directory "$VM_FILES/www" >/dev/null 2>&1 &
for _ in $(seq 100); do
  python3 -c 'import socket; socket.create_connection(("127.0.0.1", 8000))' 2>/dev/null && break
  sleep 0.1
done
"""

# Every compiler, assembler, linker and make a build could reach is replaced by a shim that
# records its call in /tmp/compiler-calls and fails: one compiler process shows there.
NO_COMPILERS = """\
printf '#!/bin/sh\\necho "$0 $*" >> /tmp/compiler-calls\\nexit 1\\n' > /tmp/no-compiler
chmod +x /tmp/no-compiler
# (Named one by one: a glob such as ld* would also catch /usr/bin/ld.so, the dynamic loader.)
for p in /usr/bin/gcc /usr/bin/gcc-[0-9]* /usr/bin/cc /usr/bin/x86_64-linux-gnu-gcc-[0-9]* \\
         /usr/bin/make /usr/bin/ld /usr/bin/ld.bfd /usr/bin/ld.gold /usr/bin/as \\
         /usr/bin/x86_64-linux-gnu-as /usr/bin/x86_64-linux-gnu-ld \\
         /usr/bin/x86_64-linux-gnu-ld.bfd /usr/lib/gcc/x86_64-linux-gnu/*/cc1; do
  if [ -e "$p" ]; then mount --bind /tmp/no-compiler "$(readlink -f "$p")"; fi
done
"""


def exit_of(section: str) -> int:
    """The exit code in a section that the scripts' `step NAME COMMAND...` printed (exit=N)."""
    match = re.search(r"^exit=(\d+)$", section, re.MULTILINE)
    assert match, section
    return int(match.group(1))


def assert_libraries_cached(section: str, install: str) -> None:
    """`ldconfig -p` in `section` resolves NVML and CUDA to the install dir's lib64."""
    assert re.search(rf"libnvidia-ml.so.1 \(libc6,x86-64\) => {install}/lib64/libnvidia-ml.so.1",
                     section), section
    assert re.search(rf"libcuda.so.1 \(libc6,x86-64\) => {install}/lib64/libcuda.so.1", section)


def passed_verify(section: str) -> dict[str, Any]:
    """The report `installer verify --json` printed in `section`, once the step exited 0 and
    the report says ok."""
    assert exit_of(section) == 0, section
    report: dict[str, Any] = json.loads(section[section.index("{"): section.rindex("}") + 1])
    assert report["ok"] is True
    return report
