"""The HTML report of a dataset directory (`python -m preprocess.inspect DIR --report report.html`).

One self-contained page: inline CSS, images as data: URIs, no script, no
network. `build` gathers what the page shows, reading a bounded amount
whatever the dataset's size; `page` writes the HTML; `figures` draws the
bars; `thumbnails` turns pixels and source files into small embedded images;
`near_duplicate_groups` reads the groups (the error log: preprocess.errors.read_error_log).
"""
