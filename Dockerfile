# The Dataflow worker image for stage 1: Beam's own SDK container of the pinned
# version, plus TensorFlow, tf.Transform and this package, installed at build
# time. Workers then start without a pip install at boot (minutes per
# autoscaled worker, and impossible where workers have no internet), and the
# Beam SDK in the image is the one the harness was built for.
#
# Build and push once per release (Cloud Build, no local Docker needed):
#
#   gcloud builds submit --project PROJECT \
#       --tag REGION-docker.pkg.dev/PROJECT/REPOSITORY/tf-image-pipeline:TAG .
#
# then run stage 1 with --sdk_container_image REGION-docker.pkg.dev/...:TAG
# (python -m pipelines.dataflow and python -m preprocess both take it).
#
# The base image's Python and Beam versions must match the launcher's:
# tests/pipelines/test_worker_container.py holds them to requirements.txt and
# to preprocess/launch/worker_image.py's IMAGE_PYTHON, with which the launchers
# refuse another Python.
FROM apache/beam_python3.11_sdk:2.77.0

WORKDIR /opt/tf-image-pipeline
COPY constraints.txt setup.py ./
COPY dataset_contract ./dataset_contract
COPY preprocess ./preprocess
COPY train ./train
COPY pipelines ./pipelines
# The package with its [all] extra (stage 1's TensorFlow and tf.Transform:
# install_requires hold none, train/install_lines.py says why), resolved with
# constraints.txt: apache-beam is
# pinned there to the base image's version, so pip keeps the SDK that is
# already in the image, and everything else gets the versions the tests ran
# with.
# `pip check` fails the build if what is installed does not fit together
# (the base image's own packages included). The import probe runs from /tmp,
# outside the source folder, so that it imports the installed package (from
# site-packages) as the workers will, not ./preprocess; it imports
# TensorFlow and tf.Transform by name, since the stage-1 modules load them
# only where they are used.
RUN pip install --no-cache-dir -c constraints.txt ".[all]" \
    && pip check \
    && cd /tmp \
    && python -c "import apache_beam, tensorflow, tensorflow_transform, dataset_contract, pipelines, train, \
preprocess.pipeline, preprocess.label_vocabulary; assert '/site-packages/' in preprocess.__file__, preprocess.__file__; \
print('Beam', apache_beam.__version__, 'TensorFlow', tensorflow.__version__)"

# The base image's entry point (the Beam SDK harness) stays as it is.
