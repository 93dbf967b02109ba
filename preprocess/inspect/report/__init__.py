"""The HTML report of a dataset directory (`python -m preprocess.inspect DIR --report report.html`): one
self-contained page, read within a bounded budget (build, page, figures, thumbnails, near_duplicate_groups)."""
