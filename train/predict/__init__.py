"""`python -m train.predict`: classify image files with a serving export, one line per file.

    python -m train.predict MODEL_DIR/export photo1.jpg photo2.png ... [--top-k 3] [--json]

EXPORT is the SavedModel `python -m train` wrote (MODEL_DIR/export), or the
model dir itself. Each file goes through the export's own `serving_default`
signature (the same decode, resize and normalization as stage 1: train/serving/export.py),
in batches. Each line is the file and its top classes with their
probabilities, or its error: a file that cannot be read or is not a usable
image (empty_file, not_an_image, truncated, decode_error, too_many_pixels,
too_large) is a line, not a crash. With --json, one JSON object per line.
Exit status 0 when every file was classified, 1 when some were not, 2 when
the export cannot be used.

    predictor.py  the export loaded, files read, batches served (TensorFlow)
    __main__.py   the command line
"""
