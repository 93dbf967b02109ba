"""Shared pytest fixtures.

GCS: ``gcs_emulator`` (one emulator per test session) and ``gcs_dir`` (a fresh gs:// directory in it per
test). How the emulator is reached by google-cloud-storage, Beam and TensorFlow: tests/gcs_emulator.py.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest

from tests.gcs_emulator import EmulatorStartError, GcsEmulator


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GcsEmulator]:
    """A running GCS emulator with one bucket, for every client in this process and in subprocesses.

    Yields a :class:`GcsEmulator`: ``.bucket``, ``.url(path)`` -> ``gs://bucket/path``, ``.env`` (the
    variables to hand to a subprocess; ``.run(argv)`` does that), ``.list_objects(prefix)`` and
    ``.read_object(name)`` (asked of the emulator directly). While it lives, ``.env`` is also applied to
    this process, so in-process Beam, google-cloud-storage and TensorFlow ``gs://`` calls reach the
    emulator; the previous environment comes back at the end of the session.

    TensorFlow reads the proxy, CA-bundle and token variables at each request, so this works in a process
    that imported tensorflow (or even tried a ``gs://`` path) before this fixture started; only its
    ``GCS_*`` tuning variables are read once, at import.

    Fails (never skips) when the emulator or its proxy cannot start, with their log in the message.
    """
    try:
        emulator = GcsEmulator.start(tmp_path_factory.mktemp("gcs-emulator"))
    except EmulatorStartError as exc:
        pytest.fail(f"the GCS emulator could not start: {exc}", pytrace=False)
    try:
        with pytest.MonkeyPatch.context() as patch:
            for name, value in emulator.env.items():
                patch.setenv(name, value)
            yield emulator
    finally:
        emulator.stop()


@pytest.fixture
def gcs_dir(gcs_emulator: GcsEmulator, request: pytest.FixtureRequest) -> str:
    """``gs://bucket/<test name>-<random>``: a directory no other test writes to (no trailing slash)."""
    name = re.sub(r"[^\w.-]+", "_", request.node.name)[:60]
    return gcs_emulator.url(f"{name}-{uuid.uuid4().hex[:8]}")
