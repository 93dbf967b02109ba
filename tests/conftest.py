"""Shared pytest fixtures.

GCS: ``gcs_emulator`` (one emulator per test session, so per pytest-xdist worker), ``gcs_dir`` (a fresh
gs:// directory in it per test) and ``gcs_read_faults`` (a forwarder in front of the emulator that fails
object reads on demand). How the emulator is reached by google-cloud-storage, Beam and TensorFlow:
tests/gcs_emulator.py.

``fast_gcs_backoff`` and ``short_gcs_retries``: google-api-core's GCS retries in this process, with
shorter waits or a shorter deadline.

Stage 1: ``shared_stage1_datasets``, datasets written once per session and copied for each module that asks.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest

from tests.gcs_emulator import EmulatorStartError, FaultInjectingForwarder, GcsEmulator


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


@pytest.fixture(scope="session")
def shared_stage1_datasets(tmp_path_factory: pytest.TempPathFactory):
    """`.copy(destination, images_per_class, **run_stage1 arguments) -> (corpus root, manifest)`: one stage 1
    run per arguments for the whole session (tests/stage1.py, SharedStage1Datasets)."""
    from tests.stage1 import SharedStage1Datasets  # noqa: PLC0415 - TensorFlow, only when a test asks

    return SharedStage1Datasets(tmp_path_factory.mktemp("shared-stage1-datasets"))


@pytest.fixture
def gcs_dir(gcs_emulator: GcsEmulator, request: pytest.FixtureRequest) -> str:
    """``gs://bucket/<test name>-<random>``: a directory no other test writes to (no trailing slash)."""
    name = re.sub(r"[^\w.-]+", "_", request.node.name)[:60]
    return gcs_emulator.url(f"{name}-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def gcs_read_faults(
    gcs_emulator: GcsEmulator, monkeypatch: pytest.MonkeyPatch
) -> Iterator[FaultInjectingForwarder]:
    """A :class:`FaultInjectingForwarder` in front of the emulator, with no faults until the test sets them.

    While it lives, ``STORAGE_EMULATOR_HOST`` points at it in this process, so google-cloud-storage and Beam's
    GCS IO (which build a client, and read the variable, for each file they open) go through it;
    ``.env`` holds the variables for a subprocess. TensorFlow's ``gs://`` goes through the TLS proxy as
    before, without faults.
    """
    forwarder = FaultInjectingForwarder(gcs_emulator.emulator, gcs_emulator.env)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", forwarder.url)
    try:
        yield forwarder
    finally:
        forwarder.stop()


# Seconds: how long Beam's GCS client keeps retrying a failing request under `short_gcs_retries`.
SHORT_GCS_RETRY_DEADLINE_S = 3.0


@pytest.fixture
def short_gcs_retries(monkeypatch: pytest.MonkeyPatch) -> float:
    """Beam's GCS IO in this process gives up on a failing request after 3 s instead of 120 s.

    It is the same retry policy (Beam's: google-cloud-storage's predicate, exponential back-off from 1 s,
    the throttling counter), with a shorter deadline: a fault that outlasts it shows what a fault that
    outlasts the real one does, without a two-minute wait. It covers what Beam's GcsIO reads and writes
    with that policy (object bytes); google-cloud-storage's own default policy (e.g. the metadata request
    Beam's reader sends when it opens an object) keeps its 120 s. Returns the deadline.
    """
    from apache_beam.io.gcp import gcsio_retry

    short = gcsio_retry.DEFAULT_RETRY_WITH_THROTTLING_COUNTER.with_timeout(SHORT_GCS_RETRY_DEADLINE_S)
    monkeypatch.setattr(gcsio_retry, "get_retry", lambda pipeline_options: short)
    return SHORT_GCS_RETRY_DEADLINE_S


# google-api-core's back-off (Beam's GCS IO and google-cloud-storage both retry with it): 1 s, doubling, at
# most 60 s; under `fast_gcs_backoff`, 1/20 of that.
FAST_GCS_BACKOFF_SCALE = 0.05


@pytest.fixture
def fast_gcs_backoff(monkeypatch: pytest.MonkeyPatch) -> float:
    """Retried GCS requests in this process wait 1/20 of google-api-core's back-off (from 50 ms instead of 1 s).

    The same retries (predicate, deadline, number of attempts a fault gets) of the same faults, minus the
    waits between them: for a test of what the retries absorb, whose dozens of 503s would otherwise wait
    a second or more each. Not for a test of a deadline (`short_gcs_retries`): more attempts fit in it.
    Returns the scale.
    """
    from google.api_core.retry import retry_unary

    backoff = retry_unary.exponential_sleep_generator

    def shorter(initial, maximum, multiplier=2.0):
        return backoff(initial * FAST_GCS_BACKOFF_SCALE, maximum * FAST_GCS_BACKOFF_SCALE, multiplier)

    monkeypatch.setattr(retry_unary, "exponential_sleep_generator", shorter)
    return FAST_GCS_BACKOFF_SCALE
