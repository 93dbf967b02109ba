"""Installs the image pipeline: stage 1 (`preprocess`), stage 2 (`train`), the
workflows (`pipelines`) and their shared contract (`dataset_contract`).

Dataflow workers install the job from this file (`--setup_file ./setup.py`),
so `install_requires` lists what the workers need to run stage 1; the exact,
tested versions of everything are pinned in requirements.txt / constraints.txt.
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
        "apache-beam[gcp]==2.77.0",
        "tensorflow==2.21.0",
        "tensorflow-transform==1.21.0",
        "pillow>=10,<14",
        "numpy>=1.26",
    ],
)
