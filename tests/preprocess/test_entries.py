"""Each folder's entry (its `__init__.py`) names what pipeline.py calls, and imports it only on first use."""

from tests.cli_probe import run_fresh_python

FOLDERS = ("decode", "inputs", "launch", "near_duplicates", "publish", "reuse", "write")


def test_importing_the_folders_loads_no_beam_until_a_name_is_used():
    # The command line's checks import a light module of inputs/; a listing worker, of inputs/ and reuse/.
    script = (
        "import importlib, sys\n"
        f"folders = [importlib.import_module('preprocess.' + name) for name in {FOLDERS!r}]\n"
        "print('apache_beam' in sys.modules)\n"
        "for folder in folders:\n"
        "    for name in folder.__all__:\n"
        "        getattr(folder, name)\n"
        "print('apache_beam' in sys.modules, [m for m in ('tensorflow', 'tensorflow_transform') if m in sys.modules])\n"
    )
    result = run_fresh_python(script)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split("\n")[:2] == ["False", "True []"]
