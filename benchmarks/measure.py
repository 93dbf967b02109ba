"""The benchmarks' one measuring harness: a command run as a subprocess (wall time, CPU, peak memory of its
process tree, phases), a block of this process (`timed`, `reset_peak_rss`, `status_bytes`), ratios
(`scaling_ratios`), the report (machine, load, tables, JSON), and the stage 1 benchmarks' shared option
(`add_stage1_arg_option`).

Memory is sampled from /proc every `interval` seconds: the resident set of
the command's whole process tree (the main process and every descendant, e.g.
Beam's SDK worker processes), summed. RSS counts pages shared between the
processes (the TensorFlow and Beam libraries every worker maps) once per
process, so the PSS sum (each shared page split among its users) is recorded
too; RSS is what the targets are stated in.

Optionally a directory is watched at the same interval: for each labelled
regular expression (matched against paths relative to the directory), the
time the first matching file appeared and the time their total size last
grew. These mark the phases of a job from outside, without touching its code
(stage 1 writes its decoded spill, then its shards).
"""

import argparse
import contextlib
import dataclasses
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import threading
import time

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def machine_description() -> str:
    """'N cores, M GiB RAM, <cpu model>': the machine line every benchmark prints."""
    cores = os.cpu_count()
    mem_gib = os.sysconf("SC_PHYS_PAGES") * _PAGE_BYTES / 2**30
    model = ""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cores} cores, {mem_gib:.1f} GiB RAM" + (f", {model}" if model else "")


def machine_line() -> str:
    """'machine: <machine_description()>; <machine_load()>', the first line a benchmark prints."""
    return f"machine: {machine_description()}; {machine_load()}"


def machine_load() -> str:
    """The load average, and whether the kernel shares CPU per session (autogroup) rather than per thread.

    With sched_autogroup on, a busy machine gives this whole benchmark one
    session's fair share of the cores, however many processes it starts: what
    a 2-process contender gains over 1 process is then capped by that share.
    """
    try:
        with open("/proc/loadavg") as handle:
            one, five, _ = handle.read().split()[:3]
    except OSError:
        return "load average unknown"
    text = f"load average {one} (1 min), {five} (5 min)"
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as handle:
            if handle.read().strip() == "1":
                text += "; sched_autogroup on (CPU shared per session, not per process)"
    except OSError:
        pass
    return text


