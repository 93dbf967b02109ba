"""The names of leases and removal markers in `leases/<run id>/` (dataset_contract/leases.py)."""

import datetime

from dataset_contract import leases

_UTC = datetime.timezone.utc
NOW = datetime.datetime(2026, 11, 27, 9, 0, 0, tzinfo=_UTC)


def test_a_removal_marker_names_its_expiry_and_is_never_taken_for_a_lease():
    expiry = NOW + datetime.timedelta(seconds=leases.REMOVAL_MARKER_SECONDS)
    name = leases.removal_marker_name("20261127T080000000000Z-1a2b3c4d", "0123abcd", expiry)
    assert name == "leases/20261127T080000000000Z-1a2b3c4d/removing.20261127T100000Z.0123abcd.json"
    assert leases.parse_removal_marker(name) == ("0123abcd", expiry)
    assert leases.parse_lease(name) is None
    holder = leases.holder_id("gs://b/model")
    lease = leases.lease_name("20261127T080000000000Z-1a2b3c4d", holder, expiry)
    assert leases.parse_removal_marker(lease) is None
    # One listing of leases/<run id>/ tells both apart.
    assert leases.live_holders([name, lease], NOW) == {holder}
    assert leases.live_removals([name, lease], NOW) == {"0123abcd"}


def test_a_removal_marker_past_its_expiry_stops_nothing():
    expired = leases.removal_marker_name("r", "0123abcd", NOW - datetime.timedelta(seconds=1))
    live = leases.removal_marker_name("r", "feedbeef", NOW + datetime.timedelta(seconds=1))
    assert leases.live_removals([expired, live], NOW) == {"feedbeef"}
