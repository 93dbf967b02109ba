"""Garbage collection of a dataset directory: remove what no commit, retention promise or live lease needs
(a run's directory whole, once no kept version names a file in it). `python -m preprocess.gc` runs it;
publishing calls `collect_garbage` too."""

import dataclasses
import datetime
import fnmatch
import json
import logging
import uuid

from dataset_contract import commit_log, leases
from dataset_contract import manifest as manifest_lib
from preprocess.config import DEFAULT_GC_MAX_OBJECTS
from preprocess.publish import protocol
from preprocess.publish import store as dataset_store
from preprocess.publish.runs import (
    DELETING_MARKER,
    PUBLISHING_MARKER,
    STAGING_DIR,
    TFT_TEMP_PREFIX,
    is_run_id,
)

# Runs looked at per call, oldest first: a call's listings stay bounded however many runs wait.
DEFAULT_MAX_RUNS = 50
# A run that started after the published one and has not published this long after its start is dead.
ABANDONED_RUN_SECONDS = 7 * 24 * 3600
# An old commit goes once the commit after it is this old.
COMMIT_GRACE_SECONDS = 24 * 3600
# Temporary files of an exclusive create (dataset_store, local disk) left by a kill.
TMP_GRACE_SECONDS = 3600
_TMP_PREFIX = f"{STAGING_DIR}/.tmp/"

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Report:
    """What one call did (or, with --dry-run, would do)."""

    output_dir: str
    dry_run: bool = False
    deleted: int = 0
    removed_runs: list = dataclasses.field(default_factory=list)
    kept: list = dataclasses.field(default_factory=list)
    waiting: int = 0
    waiting_until: float = 0.0
    markers_written: int = 0
    requests: int = 0
    more: bool = False
    refused: dict = dataclasses.field(default_factory=dict)

    def wait(self, stored):
        self.waiting += 1
        self.waiting_until = max(self.waiting_until, stored.deletable_at)

    def lines(self) -> list[str]:
        deleted, removed = ("would delete", "would remove") if self.dry_run else ("deleted", "removed")
        lines = [f"{self.output_dir}: {deleted} {self.deleted} objects ({self.requests} requests)"]
        lines += [f"  {removed} run {run}" for run in self.removed_runs]
        lines += [f"  kept {reason}" for reason in self.kept]
        if self.waiting:
            until = (
                "their hold is released"
                if self.waiting_until == dataset_store.NEVER
                else _utc(self.waiting_until).strftime("%Y-%m-%dT%H:%M:%SZ")
            )
            lines.append(
                f"  {self.waiting} objects wait for the bucket's retention (until {until} at the latest); a "
                "later call removes them"
            )
        if self.refused:
            name, reason = next(iter(self.refused.items()))
            lines.append(
                f"  {len(self.refused)} deletions refused (e.g. {name}: {reason}); a later call retries"
            )
        if self.more:
            lines.append("  more to do than this call's budget: run it again")
        return lines


