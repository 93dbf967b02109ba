"""The CUDA JIT cache: persistent and 4 GiB, set before TensorFlow is imported, a user's own values kept.

No GPU is reachable here, so what is held is what can be: the environment
the CUDA driver would read at cuInit, as `python -m train` leaves it at the
moment TensorFlow is imported.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from train.device import cuda_cache

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

# Records the CUDA variables at the moment `import tensorflow` starts, then runs the `main` of the module
# given (`python -m train`, `python -m train.tools.bench_input`), which stops with status 2 (no dataset) after
# importing TensorFlow.
SCRIPT = textwrap.dedent(
    """
    import importlib, importlib.abc, json, os, sys

    seen = {}

    class RecordAtImport(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "tensorflow" and not seen:
                seen.update({key: os.environ.get(key) for key in ("CUDA_CACHE_PATH", "CUDA_CACHE_MAXSIZE")})
            return None

    sys.meta_path.insert(0, RecordAtImport())
    main = importlib.import_module(sys.argv[3]).main
    argv = ["--data", sys.argv[1]] + (["--model-dir", sys.argv[2]] if sys.argv[3] == "train.__main__" else [])
    status = main(argv)
    print("RESULT " + json.dumps({"status": status, "imported": "tensorflow" in sys.modules, "seen": seen}))
    """
)


def test_unset_variables_get_a_persistent_directory_and_4_gib(tmp_path):
    environ = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    chosen = cuda_cache.configure_cuda_cache(environ)
    path = str(tmp_path / "cache" / "tf-image-pipeline" / "cuda-jit")
    assert chosen == {"CUDA_CACHE_PATH": path, "CUDA_CACHE_MAXSIZE": str(4 * 1024**3)}
    assert environ["CUDA_CACHE_PATH"] == path and os.path.isdir(path)


def test_a_users_own_values_are_kept(tmp_path):
    environ = {"HOME": str(tmp_path), "CUDA_CACHE_PATH": "/mine", "CUDA_CACHE_MAXSIZE": "1000"}
    assert cuda_cache.configure_cuda_cache(environ) == {}
    assert (environ["CUDA_CACHE_PATH"], environ["CUDA_CACHE_MAXSIZE"]) == ("/mine", "1000")


@pytest.mark.parametrize("module", ["train.__main__", "train.tools.bench_input"])
def test_python_m_train_and_bench_input_set_the_cache_before_tensorflow_is_imported_and_keep_a_users_size(
    tmp_path, module
):
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("CUDA_CACHE_PATH", "XDG_CACHE_HOME", "CUDA_CACHE_MAXSIZE")
    }
    env.update(
        PYTHONPATH=REPO,
        HOME=str(tmp_path / "home"),
        CUDA_CACHE_MAXSIZE="123456",
        TF_CPP_MIN_LOG_LEVEL="2",
        TPU_LOAD_LIBRARY="0",
    )
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "no-dataset"), str(tmp_path / "model"), module],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    line = next((line for line in result.stdout.splitlines() if line.startswith("RESULT ")), None)
    assert line, result.stderr[-3000:]
    report = json.loads(line[len("RESULT ") :])
    assert report["status"] == 2 and report["imported"]  # TensorFlow was imported, then the dataset refused
    expected = str(tmp_path / "home" / ".cache" / "tf-image-pipeline" / "cuda-jit")
    assert report["seen"] == {"CUDA_CACHE_PATH": expected, "CUDA_CACHE_MAXSIZE": "123456"}
    assert os.path.isdir(expected)
