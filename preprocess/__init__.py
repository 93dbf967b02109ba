"""Stage 1: an Apache Beam + tf.Transform job that turns image files into a dataset directory.

Entry point: `python -m preprocess --help` (see preprocess/pipeline.py). The tree: docs/development.md;
the design notes of the modules: docs/internals.md.
"""
