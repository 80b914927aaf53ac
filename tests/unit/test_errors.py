from __future__ import annotations

import re

from installer.errors import all_error_types


def test_references_and_exit_codes_are_unique_and_stable_in_shape() -> None:
    types = all_error_types()
    references = [t.reference for t in types]
    codes = [t.exit_code for t in types]
    assert len(set(references)) == len(references)
    assert len(set(codes)) == len(codes)
    for t in types:
        assert re.fullmatch(r"[a-z]+(-[a-z0-9]+)*", t.reference), t
        assert 1 <= t.exit_code <= 125, t
        assert t.exit_code != 2, "2 is click's usage error"


def test_every_error_but_the_base_has_a_hint() -> None:
    for t in all_error_types()[1:]:
        assert t.default_hint, t.reference
