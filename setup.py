"""Installs the image pipeline: stage 1 (`preprocess`), stage 2 (`train`), the
workflows (`pipelines`) and their shared contract (`dataset_contract`).

Dataflow workers get the job one of two ways: the worker container built
from `Dockerfile` (`--sdk_container_image`, the recommended way: nothing is
installed at worker boot), or this file (`--setup_file ./setup.py`: each
worker pip-installs `install_requires` when it starts). The exact, tested
versions of everything are pinned in requirements.txt / constraints.txt.

Beam is required as a range, never pinned here: a worker runs the Beam SDK of
its container, and a pin that differs from it would make pip reinstall Beam
over the SDK the harness was built for.
"""

import setuptools

setuptools.setup(
    name="tf-image-pipeline",
    version="0.1.0",
    description="Offline image preprocessing with Apache Beam + tf.Transform, "
    "streaming Keras training under tf.distribute.",
    python_requires=">=3.10,<3.13",
    packages=setuptools.find_packages(
        include=[
            "dataset_contract",
            "preprocess",
            "preprocess.*",
            "train",
            "train.*",
            "pipelines",
            "pipelines.*",
        ]
    ),
    install_requires=[
        "apache-beam[gcp]>=2.77.0,<3",
        "tensorflow==2.21.0",
        "tensorflow-transform==1.21.0",
        "pillow>=10,<14",
        "numpy>=1.26",
    ],
)
