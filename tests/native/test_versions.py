"""The libcurl and jansson the extension was built with (headers) and runs on (libraries): at
least the oldest supported, csrc/compat.h's (libcurl 7.74.0, jansson 2.13: Debian 11's), the
libraries at least as new as the headers, the build features those versions give; and exactly
the expected ones when CREATEOS_EXPECT_LIBS names them, as `make native-oldlibs` does (the
proof that the suite ran against Debian 11's libraries)."""

from __future__ import annotations

import os
import re

from langflow_sandbox_createos import _createos as E


def version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def test_versions_are_supported_and_consistent() -> None:
    assert version(E.build_curl_version) >= (7, 74, 0), E.build_curl_version
    assert version(E.build_jansson_version) >= (2, 13), E.build_jansson_version
    assert version(E.curl_version) >= version(E.build_curl_version)
    assert version(E.jansson_version) >= version(E.build_jansson_version)
    expected = set()
    if version(E.build_curl_version) >= (7, 87, 0):
        expected.add("quick_exit")
    if version(E.build_jansson_version) >= (2, 14):
        expected.add("json_keys_with_nul")
    assert E.build_features == expected, (E.build_features, E.build_curl_version, E.build_jansson_version)


def test_the_expected_libraries_were_built_with_and_loaded() -> None:
    wanted = os.environ.get("CREATEOS_EXPECT_LIBS")  # "libcurl 7.74.0, jansson 2.13.1"
    if not wanted:
        return  # a normal run: whatever the system has (see the test above)
    libs = dict(part.split() for part in wanted.split(","))
    got = {
        "libcurl": (E.build_curl_version, E.curl_version),
        "jansson": (E.build_jansson_version, E.jansson_version),
    }
    assert got == {name: (v, v) for name, v in libs.items()}, got
