"""Running a command as a user would, and what a user's mistake must get: exit 2, a few lines, no traceback.

Also small real corpora: images written with Pillow, and files that are not images.
"""

import os
import re
import subprocess
import sys

from PIL import Image

from tests.cli_probe import REPO

# TensorFlow's C++ start-up lines (another concern than this one's: the libraries' own noise).
_LIBRARY_NOISE = ("I0000 ", "W0000 ", "E0000 ", "WARNING: All log messages before absl")
# A local run's progress line ("[0:03] hashed 12 (4.0/s) | ..."): the run's, not the mistake's.
_PROGRESS = re.compile(r"^\[\d+:\d\d\] ")


def command_env(extra: dict | None = None) -> dict:
    return {
        **os.environ,
        "PYTHONPATH": REPO,
        "NO_GCE_CHECK": "true",
        "TPU_LOAD_LIBRARY": "0",
        **(extra or {}),
    }


def run_command(module: str, args, cwd, timeout: float = 300, env: dict | None = None):
    """`python -m module *args` in a fresh interpreter, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", module, *map(str, args)],
        cwd=cwd,
        env=env or command_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def said_lines(text: str) -> list[str]:
    """The non-empty lines of `text`, TensorFlow's C++ start-up lines left out."""
    return [line for line in text.splitlines() if line.strip() and not line.startswith(_LIBRARY_NOISE)]


def assert_refused(result, *named: str, max_lines: int = 4) -> str:
    """A user's mistake: exit 2, no traceback, every string of `named` said, in at most `max_lines` lines
    (besides a run's progress lines)."""
    output = result.stdout + result.stderr
    said = [line for line in said_lines(output) if not _PROGRESS.match(line)]
    assert result.returncode == 2, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    for text in named:
        assert text in output, output[-3000:]
    assert len(said) <= max_lines, "\n".join(said)
    return output


def write_image(path, index: int, size=(24, 20), fmt=None) -> None:
    """A small distinct RGB image (its colour from `index`), in the format its extension names."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    colour = ((index * 53) % 256, (index * 97 + 40) % 256, (index * 31 + 90) % 256)
    image = Image.new("RGB", size, colour)
    image.putpixel((index % size[0], (index // size[0]) % size[1]), (255 - colour[0], 0, 0))
    image.save(path, format=fmt)


def write_text(path, text: str) -> None:
    path = os.fspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        handle.write(text)