class _Collector:
    def __init__(self, output_dir, max_objects, max_runs, dry_run, tft_build_id, now):
        self.store = dataset_store.open_store(output_dir)
        self.report = Report(output_dir.rstrip("/"), dry_run)
        self.budget = max_objects
        self.max_runs = max_runs
        self.dry_run = dry_run
        self.tft_build_id = tft_build_id
        self.now = now

    # ---------------------------------------------------------------- deleting within the budget

    def delete(self, objects) -> bool:
        """Delete what the bucket lets go now, within the budget; True if every one of `objects` is gone."""
        deletable = []
        for stored in objects:
            if stored.deletable_at > self.now:
                self.report.wait(stored)
            else:
                deletable.append(stored.name)
        if len(deletable) > self.budget:
            deletable, self.report.more = deletable[: self.budget], True
        refused = self.store.delete(deletable) if deletable and not self.dry_run else {}
        self.report.refused.update(refused)
        if refused:
            name, reason = next(iter(refused.items()))
            log.warning("could not remove %d objects of %s (e.g. %s: %s); a later garbage collection retries",
                        len(refused), self.report.output_dir, name, reason)  # fmt: skip
        self.budget -= len(deletable)
        self.report.deleted += len(deletable) - len(refused)
        return len(deletable) == len(objects) and not refused

    # ---------------------------------------------------------------- the log

    def head(self):
        """(sequence, manifest, commits listed) of the published dataset (dataset_contract.commit_log's reader;
        the commits are its listing's objects, with their update times)."""
        files = protocol.StoreFiles(self.store)
        try:
            published = commit_log.read_published(self.store.root, files)
        except manifest_lib.ManifestError:  # format 3's pointer to an empty log, or a head that vanished
            published = None
        commits = sorted(
            (sequence, item)
            for item in files.listed
            if (sequence := commit_log.commit_sequence(item.name)) is not None
        )
        if published is None:
            return (commits[-1][0] if commits else 0), None, commits
        return published.sequence, published.manifest(), commits

    # ---------------------------------------------------------------- runs

    def run(self):
        sequence, manifest, commits = self.head()
        head_run = protocol.published_run_id(manifest)
        retained = {entry["id"]: entry for entry in (manifest or {}).get(protocol.RETAINED_RUNS, [])}
        runs = self.store.list(f"{manifest_lib.RUNS_DIR}/", delimiter=True)
        staging = self.store.list(f"{STAGING_DIR}/", delimiter=True)
        leased = self.store.list(f"{leases.LEASES_DIR}/", delimiter=True)
        with_files = {prefix.split("/")[1] for prefix in runs.prefixes}
        with_staging = {prefix.split("/")[1] for prefix in staging.prefixes}
        with_leases = {prefix.split("/")[1] for prefix in leased.prefixes}
        markers = _markers(runs.objects)
        run_ids = sorted(
            run_id for run_id in with_files | with_staging | with_leases | set(markers) if is_run_id(run_id)
        )
        self.references = self.kept_references(manifest, head_run, retained, with_leases)
        looked_at = 0
        for run_id in run_ids:
            if run_id == head_run:
                # Committed: the markers of its attempts that died go (a live one's attempt removes its own).
                self.remove_dead_markers(run_id, markers.get(run_id, []))
                continue
            if self.budget <= 0 or looked_at >= self.max_runs:
                self.report.more = True
                break
            looked_at += 1
            reason = self.keep_reason(run_id, head_run, retained, markers.get(run_id, []))
            if reason:
                self.report.kept.append(reason)
                self.remove_dead_markers(run_id, markers.get(run_id, []))
                if run_id < head_run and run_id in with_staging:
                    # Kept for its files (retained, leased, referenced), but it can never commit again: its
                    # staging and tf.Transform directory are leftovers of a publish step that died.
                    self.remove_staging(run_id)
                continue
            if run_id in with_files or run_id in with_staging:
                self.remove_run(run_id, sequence, markers.get(run_id, []), run_id > head_run)
            else:
                self.remove_traces(run_id, markers.get(run_id, []))
        self.remove_temporary(staging)
        if manifest is not None:
            self.remove_format1_files(manifest)
        # Commits below the head whose successor is older than the grace period.
        old = [
            stored
            for (_, stored), (_, successor) in zip(commits, commits[1:], strict=False)
            if self.now - successor.updated > COMMIT_GRACE_SECONDS
        ]
        if old:
            self.delete(old)
        if not self.dry_run and commits:
            try:
                protocol.copy_head_to_dataset_json(self.store)
            except Exception as exc:  # noqa: BLE001 - a copy; a bucket that keeps it young refuses to replace it
                log.info(
                    "could not copy the newest commit to %s (%s); readers never need it",
                    commit_log.HINT_FILE,
                    exc,
                )

    def kept_references(self, manifest, head_run, retained, with_leases) -> dict:
        """{run id: why it stays} for the runs whose files a kept version names (its shards referenced by an
        incremental version): the newest's, a retained one's (within its retention or leased), a leased one's.
        A live lease on a run the log no longer describes (no retained entry) keeps every run before it: what
        it references is not known."""
        now = _utc(self.now)
        kept = {
            ref: f"run {ref}: the newest version (run {head_run}) references its files"
            for ref in protocol.referenced_runs(manifest)
        }
        for run_id, entry in sorted(retained.items()):
            references = entry.get("references") or []
            if references and (protocol.retain_until(entry, 0) > now or self.live_lease(run_id)):
                for ref in references:
                    kept.setdefault(
                        ref, f"run {ref}: run {run_id}, kept for its readers, references its files"
                    )
        self.unknown_references = ""
        for run_id in sorted(with_leases - set(retained) - {head_run}, reverse=True):
            if is_run_id(run_id) and run_id < head_run and self.live_lease(run_id):
                self.unknown_references = run_id
                break
        return kept

    def keep_reason(self, run_id, head_run, retained, markers) -> str | None:
        if run_id in self.references:
            return self.references[run_id]
        if run_id < self.unknown_references:
            return (
                f"run {run_id}: a training job holds a lease on run {self.unknown_references}, which may "
                "reference its files (that run is no longer in the log)"
            )
        entry = retained.get(run_id)
        if entry is not None:
            until = protocol.retain_until(entry, 0)
            if until > _utc(self.now):
                return f"run {run_id}, superseded at {entry['superseded_at']}: stays for its readers until {protocol._timestamp(until)}"
        if run_id > head_run:
            # A run that started before the head can never commit (commit.py): only a later one may be
            # publishing now, and only its markers count.
            if self.publishing(markers):
                return f"run {run_id}: it is publishing"
            started = datetime.datetime.strptime(run_id.split("Z-")[0], "%Y%m%dT%H%M%S%f")
            age = self.now - started.replace(tzinfo=datetime.timezone.utc).timestamp()
            if age < ABANDONED_RUN_SECONDS:
                return f"run {run_id}: it started after the published run and may still publish"
        if self.live_lease(run_id):
            return f"run {run_id}: a training job holds a live lease on it ({leases.LEASES_DIR}/{run_id}/)"
        return None

    def publishing(self, markers) -> bool:
        """Whether a live publishing marker is among a run's `markers` ((kind, stored) pairs)."""
        return any(
            kind == PUBLISHING_MARKER and protocol.marker_is_live(stored, self.now)
            for kind, stored in markers
        )

    def lease_names(self, run_id) -> list:
        return self.store.list(leases.run_leases_dir(run_id) + "/").objects

    def live_lease(self, run_id) -> bool:
        names = [stored.name for stored in self.lease_names(run_id)]
        return bool(leases.live_holders(names, _utc(self.now)))

    def remove_run(self, run_id, sequence, markers, may_publish):
        """Every object of a run no one needs, within the budget; its traces last."""
        files = self.store.list(f"{manifest_lib.RUNS_DIR}/{run_id}/", max_results=self.budget)
        staged = self.store.list(f"{STAGING_DIR}/{run_id}/", max_results=self.budget)
        tft, tft_prefixes = self.own_tft_temp(run_id)
        objects = tft + files.objects + staged.objects
        if not any(stored.deletable_at <= self.now for stored in objects):
            for stored in objects:
                self.report.wait(stored)
            return
        if self.dry_run:
            self.delete(objects)
            self.report.removed_runs.append(run_id)
            return
        if not self.announce_removal(run_id, sequence, may_publish):
            return
        everything = self.delete(objects) and not files.truncated and not staged.truncated
        protocol.pause_point("run-files-removed", run_id)
        if files.truncated or staged.truncated:
            self.report.more = True
        if everything:
            self.remove_traces(run_id, markers)
            for prefix in (f"{manifest_lib.RUNS_DIR}/{run_id}/", f"{STAGING_DIR}/{run_id}/", *tft_prefixes):
                self.store.delete_folder(prefix)
            self.report.removed_runs.append(run_id)
            log.info("removed the files of run %s from %s", run_id, self.report.output_dir)

    def remove_staging(self, run_id):
        """The staging (and own tf.Transform directory) of a run kept for its files."""
        tft, tft_prefixes = self.own_tft_temp(run_id)
        staged = self.store.list(f"{STAGING_DIR}/{run_id}/", max_results=self.budget)
        if self.delete(tft + staged.objects) and not staged.truncated and not self.dry_run:
            for prefix in (f"{STAGING_DIR}/{run_id}/", *tft_prefixes):
                self.store.delete_folder(prefix)

    def own_tft_temp(self, run_id) -> tuple[list, list]:
        """The objects of tf.Transform's temporary directory of a run that did not share it (runs.py's
        build.json), first: the record goes with the run's staging after them; and that directory's prefix."""
        data = self.store.read(f"{STAGING_DIR}/{run_id}/build.json")
        try:
            build = json.loads(data.decode("utf-8")) if data is not None else None
        except ValueError:
            build = None
        if not build or build.get("shared") or build.get("build_id") == self.tft_build_id:
            return [], []
        prefix = f"{STAGING_DIR}/{TFT_TEMP_PREFIX}{build['build_id']}/"
        objects = self.store.list(prefix, max_results=self.budget).objects
        return objects, [prefix] if objects else []

    def announce_removal(self, run_id, sequence, may_publish) -> bool:
        """Write a removal marker (unless a live one is there), then look again; False: back off."""
        now = _utc(self.now)
        existing = [stored.name for stored in self.lease_names(run_id)]
        if not leases.live_removals(
            existing, now + datetime.timedelta(seconds=leases.REMOVAL_MARKER_SECONDS / 2)
        ):
            expiry = now + datetime.timedelta(seconds=leases.REMOVAL_MARKER_SECONDS)
            marker = leases.removal_marker_name(run_id, uuid.uuid4().hex[:16], expiry)
            self.store.create_if_absent(marker, json.dumps({"run_id": run_id}).encode("utf-8"))
            self.report.markers_written += 1
        protocol.pause_point("removal-announced", run_id)
        protocol.pause_point("tombstone-written", run_id)  # its name before the commit log
        # Looked at after the marker: a trainer or a publisher that came first is seen here.
        names = [stored.name for stored in self.lease_names(run_id)]
        if leases.live_holders(names, now):
            self.report.kept.append(f"run {run_id}: a training job took a lease on it just now")
            return False
        if may_publish and self.publishing(
            _markers(self.store.list(f"{manifest_lib.RUNS_DIR}/{run_id}.").objects).get(run_id, [])
        ):
            self.report.kept.append(f"run {run_id}: it is publishing")
            return False
        head_sequence, head_manifest, _ = self.head()
        if head_sequence != sequence:
            self.report.kept.append(f"run {run_id}: a commit was made meanwhile (a later call decides)")
            return False
        # Looked at after the marker too: a run publishing now may reference this run's shards (its publish
        # step looks for this marker after writing its own: one of the two sees the other). Only a run that
        # started after the head can still commit (commit.py).
        head_run = protocol.published_run_id(head_manifest)
        publishing = [
            stored
            for stored in self.store.list(f"{manifest_lib.RUNS_DIR}/", delimiter=True).objects
            if stored.name.split("/")[-1].partition(".")[0] > max(run_id, head_run)
            and stored.name.split("/")[-1].split(".")[1:2] == [PUBLISHING_MARKER]
            and protocol.marker_is_live(stored, self.now)
        ]
        if publishing:
            self.report.kept.append(f"run {run_id}: a later run is publishing and may reference its files")
            return False
        return True

    def remove_traces(self, run_id, markers):
        """Once a run's files are gone: its expired leases, its removal and publishing markers."""
        now = _utc(self.now)
        traces = [
            stored for stored in self.lease_names(run_id) if not leases.live_holders([stored.name], now)
        ]
        traces += [stored for _, stored in markers]
        if traces and self.delete(traces) and not self.dry_run:
            self.store.delete_folder(leases.run_leases_dir(run_id) + "/")

    def remove_dead_markers(self, run_id, markers):
        dead = [
            stored
            for kind, stored in markers
            if kind in (PUBLISHING_MARKER, DELETING_MARKER) and not protocol.marker_is_live(stored, self.now)
        ]
        if dead:
            self.delete(dead)

    # ---------------------------------------------------------------- the rest

    def remove_temporary(self, staging):
        idle = []
        tmp = [
            stored
            for stored in self.store.list(_TMP_PREFIX).objects
            if self.now - stored.updated > TMP_GRACE_SECONDS
        ]
        for prefix in staging.prefixes:
            name = prefix.split("/")[1]
            if not name.startswith(TFT_TEMP_PREFIX) or name == f"{TFT_TEMP_PREFIX}{self.tft_build_id}":
                continue
            listed = self.store.list(prefix, max_results=self.budget)
            if (
                listed.objects
                and max(stored.updated for stored in listed.objects)
                < self.now - protocol.TFT_TEMP_GRACE_SECONDS
            ):
                tmp += listed.objects
                idle.append(prefix)
        if tmp and self.delete(tmp) and not self.dry_run:
            for prefix in idle:
                self.store.delete_folder(prefix)

    def remove_format1_files(self, manifest):
        """The top-level files of a format 1 dataset, once the head names files in runs/ only."""
        if any("/" not in name for name in protocol.named_files(manifest)):
            return
        top = self.store.list("", delimiter=True)
        stale = [
            stored
            for stored in top.objects
            if stored.name == manifest_lib.ERRORS_FILE
            or any(
                fnmatch.fnmatchcase(stored.name, manifest_lib.shard_glob(split))
                for split in manifest_lib.SPLITS
            )
        ]
        for prefix in top.prefixes:
            if prefix.rstrip("/") in (
                manifest_lib.TRANSFORM_FN_DIR,
                manifest_lib.TRANSFORMED_METADATA_DIR,
            ) or (prefix.startswith(".staging-")):
                stale += self.store.list(prefix, max_results=self.budget).objects
        if stale:
            self.delete(stale)


