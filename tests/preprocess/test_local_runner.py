"""Stage 1 runs on the FnApiRunner when the runner is the DirectRunner, and leaves other runners to Beam."""

import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import fn_runner

from preprocess import local_runner


@pytest.mark.parametrize(
    "flags",
    [[], ["--runner", "DirectRunner"], ["--runner=direct"], ["--runner", "SwitchingDirectRunner"]],
)
def test_the_direct_runner_means_the_fn_api_runner_with_the_job_options(flags):
    options = PipelineOptions([*flags, "--direct_num_workers=2", "--direct_running_mode=multi_processing"])
    runner = local_runner.runner_for(options)
    assert isinstance(runner, fn_runner.FnApiRunner)
    # The SDK workers get the job's options through the provision info, as under the DirectRunner.
    encoded = runner._provision_info.provision_info.pipeline_options
    assert int(encoded["beam:option:direct_num_workers:v1"]) == 2


@pytest.mark.parametrize("runner", ["DataflowRunner", "PrismRunner", "PortableRunner"])
def test_other_runners_are_left_to_beam(runner):
    assert local_runner.runner_for(PipelineOptions(["--runner", runner])) is None
