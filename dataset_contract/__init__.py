"""The contract between stage 1 (preprocess) and stage 2 (train): feature keys, the manifest, the resize
geometry and the checks of a dataset directory. No Beam or tf.Transform here; docs/dataset_format.md."""
