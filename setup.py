"""Installs the image pipeline: stage 1 (`preprocess`), stage 2 (`train`), the
workflows (`pipelines`) and their shared contract (`dataset_contract`).

One install per machine kind, chosen by an extra (train/install_lines.py holds
the pins and the exact lines; the README's install section shows them):

    pip install '.[all]'    stage 1 + the workflows + training on the CPU (Beam, tf.Transform, TensorFlow 2.21)
    pip install '.[train]'  training only, on the CPU (TensorFlow 2.21; no Beam, no tf.Transform)
    pip install '.[gpu]'    training only, with CUDA (tensorflow[and-cuda] 2.21)
    pip install '.[tpu]'    training only, on a Cloud TPU VM (tensorflow-tpu 2.20 + its libtpu)
    pip install '.[tpu-jax]'  training only, on a Cloud TPU VM, on Keras' JAX backend (jax[tpu] +
                            tensorflow-cpu for tf.data; Python 3.11+)

install_requires hold no TensorFlow: generic `tensorflow` and `tensorflow-tpu`
install the same `tensorflow/` package over each other, and tf.Transform (with
tfx-bsl) requires the generic one, so anything TensorFlow-flavoured in the
base requirements would replace the TPU build of a `[tpu]` install.

Dataflow workers get stage 1 one of two ways: the worker container built from
`Dockerfile` (`--sdk_container_image`, the recommended way: nothing is
installed at worker boot), or this file (`--setup_file ./setup.py`, with
train/install_lines.py's STAGE1_REQUIREMENTS handed to the workers too, since
Dataflow installs the package without extras). The exact, tested versions of everything are pinned
in requirements.txt / constraints.txt.

Beam is required as a range, never pinned here: a worker runs the Beam SDK of
its container, and a pin that differs from it would make pip reinstall Beam
over the SDK the harness was built for.
"""

import importlib.util
import os

import setuptools


def _install_lines():
    # Loaded by path: importing the `train` package would need its dependencies installed already.
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train", "install_lines.py")
    spec = importlib.util.spec_from_file_location("_install_lines", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lines = _install_lines()

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
    # Files the code reads at run time (importlib.resources), shipped in the wheel and the sdist.
    package_data={"preprocess.inspect.report": ["report.css"]},
    # What every machine kind needs besides TensorFlow (which comes from the extra):
    # dataset_contract's record checks (crc32c), train's plots (matplotlib).
    install_requires=[
        "numpy>=1.26",
        "google-crc32c>=1.5",
        "matplotlib>=3.8",
        "pillow>=10,<14",
    ],
    extras_require={
        # Each also pins Keras and NumPy per Python version (3.10 on TPU VMs: Keras 3.12, NumPy 2.2).
        lines.ALL: ["apache-beam[gcp]>=2.77.0,<3", *lines.STAGE1_REQUIREMENTS, *lines.TRAINING_PINS],
        lines.TRAIN: [lines.TENSORFLOW_REQUIREMENT, *lines.TRAINING_PINS],
        lines.GPU: [lines.TENSORFLOW_GPU_REQUIREMENT, *lines.TRAINING_PINS],
        lines.TPU: [*lines.TPU_REQUIREMENTS, *lines.TRAINING_PINS],
        lines.TPU_JAX: [*lines.TPU_JAX_REQUIREMENTS, *lines.TRAINING_PINS],
    },
)
