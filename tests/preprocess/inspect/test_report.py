"""`python -m preprocess.inspect DIR --report report.html`, opened in a real headless Chromium.

The dataset is written by the real stage 1 (the sample corpus, broken files
included, so that the page has failures to show). One real run also audits
planted altered copies (`near_duplicate_dataset`): its groups are what the page
shows. The cases a run cannot be made to show on demand (a member whose source
is gone, more groups than --max-groups, an older dataset without the fields)
are written into copies of a dataset by `add_near_duplicate_fields`, in the
exact format of docs/dataset_format.md.

Chromium (tests/chromium.py) is started once for the module.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import tensorflow as tf
from PIL import Image

from dataset_contract import manifest as manifest_lib
from preprocess.decode import image as image_decode
from preprocess.inspect import contact_sheet as inspect_lib
from preprocess.inspect.report import figures, near_duplicate_groups, thumbnails
from tests import chromium
from tests.stage1 import read_manifest, run_stage1, write_corpus, write_published_manifest
from tests.user_mistakes import assert_refused, run_command

SCREENSHOT_COPY = os.environ.get("REPORT_SCREENSHOT")  # a path: also save the screenshot there, to look at
HEADINGS = [
    "Examples per split",
    "Examples per class",
    "Failures by reason",
    "Source image sizes",
    "Contact sheet",
    "Near-duplicate groups",
]
# Every <img> of the page, whether it loaded, and the page's headings and text.
PAGE_STATE = """JSON.stringify({
  images: Array.from(document.images).map(i => ({complete: i.complete, width: i.naturalWidth, alt: i.alt})),
  headings: Array.from(document.querySelectorAll('h2')).map(h => h.textContent),
  text: document.body.innerText,
  sections: Object.fromEntries(Array.from(document.querySelectorAll('section')).map(s => [s.id, s.innerText])),
  scripts: document.scripts.length,
  injected: typeof window.injected,
})"""


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    write_corpus(root, images_per_class=4)
    return root


@pytest.fixture(scope="module")
def dataset(corpus, tmp_path_factory):
    """A real stage 1 dataset: five classes, the sample corpus's six failures, bfloat16 (de-normalized)."""
    output = tmp_path_factory.mktemp("dataset")
    run_stage1(corpus, output, image_size=32, encoding="bfloat16")
    return str(output)


def copy_dataset(dataset: str, destination) -> str:
    shutil.copytree(dataset, destination)
    return str(destination)


def write_manifest(data_dir: str, manifest: dict):
    write_published_manifest(data_dir, manifest)


def group_line(members: list[tuple[str, str, str]], max_distance: int) -> str:
    """One line of a near-duplicate file (docs/dataset_format.md) for (uri, label, split) members."""
    keys = [hashlib.sha256(uri.encode()).hexdigest() for uri, _, _ in members]
    ordered = sorted(zip(keys, members, strict=True))
    return json.dumps(
        {
            "group": ordered[0][0],
            "split": ordered[0][1][2],
            "max_distance": max_distance,
            "uris": [member[0] for _, member in ordered],
            "labels": [member[1] for _, member in ordered],
            "splits": [member[2] for _, member in ordered],
            "sha256": [key for key, _ in ordered],
            "kept": [True] * len(ordered),
        }
    )


