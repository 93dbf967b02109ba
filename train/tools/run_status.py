"""The supervisor's status object in the model dir: a heartbeat while it supervises, the reason when it stops.

Why and how: docs/internals.md.
"""

import datetime
import json
import logging
import os
import socket
import subprocess
import tempfile
import threading
import time

STATUS_FILE = "supervisor.json"
RUNNING, WAITING, EXITED, STOPPED = "running", "waiting", "exited", "stopped"
GCLOUD_SECONDS = 120  # at most, for one gcloud call: a hung one must not stop the heartbeat for good
RETRY_SECONDS = 10.0  # between two tries of a last report: the loop must not miss why supervision stopped

log = logging.getLogger("train.tools.run_status")


def status_uri(model_dir: str) -> str:
    return f"{model_dir.rstrip('/')}/{STATUS_FILE}"


def write_status(uri: str, content: dict) -> None:
    """Write `content` as JSON to `uri`: a local file (atomically) or a gs:// object (gcloud storage cp)."""
    text = json.dumps(content, indent=1, sort_keys=True) + "\n"
    if not uri.startswith("gs://"):
        partial = f"{uri}.{os.getpid()}.partial"
        with open(partial, "w") as handle:
            handle.write(text)
        os.replace(partial, uri)
        return
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        handle.write(text)
    try:
        result = subprocess.run(
            ["gcloud", "storage", "cp", handle.name, uri],
            capture_output=True, text=True, timeout=GCLOUD_SECONDS, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        if result.returncode != 0:
            raise OSError(f"gcloud storage cp to {uri} failed: {result.stderr.strip()[-500:]}")
    finally:
        os.remove(handle.name)


def read_status_text(uri: str) -> str | None:
    """The status object's text, or None when there is none (or it cannot be read)."""
    if not uri.startswith("gs://"):
        try:
            with open(uri) as handle:
                return handle.read()
        except OSError:
            return None
    try:
        result = subprocess.run(
            ["gcloud", "storage", "cat", uri],
            capture_output=True, text=True, timeout=GCLOUD_SECONDS, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return None
    return result.stdout if result.returncode == 0 else None


def parse_status(text: str | None) -> dict | None:
    try:
        content = json.loads(text) if text else None
    except ValueError:
        return None
    return content if isinstance(content, dict) else None


class StatusReport:
    """The status object of one supervisor: `report` on each change, a heartbeat thread in between.

    Without a uri it does nothing. A write that fails is logged (once, until one succeeds again) and
    never stops supervision.
    """

    def __init__(self, uri: str | None, heartbeat_seconds: float = 60.0, saved_step=None):
        self.uri = uri
        self.saved_step = saved_step  # a callable: the last saved checkpoint step, written with each beat
        self.heartbeat_seconds = heartbeat_seconds
        self._fields = {"state": RUNNING, "host": socket.gethostname(), "pid": os.getpid()}
        self._beats = 0
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

    def report(self, state: str, detail: str, attempts: int = 1, **fields) -> None:
        """The new state, written now; a last report (`stopped`) is worth `attempts` tries, RETRY_SECONDS apart."""
        with self._lock:
            self._fields.update(state=state, detail=detail, **fields)
        for attempt in range(attempts):
            if self._write() or attempt + 1 == attempts:
                return
            time.sleep(RETRY_SECONDS)

    def start(self) -> None:
        if self.uri and self._thread is None:
            self._thread = threading.Thread(target=self._beat, name="supervisor-heartbeat", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """End the heartbeat (before the last report, which must not be overwritten by a late beat)."""
        self._done.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _beat(self) -> None:
        while not self._done.wait(self.heartbeat_seconds):
            self._write()

    def _write(self) -> bool:
        """Write the object once; whether it was written (True without a uri: nothing to write)."""
        if not self.uri:
            return True
        with self._lock:
            self._beats += 1
            content = {
                **self._fields,
                **({"saved_step": self.saved_step()} if self.saved_step else {}),
                "heartbeat": self._beats,
                "heartbeat_seconds": self.heartbeat_seconds,
                "updated": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
            try:
                write_status(self.uri, content)
            except (OSError, subprocess.SubprocessError) as exc:
                if not self._failing:
                    log.warning("cannot write the status object %s: %s", self.uri, exc)
                self._failing = True
                return False
            if self._failing:
                log.info("the status object %s is written again", self.uri)
            self._failing = False
            return True