def _markers(objects) -> dict:
    """{run id: [(kind, stored)]} of the markers among `objects` (runs/<run id>.<kind>.<...>)."""
    markers = {}
    for stored in objects:
        owner, _, kind = stored.name.split("/")[-1].partition(".")
        markers.setdefault(owner, []).append((kind.split(".")[0], stored))
    return markers


def _utc(seconds: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)


def remove_run(output_dir: str, run_id: str) -> bool:
    """Remove every object of run `run_id` now, whatever its retention; True if it is gone.

    Not the published run, nor one a live lease holds, nor (if it started after the published run) one
    whose publish is under way: False then. The same removal, marker and checks as `collect_garbage`'s.
    """
    collector = _Collector(
        output_dir, DEFAULT_GC_MAX_OBJECTS, 1, False, None, protocol._utc_now().timestamp()
    )
    sequence, manifest, _ = collector.head()
    head_run = protocol.published_run_id(manifest)
    if run_id == head_run or collector.live_lease(run_id) or run_id in protocol.referenced_runs(manifest):
        return False
    markers = _markers(collector.store.list(f"{manifest_lib.RUNS_DIR}/{run_id}.").objects).get(run_id, [])
    if run_id > head_run and collector.publishing(markers):
        return False
    collector.remove_run(run_id, sequence, markers, run_id > head_run)
    return run_id in collector.report.removed_runs


def collect_garbage(
    output_dir: str,
    max_objects: int = DEFAULT_GC_MAX_OBJECTS,
    dry_run: bool = False,
    tft_build_id: str | None = None,
    now: float | None = None,
    max_runs: int = DEFAULT_MAX_RUNS,
) -> Report:
    """Remove what no commit, retention promise or live lease of `output_dir` needs: at most `max_objects`
    deletions, and `max_runs` runs looked at. `tft_build_id`: a tf.Transform directory in use by the
    caller, never removed."""
    # protocol._utc_now: one clock for the retention promises publish records and the collector honours.
    now = protocol._utc_now().timestamp() if now is None else now
    collector = _Collector(output_dir, max_objects, max_runs, dry_run, tft_build_id, now)
    collector.run()
    collector.report.requests = collector.store.requests
    for line in collector.report.lines():
        log.info("%s", line)
    return collector.report
