"""The contract between stage 1 (preprocess) and stage 2 (train).

The only thing the two stages share is a dataset directory and the names and
rules in this package: feature keys and encodings (`features`), the manifest
`dataset.json` (`manifest`), the resize geometry that both the offline job
and the serving signature apply (`geometry`), and the checks that hold a
dataset directory to its manifest (`verification`, the one module here that
imports TensorFlow). Nothing here imports Beam or tf.Transform, so stage 2
and the exported model can depend on it freely.
See docs/dataset_format.md for the contract in prose.
"""