def add_near_duplicate_fields(data_dir: str, groups: list[str], summary: dict):
    """Write `groups` (lines) as the run's near-duplicate file and the manifest's fields for it."""
    manifest = read_manifest(data_dir)
    relative = manifest_lib.join(manifest["run"]["dir"], "near-duplicates-test.jsonl")
    data = "".join(line + "\n" for line in groups).encode()
    with open(os.path.join(data_dir, relative), "wb") as handle:
        handle.write(data)
    manifest["near_duplicates"] = summary
    manifest["near_duplicate_files"] = [
        {
            "path": relative,
            "num_groups": len(groups),
            "num_bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        }
    ]
    buckets = [{"upto": 64 << shift, "count": 0} for shift in range(8)] + [{"upto": None, "count": 0}]
    buckets[1]["count"], buckets[2]["count"], buckets[-1]["count"] = 14, 5, 1
    manifest["source_image_sizes"] = {
        "count": 20,
        "smallest": [90, 100],
        "largest": [9000, 120],
        "longest_side": buckets,
    }
    write_manifest(data_dir, manifest)


def make_sources(corpus, root) -> dict[str, str]:
    """Members' source files: an altered copy of a circle, and a square saved under `cross`."""
    os.makedirs(root / "cross")
    # As stage 1 decodes it (the sample corpus's circle_0000 is RGBA on a transparent background).
    circle = Image.fromarray(
        image_decode.decode_image((corpus / "circle" / "circle_0000.png").read_bytes(), max_pixels=1 << 30)
    )
    circle.resize((circle.width * 3 // 4, circle.height * 3 // 4)).save(root / "circle_small.jpg", quality=70)
    shutil.copy(corpus / "square" / "square_0000.png", root / "cross" / "square_0000.png")
    return {
        "circle": str(corpus / "circle" / "circle_0000.png"),
        "circle_copy": str(root / "circle_small.jpg"),
        "square": str(corpus / "square" / "square_0000.png"),
        "square_as_cross": str(root / "cross" / "square_0000.png"),
        "missing": str(root / "gone" / "deleted.png"),
    }


@pytest.fixture(scope="module")
def audited_dataset(dataset, corpus, tmp_path_factory):
    """The dataset with near-duplicate groups: one plain, one across labels (with an unreadable member), two more."""
    data_dir = copy_dataset(dataset, tmp_path_factory.mktemp("audited") / "dataset")
    sources = make_sources(corpus, tmp_path_factory.mktemp("sources"))
    groups = [
        group_line([(sources["circle"], "circle", "train"), (sources["circle_copy"], "circle", "train")], 3),
        group_line(
            [
                (sources["square"], "square", "train"),
                (sources["square_as_cross"], "cross", "train"),
                (sources["missing"], "square", "train"),
            ],
            5,
        ),
        group_line([(sources["circle"], "circle", "test"), (sources["circle_copy"], "circle", "test")], 1),
        group_line(
            [(sources["square"], "square", "validation"), (sources["square"], "square", "validation")], 0
        ),
    ]
    summary = {
        "mode": "keep",
        "max_distance": 10,
        "groups": 4,
        "images_in_groups": 9,
        "groups_with_several_labels": 1,
        "groups_across_splits": 0,
        "dropped": 0,
        "hot_buckets": 0,
        "hot_bucket_entries": 0,
        "largest_group": 3,
        "split_changes": 2,
        "distance_histogram": [3, 1, 0, 2, 0, 1, 0, 0, 0, 0, 0, 1, 2, 4, 9, 12, 20],
        "near_misses": [
            {
                "distance": 11,
                "uris": [sources["circle"], sources["square"]],
                "labels": ["circle", "square"],
                "splits": ["train", "test"],
            }
        ],
        "low_information_by_split": {"train": 5, "test": 1},
        "realised_split_fractions": {"train": 0.8125, "validation": 0.0938, "test": 0.0938},
    }
    add_near_duplicate_fields(data_dir, groups, summary)
    return data_dir


@pytest.fixture(scope="module")
def near_duplicate_dataset(corpus, tmp_path_factory):
    """A real `--near-duplicates keep` run over the corpus plus two altered copies: a smaller JPEG of a
    circle, and a square re-encoded as a JPEG under `cross` (a likely label error)."""
    planted = tmp_path_factory.mktemp("planted") / "corpus"
    shutil.copytree(corpus, planted)
    sources = make_sources(corpus, tmp_path_factory.mktemp("sources"))
    shutil.copy(sources["circle_copy"], planted / "circle" / "circle_0000_small.jpg")
    # As stage 1 decodes it (a transparent background is composited), then re-encoded.
    square = image_decode.decode_image(Path(sources["square"]).read_bytes(), max_pixels=1 << 30)
    Image.fromarray(square).save(planted / "cross" / "square_0000.jpg", quality=90)
    output = tmp_path_factory.mktemp("near_duplicate_dataset")
    run_stage1(planted, output, "--near-duplicates", "keep", image_size=32, encoding="uint8")
    return str(output)


def test_a_real_runs_groups_show_with_their_thumbnails(near_duplicate_dataset, browser, tmp_path):
    manifest = read_manifest(near_duplicate_dataset)
    assert manifest["near_duplicates"]["groups"] == 2, manifest["near_duplicates"]
    assert manifest["near_duplicates"]["groups_with_several_labels"] == 1
    state = page_state(browser, write_report(near_duplicate_dataset, tmp_path / "report.html"))
    assert browser.problems() == []
    not_loaded = [image["alt"] for image in state["images"] if not (image["complete"] and image["width"] > 0)]
    assert not_loaded == []
    groups = state["sections"]["groups"]
    assert "likely label error: labels cross, square" in groups
    assert "circle_0000_small.jpg" in groups and "square_0000.jpg" in groups
    assert "cannot read" not in groups
    assert "Showing 2 of 2 groups" in groups or "2 groups" in groups


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    try:
        binary = chromium.chromium_binary()
    except chromium.ChromiumMissing as exc:
        pytest.fail(str(exc))  # never a silent pass: the report's test needs a real browser
    opened = chromium.Browser(tmp_path_factory.mktemp("chromium-profile"), binary)
    yield opened
    opened.close()


def write_report(data_dir: str, path, *extra) -> str:
    assert inspect_lib.main([data_dir, "--report", str(path), *extra]) == 0
    return str(path)


def page_state(browser, path) -> dict:
    browser.open(path)
    return json.loads(browser.evaluate(PAGE_STATE))


def test_report_renders_in_chromium_with_every_image_loaded_and_no_console_error(
    audited_dataset, browser, tmp_path, capsys
):
    path = write_report(audited_dataset, tmp_path / "out" / "report.html", "--max-groups", "3")
    assert f"report: {path}" in capsys.readouterr().out
    state = page_state(browser, path)
    browser.screenshot(str(tmp_path / "report.png"))
    if SCREENSHOT_COPY:
        shutil.copy(tmp_path / "report.png", SCREENSHOT_COPY)

    assert browser.problems() == []
    assert state["headings"] == HEADINGS
    assert state["scripts"] == 0
    not_loaded = [image["alt"] for image in state["images"] if not (image["complete"] and image["width"] > 0)]
    assert not_loaded == []
    manifest = read_manifest(audited_dataset)
    per_class = manifest["splits"]["train"]["num_examples_per_class"]
    sheet = sum(min(8, count) for count in per_class.values())
    # The contact sheet's records, the 3 groups shown: 2 + (2 readable of 3) + 2 sources, and the near miss: 2.
    assert len(state["images"]) == sheet + 8
    text = state["text"]
    assert "Showing 3 of 4 groups (1 left out; raise --max-groups to see more)" in text
    assert "likely label error: labels cross, square" in text
    assert "cannot read the source: not found" in text and "deleted.png" in text
    assert "largest distance 5" in text
    groups = state["sections"]["groups"]
    assert "the largest 3, 2 moved between splits" in groups
    assert "Splits written: train 81.2% (asked 80%)" in groups
    assert "Distances of the pairs compared" in groups and "10 bits" in groups
    assert browser.evaluate("document.querySelector('tr.threshold th').textContent") == "10 bits"
    assert "Near misses" in groups and "distance 11" in groups
    assert "Near-blank and tiny images" in groups
    assert "≤ 64 px" in text and "> 8,192 px" in text and "largest 9000×120" in text


def test_failures_show_each_reason_with_example_uris_and_details(audited_dataset, browser, tmp_path):
    state = page_state(browser, write_report(audited_dataset, tmp_path / "report.html"))
    manifest = read_manifest(audited_dataset)
    failures = state["sections"]["failures"]
    for reason, count in manifest["inputs"]["failures_by_reason"].items():
        assert f"{reason}\t{count}" in failures
    with open(os.path.join(audited_dataset, manifest_lib.error_file_paths(manifest)[0])) as handle:
        error = json.loads(handle.readline())
    assert error["uri"] in failures
    assert error["detail"].splitlines()[0] in failures


def test_a_dataset_without_the_fields_says_they_were_not_recorded(dataset, browser, tmp_path):
    data_dir = copy_dataset(dataset, tmp_path / "dataset")
    manifest = read_manifest(data_dir)
    for field in ("near_duplicates", "near_duplicate_files", "source_image_sizes"):
        manifest.pop(field)  # as a dataset written before stage 1 recorded them
    write_manifest(data_dir, manifest)
    state = page_state(browser, write_report(data_dir, tmp_path / "report.html"))
    assert browser.problems() == []
    assert "Not recorded by this dataset's stage 1 run" in state["sections"]["sizes"]
    assert "Not recorded by this dataset's stage 1 run" in state["sections"]["groups"]


def test_a_dataset_with_the_audit_off_says_so(dataset, tmp_path):
    data_dir = copy_dataset(dataset, tmp_path / "dataset")
    manifest = read_manifest(data_dir)
    manifest.update(near_duplicates={"mode": "off"}, near_duplicate_files=[])
    write_manifest(data_dir, manifest)
    with open(write_report(data_dir, tmp_path / "report.html")) as handle:
        assert "The audit was off for this run (--near-duplicates off)." in handle.read()


INJECTED = "<script>window.injected = 1</script>"


def test_text_from_the_data_shows_as_text(dataset, browser, tmp_path):
    """Class names, URIs and error details carrying markup are shown, never run."""
    data_dir = copy_dataset(dataset, tmp_path / "dataset")
    manifest = read_manifest(data_dir)
    old_name, new_name = manifest["labels"][0], f"{manifest['labels'][0]}{INJECTED}"
    manifest["labels"][0] = new_name
    for info in manifest["splits"].values():
        info["num_examples_per_class"][new_name] = info["num_examples_per_class"].pop(old_name)
    error_path = manifest_lib.join(manifest["run"]["dir"], "errors-injected.jsonl")
    error = {"uri": f"/corpus/{INJECTED}.png", "reason": "truncated", "detail": f"<b>bold</b>{INJECTED}"}
    with open(os.path.join(data_dir, error_path), "w") as handle:
        handle.write(json.dumps(error) + "\n")
    manifest["error_files"].insert(0, {"path": error_path, "num_errors": 1, "num_bytes": 0, "sha256": ""})
    write_manifest(data_dir, manifest)
    member = f"/nowhere/{INJECTED}.png"
    add_near_duplicate_fields(
        data_dir,
        [group_line([(member, f"cat{INJECTED}", "train"), (member + "2", "dog", f"test{INJECTED}")], 2)],
        {"mode": "keep", "groups": 1, "images_in_groups": 2, "groups_with_several_labels": 1},
    )

    state = page_state(browser, write_report(data_dir, tmp_path / "report.html"))
    assert (state["scripts"], state["injected"]) == (0, "undefined")
    text = state["text"]
    assert f"{old_name}{INJECTED}" in text  # the class name
    assert (
        f"/corpus/{INJECTED}.png" in text and f"<b>bold</b>{INJECTED}" in text
    )  # the error's uri and detail
    assert f"cat{INJECTED}" in text and f"test{INJECTED}" in text  # a member's label and split
    assert browser.problems() == []


def test_a_directory_without_a_manifest_is_refused_in_a_few_lines(tmp_path):
    out = tmp_path / "report.html"
    result = run_command("preprocess.inspect", [tmp_path, "--report", out], cwd=tmp_path)
    assert_refused(result, "not a dataset", "dataset.json: not found")
    assert not out.exists()


def test_groups_with_several_labels_are_picked_first_and_the_rest_counted(tmp_path):
    lines = [group_line([(f"/s/{n}a", "cat", "train"), (f"/s/{n}b", "cat", "train")], 1) for n in range(4)]
    lines.insert(3, group_line([("/s/x", "cat", "train"), ("/s/y", "dog", "train")], 2))
    (tmp_path / "groups.jsonl").write_text("".join(line + "\n" for line in lines))
    manifest = {
        "near_duplicates": {"mode": "keep", "groups": 5},
        "near_duplicate_files": [{"path": "groups.jsonl", "num_groups": 5, "num_bytes": 0, "sha256": ""}],
    }
    selection = near_duplicate_groups.select_groups(str(tmp_path), manifest, max_groups=2)
    assert [group.labels for group in selection.groups] == [("cat", "dog"), ("cat",)]
    assert selection.groups[1].members[0].uri == "/s/0a"
    assert (selection.total_groups, selection.left_out) == (5, 3)


def test_source_thumbnails_stop_at_the_read_budget(corpus):
    source = str(corpus / "circle" / "circle_0000.png")
    size = os.path.getsize(source)
    budget = thumbnails.ReadBudget(remaining=size + size // 2)
    assert thumbnails.source_thumbnail(source, budget).data_uri.startswith("data:image/")
    assert (budget.num_read, budget.bytes_read) == (1, size)
    shown = thumbnails.source_thumbnail(source, budget)  # half the file's size is left
    assert shown.data_uri is None and "read budget" in shown.problem
    assert budget.num_read == 1


def test_a_missing_chromium_fails_with_the_install_step(monkeypatch):
    monkeypatch.setenv("CHROMIUM", "/nonexistent/chromium")
    with pytest.raises(chromium.ChromiumMissing, match="apt-get install -y --no-install-recommends chromium"):
        chromium.chromium_binary()


def test_the_browser_harness_sees_console_errors_exceptions_and_broken_images(browser, tmp_path):
    """So that the report's 'no problem' above is not vacuous."""
    page = tmp_path / "broken.html"
    page.write_text(
        '<!DOCTYPE html><html><body><img src="missing.png" alt="missing">'
        "<script>console.error('logged'); undefinedFunction();</script></body></html>"
    )
    state = page_state(browser, page)
    problems = browser.problems()
    assert any("console.error" in problem and "logged" in problem for problem in problems), problems
    assert any("exception" in problem and "undefinedFunction" in problem for problem in problems), problems
    assert any("missing.png" in problem for problem in problems), problems
    assert [(image["complete"], image["width"]) for image in state["images"]] == [(True, 0)]


def test_source_thumbnails_read_gs_and_say_why_a_missing_object_is_not_shown(corpus, dataset, gcs_dir):
    source = corpus / "square" / "square_0000.png"
    uri = f"{gcs_dir}/sources/square_0000.png"
    with tf.io.gfile.GFile(uri, "wb") as handle:
        handle.write(source.read_bytes())
    budget = thumbnails.ReadBudget(remaining=1 << 20)
    shown = thumbnails.source_thumbnail(uri, budget)
    assert shown.data_uri.startswith("data:image/") and budget.bytes_read == source.stat().st_size
    missing = thumbnails.source_thumbnail(f"{gcs_dir}/sources/gone.png", budget)
    assert (missing.data_uri, missing.problem) == (None, "cannot read the source: not found")
    report = f"{gcs_dir}/reports/report.html"
    assert inspect_lib.main([dataset, "--report", report]) == 0
    with tf.io.gfile.GFile(report, "r") as handle:
        assert "<h2>Near-duplicate groups</h2>" in handle.read()


def test_a_source_that_is_not_an_image_says_so(corpus):
    text = corpus / "not-an-image.png"
    text.write_text("hello")
    shown = thumbnails.source_thumbnail(str(text), thumbnails.ReadBudget(remaining=1 << 20))
    assert shown.data_uri is None and shown.problem.startswith("cannot decode the source: not_an_image")


def test_a_negative_max_groups_is_refused_in_a_few_lines(dataset, tmp_path, capsys):
    assert inspect_lib.main([dataset, "--report", str(tmp_path / "r.html"), "--max-groups", "-1"]) == 2
    assert "--max-groups must be 0 or more" in capsys.readouterr().err


def test_many_classes_show_the_smallest_and_the_largest():
    labels = [f"class{index:03d}" for index in range(100)]
    manifest = {
        "labels": labels,
        "splits": {
            "train": {"num_examples": 0, "num_examples_per_class": {n: i for i, n in enumerate(labels)}}
        },
    }
    shown, note = figures.shown_classes(manifest)
    assert shown == labels[:30] + labels[70:]
    assert note == "100 classes: showing the 30 smallest and the 30 largest (all splits together)"
    assert figures.examples_per_class(manifest).count("<tr>") == 1 + 60  # the head and 60 classes


def test_the_style_sheet_ships_in_the_sdist_and_in_the_wheel_built_from_it(tmp_path):
    # The page reads report.css through importlib.resources: an install without it could not render.
    from pipelines.dataflow import build_sdist  # noqa: PLC0415 - the sdist Dataflow and the TPU VM install

    sdist = build_sdist(str(tmp_path / "sdist"))
    with tarfile.open(sdist) as archive:
        assert any(name.endswith("preprocess/inspect/report/report.css") for name in archive.getnames())
    wheels = tmp_path / "wheel"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheels),
            sdist,
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = wheels.iterdir()
    with zipfile.ZipFile(wheel) as archive:
        assert "preprocess/inspect/report/report.css" in archive.namelist()
