"""Leases: a training job's claim on the dataset run it reads, which stage 1's cleanup honours."""

import datetime
import hashlib
import posixpath
import re

LEASES_DIR = "leases"
_LEASE = re.compile(r"(?P<holder>[0-9a-f]{16})\.(?P<expiry>\d{8}T\d{6}Z)\.json")
_REMOVAL = re.compile(r"removing\.(?P<expiry>\d{8}T\d{6}Z)\.(?P<attempt>[0-9a-f]{8,32})\.json")
_EXPIRY_FORMAT = "%Y%m%dT%H%M%SZ"
# How long a removal marker stops leases on its run: a remover's work per call is bounded (minutes).
REMOVAL_MARKER_SECONDS = 3600


def holder_id(model_dir: str) -> str:
    """The lease holder's name for a model dir: 16 hex digits of its path's sha256."""
    return hashlib.sha256(model_dir.rstrip("/").encode("utf-8")).hexdigest()[:16]


def run_leases_dir(run_id: str) -> str:
    """`leases/<run id>`, relative to the dataset directory."""
    return posixpath.join(LEASES_DIR, run_id)


def lease_name(run_id: str, holder: str, expires_at: datetime.datetime) -> str:
    """`leases/<run id>/<holder>.<expiry>.json`, relative to the dataset directory."""
    stamp = expires_at.astimezone(datetime.timezone.utc).strftime(_EXPIRY_FORMAT)
    return posixpath.join(run_leases_dir(run_id), f"{holder}.{stamp}.json")


def _parse(pattern, group: str, name: str) -> tuple[str, datetime.datetime] | None:
    match = pattern.fullmatch(posixpath.basename(name))
    if match is None:
        return None
    expiry = datetime.datetime.strptime(match.group("expiry"), _EXPIRY_FORMAT)
    return match.group(group), expiry.replace(tzinfo=datetime.timezone.utc)


def _live(parse, names, now: datetime.datetime) -> set[str]:
    return {parsed[0] for parsed in map(parse, names) if parsed is not None and parsed[1] > now}


def parse_lease(name: str) -> tuple[str, datetime.datetime] | None:
    """(holder, expiry) of a lease object's base name, or None if it is not one."""
    return _parse(_LEASE, "holder", name)


def live_holders(names, now: datetime.datetime) -> set[str]:
    """The holders with a lease among `names` (listed in `leases/<run id>/`) that has not expired at `now`."""
    return _live(parse_lease, names, now)


def removal_marker_name(run_id: str, attempt: str, expires_at: datetime.datetime) -> str:
    """`leases/<run id>/removing.<expiry>.<attempt>.json`, relative to the dataset directory."""
    stamp = expires_at.astimezone(datetime.timezone.utc).strftime(_EXPIRY_FORMAT)
    return posixpath.join(run_leases_dir(run_id), f"removing.{stamp}.{attempt}.json")


def parse_removal_marker(name: str) -> tuple[str, datetime.datetime] | None:
    """(attempt, expiry) of a removal marker's base name, or None if it is not one."""
    return _parse(_REMOVAL, "attempt", name)


def live_removals(names, now: datetime.datetime) -> set[str]:
    """The attempts with a removal marker among `names` (listed in `leases/<run id>/`) live at `now`."""
    return _live(parse_removal_marker, names, now)
