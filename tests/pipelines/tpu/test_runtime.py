"""The runtime table: which TPU VM software version each accelerator type gets for tensorflow-tpu 2.20.0."""

import pytest

from pipelines.tpu import runtime as tpu_runtime


@pytest.mark.parametrize(
    "accelerator_type,generation,chips,hosts,runtime",
    [
        ("v4-8", "v4", 4, 1, "tpu-ubuntu2204-base"),
        ("v4-32", "v4", 16, 4, "v2-alpha-tpuv5"),
        ("v5litepod-8", "v5e", 8, 1, "v2-alpha-tpuv5-lite"),
        ("v5litepod-16", "v5e", 16, 2, "v2-alpha-tpuv5-lite"),
        ("v5p-8", "v5p", 4, 1, "v2-alpha-tpuv5"),
        ("v6e-8", "v6e", 8, 1, "v2-alpha-tpuv6e"),
        ("v6e-16", "v6e", 16, 2, "v2-alpha-tpuv6e"),
    ],
)
def test_each_accelerator_type_gets_its_generations_runtime_for_tensorflow_2_20(
    accelerator_type, generation, chips, hosts, runtime
):
    choice = tpu_runtime.choose_runtime(accelerator_type)
    assert choice.tensorflow_version == tpu_runtime.TENSORFLOW_TPU_VERSION == "2.20.0"
    assert (choice.tpu.generation.name, choice.tpu.chips, choice.tpu.hosts) == (generation, chips, hosts)
    assert choice.tpu.multi_host is (hosts > 1)
    assert choice.runtime_version == runtime
    # No TensorFlow 2.20 image is documented: a base image, TensorFlow installed on top, and said so.
    assert choice.entry.tensorflow_preinstalled is False
    assert "installed on top" in choice.entry.note and choice.entry.sources
    assert runtime in choice.describe() and accelerator_type in choice.describe()


def test_every_table_entry_cites_a_document_and_names_no_tensorflow_without_a_tpu_build():
    for (tensorflow_version, _, multi_host), entry in tpu_runtime.RUNTIMES.items():
        assert tensorflow_version == "2.20.0"
        assert all(source.startswith(("https://", tpu_runtime.HARNESS_REPO)) for source in entry.sources)
        assert "2.21" not in entry.version
        # A slice's workers run TPU servers: the entry says how they get the client's TensorFlow.
        assert ("grpc_tpu_worker:tf-2.20.0-pjrt" in entry.note) is multi_host


@pytest.mark.parametrize("accelerator_type", ["tpu-large", "v9-8", "v5e-8", "v4-7"])
def test_an_unknown_accelerator_type_is_refused_with_the_known_ones_listed(accelerator_type):
    with pytest.raises(ValueError, match="Known TPU types are v2-N, v3-N, v4-N, v5litepod-N, v5p-N, v6e-N"):
        tpu_runtime.choose_runtime(accelerator_type)


def test_a_tensorflow_version_without_a_table_row_is_refused_and_an_explicit_runtime_wins():
    with pytest.raises(ValueError, match="no TPU runtime known for tensorflow-tpu 2.21.0"):
        tpu_runtime.choose_runtime("v5litepod-8", tensorflow_version="2.21.0")
    choice = tpu_runtime.choose_runtime("v4-32", override="my-runtime")
    assert choice.runtime_version == "my-runtime" and "given by --runtime-version" in choice.describe()


def test_the_tpu_extra_pins_the_tensorflow_the_runtime_table_and_the_tpu_servers_are_chosen_for():
    """The client's TensorFlow (the [tpu] extra) and the TPU servers' image must name the same version.

    The [tpu] extra's pins (train/install_lines.py) come with the packaging work of the same issue; until
    that module is in, there is nothing to compare.
    """
    install_lines = pytest.importorskip("train.install_lines")
    assert install_lines.TENSORFLOW_TPU_VERSION == tpu_runtime.TENSORFLOW_TPU_VERSION
    assert f"tensorflow-tpu=={tpu_runtime.TENSORFLOW_TPU_VERSION}" in install_lines.TPU_REQUIREMENTS
    from pipelines.tpu import launch as tpu_launch

    assert tpu_launch.pip_install_command("/tmp/p.tar.gz") == install_lines.tpu_install_command(
        "/tmp/p.tar.gz"
    )