def _children_by_parent() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as handle:
                stat = handle.read()
        except OSError:
            continue
        # The command name (field 2) may hold spaces and parentheses; fields after the last ')' do not.
        fields = stat[stat.rfind(")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(name))
    return children


def process_tree(root_pid: int) -> list[int]:
    """root_pid and all its descendants that exist now."""
    children = _children_by_parent()
    tree, stack = [], [root_pid]
    while stack:
        pid = stack.pop()
        tree.append(pid)
        stack.extend(children.get(pid, ()))
    return tree


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as handle:
            return int(handle.read().split()[1]) * _PAGE_BYTES
    except (OSError, IndexError, ValueError):
        return 0


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds_and_name(pid: int) -> tuple[float, str] | None:
    """(user + system CPU seconds so far, command name) of a process."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            stat = handle.read()
    except OSError:
        return None
    name = stat[stat.find("(") + 1 : stat.rfind(")")]
    fields = stat[stat.rfind(")") + 2 :].split()
    # Fields 14 and 15 of stat (utime, stime) are 11 and 12 after the command name.
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS, name


def _role(pid: int, root_pid: int) -> str:
    """From the command line: 'main', 'sdk worker' (Beam's harness, preprocess/launch/local_worker.py or
    benchmarks/bundle_heap_worker.py), 'pool worker' or 'other'."""
    if pid == root_pid:
        return "main"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            cmdline = handle.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "other"
    if any(
        name in cmdline
        for name in ("sdk_worker_main", "preprocess.launch.local_worker", "bundle_heap_worker")
    ):
        return "sdk worker"
    if "multiprocessing" in cmdline:
        return "pool worker"
    return "other"


def _pss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as handle:
            for line in handle:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return 0


@dataclasses.dataclass
class RunResult:
    argv: list[str]
    returncode: int
    wall_seconds: float
    peak_rss_bytes: int  # max over samples of the sum of RSS over the process tree
    peak_pss_bytes: int
    peak_processes: int
    peak_rss_main_bytes: int  # the root process alone
    first_seen: dict[str, float]  # watch label -> seconds from launch to the first matching file
    last_growth: dict[str, float]  # watch label -> seconds from launch to the last growth of those files
    output_tail: str
    cpu_seconds: list[tuple[int, str, float]]  # (pid, role, CPU seconds at its last sample) per process
    # The whole process tree, exact: every process that exited and was reaped, from the kernel's
    # accounting of this process's children (getrusage, /proc/self/io), not from samples.
    tree_cpu_seconds: float = 0.0  # user + sys
    tree_io: dict[str, int] = dataclasses.field(default_factory=dict)  # rchar, wchar, read_bytes, write_bytes
    # The largest RSS a single SDK worker process reached (Beam's harness, preprocess/launch/local_worker.py):
    # what each of a Dataflow worker's SDK processes, one per vCPU, needs for the same work.
    peak_rss_sdk_worker_bytes: int = 0

    def cpu_seconds_by_role(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        for _, role, seconds in self.cpu_seconds:
            totals[role] = totals.get(role, 0.0) + seconds
        return totals


class _Sampler(threading.Thread):
    def __init__(self, pid: int, interval: float, watch_dir: str | None, watch: dict[str, str]):
        super().__init__(daemon=True)
        self._pid = pid
        self._interval = interval
        self._watch_dir = watch_dir
        self._patterns = {label: re.compile(pattern) for label, pattern in watch.items()}
        self._last_size: dict[str, int] = {}
        self.last_growth: dict[str, float] = {}
        self._stopped = threading.Event()
        self.start_time = time.perf_counter()
        self.peak_rss = self.peak_pss = self.peak_processes = self.peak_main = self.peak_sdk_worker = 0
        self.first_seen: dict[str, float] = {}
        self.cpu_by_pid: dict[int, tuple[float, str]] = {}

    def _watch(self, now: float) -> None:
        if not self._watch_dir or not os.path.isdir(self._watch_dir):
            return
        sizes = dict.fromkeys(self._patterns, 0)
        for dirpath, _, filenames in os.walk(self._watch_dir):
            relative_dir = os.path.relpath(dirpath, self._watch_dir)
            for filename in filenames:
                relative = filename if relative_dir == "." else f"{relative_dir}/{filename}"
                for label, pattern in self._patterns.items():
                    if pattern.search(relative):
                        try:
                            sizes[label] += os.path.getsize(os.path.join(dirpath, filename)) + 1
                        except OSError:
                            pass
        for label, size in sizes.items():
            if size and label not in self.first_seen:
                self.first_seen[label] = now - self.start_time
            if size > self._last_size.get(label, 0):
                self._last_size[label] = size
                self.last_growth[label] = now - self.start_time

    def sample(self) -> None:
        now = time.perf_counter()
        pids = process_tree(self._pid)
        rss_by_pid = {pid: _rss_bytes(pid) for pid in pids}
        rss = sum(rss_by_pid.values())
        if rss > self.peak_rss:
            self.peak_rss = rss
            self.peak_pss = max(self.peak_pss, sum(_pss_bytes(pid) for pid in pids))
        self.peak_processes = max(self.peak_processes, len(pids))
        self.peak_main = max(self.peak_main, _rss_bytes(self._pid))
        for pid in pids:
            cpu = _cpu_seconds_and_name(pid)
            if cpu is not None:
                role = self.cpu_by_pid[pid][1] if pid in self.cpu_by_pid else _role(pid, self._pid)
                self.cpu_by_pid[pid] = (cpu[0], role)
                if role == "sdk worker":
                    self.peak_sdk_worker = max(self.peak_sdk_worker, rss_by_pid[pid])
        self._watch(now)

    def run(self) -> None:
        while not self._stopped.is_set():
            self.sample()
            self._stopped.wait(self._interval)

    def stop(self) -> None:
        self._stopped.set()
        self.join()


def _own_io() -> dict[str, int]:
    """This process's /proc/self/io: its own I/O plus that of every child it has reaped (recursively)."""
    with open("/proc/self/io") as handle:
        return {key: int(value) for key, value in (line.split(":") for line in handle if ":" in line)}


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_measured(
    argv: list[str],
    *,
    interval: float = 0.25,
    watch_dir: str | None = None,
    watch: dict[str, str] | None = None,
    log_path: str | None = None,
    env: dict | None = None,
    check: bool = True,
) -> RunResult:
    """Run argv to completion, sampling its process tree; stdout+stderr go to log_path (or are kept)."""
    log = open(log_path, "w") if log_path else None  # noqa: SIM115 - closed below
    try:
        io_before, cpu_before = _own_io(), _children_cpu_seconds()
        start = time.perf_counter()
        process = subprocess.Popen(
            argv,
            stdout=log or subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            text=True,
        )
        sampler = _Sampler(process.pid, interval, watch_dir, watch or {})
        sampler.start_time = start
        sampler.start()
        output, _ = process.communicate()
        wall = time.perf_counter() - start
        sampler.stop()
        # Includes what the sampler read from /proc meanwhile (a few KB per sample), a small overcount.
        io_after, cpu_after = _own_io(), _children_cpu_seconds()
    finally:
        if log:
            log.close()
    if log_path:
        with open(log_path) as handle:
            output = handle.read()
    tail = "\n".join((output or "").splitlines()[-30:])
    if check and process.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited with {process.returncode}:\n{tail}")
    return RunResult(
        argv=list(argv),
        returncode=process.returncode,
        wall_seconds=wall,
        peak_rss_bytes=sampler.peak_rss,
        peak_pss_bytes=sampler.peak_pss,
        peak_processes=sampler.peak_processes,
        peak_rss_main_bytes=sampler.peak_main,
        peak_rss_sdk_worker_bytes=sampler.peak_sdk_worker,
        first_seen=dict(sampler.first_seen),
        last_growth=dict(sampler.last_growth),
        output_tail=tail,
        cpu_seconds=sorted((pid, role, seconds) for pid, (seconds, role) in sampler.cpu_by_pid.items()),
        tree_cpu_seconds=cpu_after - cpu_before,
        tree_io={
            key: io_after[key] - io_before[key] for key in ("rchar", "wchar", "read_bytes", "write_bytes")
        },
    )


def python_module(module: str, *args: str) -> list[str]:
    """argv running `python -m module args` with this interpreter."""
    return [sys.executable, "-m", module, *args]


def stage1_command(corpus: str, output: str, image_size: int, encoding: str, *args: str) -> list[str]:
    """argv running stage 1 (`python -m preprocess`) on `corpus` into `output` at one size and encoding, then `args`."""
    return python_module(
        "preprocess",
        *("--input", corpus, "--output", output),
        *("--image-size", str(image_size), "--encoding", encoding),
        *args,
    )


def add_stage1_arg_option(parser: argparse.ArgumentParser) -> None:
    """--stage1-arg, declared once for the benchmarks that run stage 1: its words, in order, in args.stage1_args."""
    parser.add_argument(
        "--stage1-arg",
        dest="stage1_args",
        action="append",
        default=[],
        metavar="ARG",
        help="One more word for every stage 1 command line the benchmark runs (stage1_vs_handwritten: the beam "
        "contenders'); repeat it: e.g. --stage1-arg=--near-duplicates --stage1-arg=off, stage 1 without its "
        "near-duplicate audit; --stage1-arg=--in-process-below --stage1-arg=0, a small corpus in worker processes.",
    )


def finish_report(figures: dict, json_path: str | None) -> dict:
    """A benchmark's report: the machine and its load at the end, then `figures`; written to `json_path` if set."""
    report = {"machine": machine_description(), "load_at_end": machine_load(), **figures}
    if json_path:
        with open(json_path, "w") as handle:
            json.dump(report, handle, indent=2)
    return report


def median(values) -> float:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else float("nan")


def format_table(header: list[str], rows: list[list]) -> str:
    """A GitHub-markdown table (readable as plain text too)."""
    cells = [[str(c) for c in header]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |" for row in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def mib(num_bytes: float) -> str:
    return f"{num_bytes / 2**20:,.0f}"


@dataclasses.dataclass
class Timing:
    wall_seconds: float = 0.0
    cpu_seconds: float = 0.0  # this process's user + system time, every thread's


@contextlib.contextmanager
def timed():
    """`with timed() as timing:` the block's wall and CPU seconds, in `timing` once it ends."""
    timing = Timing()
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        yield timing
    finally:
        timing.wall_seconds = time.perf_counter() - wall
        timing.cpu_seconds = time.process_time() - cpu


def status_bytes(key: str) -> int:
    """A size of /proc/self/status in bytes: VmRSS (now), VmHWM (the peak since start or reset_peak_rss)."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{key} not in /proc/self/status")


def reset_peak_rss() -> bool:
    """Start this process's peak RSS (VmHWM) over from its current RSS (Linux >= 4.0); False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def scaling_ratios(runs: list[dict], key: str, factor, **where) -> list[float]:
    """How a figure grows with the input: per repeat, `key` of the run at `factor` over the run at 1 (runs with
    "repeat" and "factor"; `where` selects among them, e.g. contender=...)."""
    ratios = []
    for repeat in sorted({run["repeat"] for run in runs}):
        chosen = [r for r in runs if r["repeat"] == repeat and all(r.get(k) == v for k, v in where.items())]
        by_factor = {run["factor"]: run[key] for run in chosen}
        ratios.append(by_factor[factor] / by_factor[1])
    return ratios
