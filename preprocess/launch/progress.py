"""Progress of a local stage 1 run that a person can follow: images per stage and the rate."""

import atexit
import collections
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid

ENV_VAR = "PREPROCESS_PROGRESS_DIR"
FLUSH_INTERVAL_SECONDS = 0.5
DEFAULT_INTERVAL_SECONDS = 3.0
SETTLE_LIMIT_SECONDS = 2.0

# Stages shown with a rate, in pipeline order, and stages shown as a count.
RATE_STAGES = ("hashed", "decoded", "encoded")
COUNT_STAGES = ("failed", "duplicates")

# Beam's names of the DirectRunner, and of the other runners whose workers share this machine.
DIRECT_RUNNERS = {"directrunner", "direct", "switchingdirectrunner"}
_LOCAL_RUNNERS = DIRECT_RUNNERS | {"bundlebaseddirectrunner", "fnapirunner", "prismrunner", "prism"}
_FILE_SUFFIX = ".json"


class _ProcessTally:
    """This process's counts for one progress directory, kept in a file of its own."""

    def __init__(self, directory: str):
        self.directory = directory
        self._path = os.path.join(directory, f"{os.getpid()}-{uuid.uuid4().hex[:8]}{_FILE_SUFFIX}")
        self._counts = collections.Counter()
        self._changed = False
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        threading.Thread(target=self._flush_periodically, name="progress-flush", daemon=True).start()
        atexit.register(self.flush)

    def add(self, stage: str, n: int):
        with self._lock:
            self._counts[stage] += n
            self._changed = True

    def flush(self) -> bool:
        """Write the counts if they changed; False once the directory is gone (the run is over)."""
        with self._write_lock:
            with self._lock:
                if not self._changed:
                    return os.path.isdir(self.directory)
                payload = json.dumps(dict(self._counts))
                self._changed = False
            temporary = self._path + ".tmp"
            try:
                with open(temporary, "w") as handle:
                    handle.write(payload)
                os.replace(temporary, self._path)  # readers never see a half-written file
            except OSError:
                return False
            return True

    def _flush_periodically(self):
        while True:
            time.sleep(FLUSH_INTERVAL_SECONDS)
            if not self.flush():
                with _registry_lock:
                    if _registry.get(self.directory) is self:
                        del _registry[self.directory]
                return


_registry: dict[str, _ProcessTally] = {}
_registry_pid = os.getpid()
_registry_lock = threading.Lock()


def _tally() -> _ProcessTally | None:
    global _registry_pid
    directory = os.environ.get(ENV_VAR)
    if not directory:
        return None
    tally = _registry.get(directory)
    if tally is not None and _registry_pid == os.getpid():
        return tally
    with _registry_lock:
        if _registry_pid != os.getpid():  # a forked child: the parent's file and thread are not ours
            _registry.clear()
            _registry_pid = os.getpid()
        if directory not in _registry:
            _registry[directory] = _ProcessTally(directory)
        return _registry[directory]


class ProgressCounter:
    """Counts items through one stage of a local run (made in a DoFn's `__init__`, `inc()` beside the Beam
    metric); a no-op where no reporter is listening."""

    def __init__(self, stage: str):
        self.stage = stage

    def inc(self, n: int = 1):
        tally = _tally()
        if tally is not None:
            tally.add(self.stage, n)


def read_totals(directory: str) -> dict[str, int]:
    """The counts of every process that reported into `directory`, summed per stage."""
    totals = collections.Counter()
    try:
        names = os.listdir(directory)
    except OSError:
        return {}
    for name in names:
        if not name.endswith(_FILE_SUFFIX):
            continue
        try:
            with open(os.path.join(directory, name)) as handle:
                totals.update(json.load(handle))
        except (OSError, ValueError):
            continue  # replaced or removed while listed; next poll
    return dict(totals)


