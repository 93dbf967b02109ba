"""The Dataflow worker image built from the repository's Dockerfile, and the launcher Python it needs."""

import sys

from dataset_contract.cli_help import flag_value

IMAGE_PYTHON = (3, 11)


class LauncherPythonError(ValueError):
    """The launcher's Python differs from the worker image's: the message says which Python to use."""


def check_launcher_python(beam_args: list[str], version_info=sys.version_info) -> None:
    """Raises LauncherPythonError if `beam_args` name a worker image and this Python is not the image's."""
    # Beam's flag for the worker image, or its deprecated name.
    image = flag_value(beam_args, "--sdk_container_image") or flag_value(
        beam_args, "--worker_harness_container_image"
    )
    if image is None or tuple(version_info[:2]) == IMAGE_PYTHON:
        return
    wanted = ".".join(map(str, IMAGE_PYTHON))
    running = ".".join(map(str, version_info[:2]))
    raise LauncherPythonError(
        f"the worker image {image} runs Python {wanted}, but this launcher runs Python {running}: Beam "
        f"pickles the job with the launcher's Python, and workers of another version fail to load it. "
        f"Launch with Python {wanted} (PYTHON=python{wanted} bash scripts/bootstrap.sh makes a .venv with it), "
        "or leave out --sdk_container_image to let the workers install the package from --setup_file."
    )
