"""The serving export: a SavedModel that takes encoded image bytes and does stage 1's decode in-graph.

    export.py          export_serving_model (and model.keras): the signatures, their config, warmup, lineage
    decode.py          decode_batch: per-image decode, EXIF orientation, resize, in bounded memory
    image_header.py    inspect: format, stored size, decoder memory and problems from the header alone
    exif_orientation.py, graph_bytes.py   the byte-level pieces those read with
    warmup.py          TF Serving's warmup requests

Nothing here is needed to load an export: `tf.saved_model.load(path)` is enough.
"""