def _clock(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


def format_progress(totals: dict, rates: dict, elapsed: float, final: bool = False) -> str:
    """One progress line: the count of each stage, and its rate (items/s) where known."""
    others = sorted(set(totals) - set(RATE_STAGES) - set(COUNT_STAGES))
    average = " avg" if final else ""
    parts = [
        f"{stage} {totals.get(stage, 0)} ({rates.get(stage, 0.0):.1f}/s{average})"
        for stage in (*RATE_STAGES, *others)
    ]
    parts += [f"{stage} {totals[stage]}" for stage in COUNT_STAGES if totals.get(stage)]
    prefix = f"[{_clock(elapsed)}] " + ("done: " if final else "")
    return prefix + " | ".join(parts)


def runner_name(options) -> str:
    """--runner, lowercased, without its module ('directrunner' when none is named)."""
    from apache_beam.options.pipeline_options import StandardOptions

    runner = options.view_as(StandardOptions).runner or "DirectRunner"
    name = runner if isinstance(runner, str) else type(runner).__name__
    return name.rsplit(".", 1)[-1].lower()


def runs_locally(options) -> bool:
    """True for the runners whose workers share this machine (DirectRunner, Prism); not Dataflow."""
    return runner_name(options) in _LOCAL_RUNNERS


class ProgressReporter:
    """Prints the progress of the `ProgressCounter`s of a local run every `interval` seconds to `stream`
    (stderr by default), around `pipeline.run()`; disabled, it does nothing."""

    def __init__(
        self,
        interval: float = DEFAULT_INTERVAL_SECONDS,
        stream=None,
        enabled: bool = True,
        worker_processes: bool = True,
    ):
        self._interval = interval
        self._stream = stream
        self._enabled = enabled
        # In process, this process's flush below makes the totals exact: no wait for other processes' last
        # flush (0.6 to 2 s at the end of every small job).
        self._worker_processes = worker_processes
        self.directory = None  # the counters' files while it runs
        self._thread = None
        self._stop = threading.Event()
        self.lines: list[str] = []  # everything printed, for whoever wants it afterwards

    def __enter__(self):
        if not self._enabled:
            return self
        self.directory = tempfile.mkdtemp(prefix="preprocess-progress-")
        self._previous_env = os.environ.get(ENV_VAR)
        os.environ[ENV_VAR] = self.directory
        self._start = self._last_poll = time.monotonic()
        self._totals, self._started, self._moved = {}, {}, {}
        self._thread = threading.Thread(target=self._report_periodically, name="progress-report", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info):
        if not self._enabled:
            return False
        self._stop.set()
        self._thread.join()
        tally = _registry.get(self.directory)
        if tally is not None:
            tally.flush()  # this process's own counts (in-process runners) are exact
        # A Ctrl-C: the launcher says so in one line, and nothing is "done".
        if not (exc_info[0] is not None and issubclass(exc_info[0], KeyboardInterrupt)):
            if self._worker_processes:
                self._settle()
            self._print(self._final_line())
        if self._previous_env is None:
            os.environ.pop(ENV_VAR, None)
        else:
            os.environ[ENV_VAR] = self._previous_env
        shutil.rmtree(self.directory, ignore_errors=True)
        return False

    def _settle(self):
        """Give worker processes their last flush: wait until the totals hold still (a second or two)."""
        deadline = time.monotonic() + SETTLE_LIMIT_SECONDS
        totals = read_totals(self.directory)
        while time.monotonic() < deadline:
            time.sleep(FLUSH_INTERVAL_SECONDS + 0.1)
            latest = read_totals(self.directory)
            if latest == totals:
                return
            totals = latest

    def _print(self, line: str):
        self.lines.append(line)
        print(line, file=self._stream or sys.stderr, flush=True)

    def _observe(self, now: float) -> dict[str, int]:
        """Read the totals; note when each stage started (was last seen at 0) and last moved."""
        totals = read_totals(self.directory)
        for stage, count in totals.items():
            if count != self._totals.get(stage, 0):
                self._started.setdefault(stage, self._last_poll)
                self._moved[stage] = now
        self._totals, self._last_poll = totals, now
        return totals

    def _report_periodically(self):
        while not self._stop.wait(self._interval):
            previous, last = self._totals, self._last_poll
            now = time.monotonic()
            totals = self._observe(now)
            rates = {
                stage: (count - previous.get(stage, 0)) / (now - last) for stage, count in totals.items()
            }
            self._print(format_progress(totals, rates, now - self._start))

    def _final_line(self) -> str:
        now = time.monotonic()
        totals = self._observe(now)
        # Each stage's average over the time it was running (to within one interval), not the whole job.
        rates = {
            stage: count / max(self._moved[stage] - self._started[stage], 1e-3)
            for stage, count in totals.items()
            if stage in self._moved
        }
        return format_progress(totals, rates, now - self._start, final=True)
