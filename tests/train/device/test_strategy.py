"""TPU resolution for a single-host VM (`local`) and a multi-host slice (a name), without a TPU or a network.

The resolver of a named TPU asks the Cloud TPU API for the slice's workers;
the test hands it what that API returns (its `service` argument), so the
cluster it builds, and what initialize_tpu does with it, are the real code's.
"""

import pytest

from train.data import checks
from train.device import strategy
from train.errors import ConfigError

# In the Python 3.10 leg's subset (scripts/test_py310.sh): the strategy choice, with two logical devices.
pytestmark = pytest.mark.py310

V4_32_WORKERS = [{"ipAddress": f"10.130.0.{index}", "port": "8470"} for index in range(2, 6)]


class _Request:
    def __init__(self, response):
        self._response = response

    def execute(self):
        return self._response


class FakeTpuApi:
    """The part of the Cloud TPU API (projects.locations.nodes.get) the resolver calls."""

    def __init__(self, node: dict):
        self.node = node
        self.asked_for = []

    def projects(self):
        return self

    def locations(self):
        return self

    def nodes(self):
        return self

    def get(self, name):
        self.asked_for.append(name)
        return _Request(self.node)


def named_slice_resolver(api):
    return strategy.tpu_cluster_resolver("my-v4-32", zone="us-central2-b", project="proj", service=api)


def test_a_named_multi_host_slice_resolves_to_every_worker_and_is_connected_before_initializing():
    api = FakeTpuApi({"state": "READY", "networkEndpoints": V4_32_WORKERS, "acceleratorType": "v4-32"})
    resolver = named_slice_resolver(api)
    assert strategy.tpu_workers(resolver) == [f"10.130.0.{index}:8470" for index in range(2, 6)]
    assert resolver.master() == "grpc://10.130.0.2:8470"
    assert api.asked_for[0] == "projects/proj/locations/us-central2-b/nodes/my-v4-32"

    calls = []
    strategy.initialize_tpu(
        resolver,
        connect=lambda r: calls.append(("connect", strategy.tpu_workers(r))),
        initialize=lambda r: calls.append(("initialize", r.master())),
    )
    assert calls == [
        ("connect", [f"10.130.0.{index}:8470" for index in range(2, 6)]),
        ("initialize", "grpc://10.130.0.2:8470"),
    ]


def test_local_initializes_this_vms_chips_without_connecting_anywhere():
    resolver = strategy.tpu_cluster_resolver("local")
    assert strategy.tpu_workers(resolver) == []
    assert resolver.master() == ""
    calls = []
    strategy.initialize_tpu(
        resolver, connect=lambda r: calls.append("connect"), initialize=lambda r: calls.append("initialize")
    )
    assert calls == ["initialize"]


def test_a_slice_that_is_not_ready_is_an_error_that_says_so():
    resolver = named_slice_resolver(FakeTpuApi({"state": "CREATING"}))
    with pytest.raises(RuntimeError, match="not yet ready"):
        strategy.tpu_workers(resolver)


@pytest.mark.parametrize(
    "address,machine",
    [
        ("localhost:2222", "localhost"),
        ("127.0.0.1:1", "localhost"),
        ("[::1]:5", "localhost"),
        ("10.0.0.7:2222", "10.0.0.7"),
    ],
)
def test_workers_on_loopback_addresses_are_one_machine(address, machine):
    assert strategy.machine_of(address) == machine


def test_local_paths_are_refused_when_training_spans_several_machines():
    with pytest.raises(ConfigError, match=r"--data /data/ds, --model-dir /tmp/m: not on gs://.*4 machines"):
        checks.check_paths_for_hosts("/data/ds", "/tmp/m", num_machines=4, shared_filesystem=False)
    with pytest.raises(ConfigError, match=r"--model-dir /tmp/m: not on gs://"):
        checks.check_paths_for_hosts("gs://b/ds", "/tmp/m", num_machines=2, shared_filesystem=False)
    checks.check_paths_for_hosts("gs://b/ds", "gs://b/m", num_machines=4, shared_filesystem=False)
    checks.check_paths_for_hosts("/data/ds", "/tmp/m", num_machines=1, shared_filesystem=False)
    checks.check_paths_for_hosts("/mnt/nfs/ds", "/mnt/nfs/m", num_machines=4, shared_filesystem=True)
