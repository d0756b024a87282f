"""Shared fixtures for kiln's Python oracle tests (run by scripts/test.sh through .venv)."""
import os
import pathlib
import shutil

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Where the kiln processes the tests start run the model: -ngl for every `kiln` command line.
# Default 0 (the CPU, whose arithmetic the llama.cpp-oracle tests hold bit for bit); a GPU run of
# the suite sets KILN_TEST_NGL=all (docs/gpu.md). Servers on a GPU also get --batch-invariant: the
# suite checks that cache hits, concurrent slots and n > 1 give the text of a lone cold request.
NGL = os.environ.get("KILN_TEST_NGL", "0")
NGL_ARGS = ["-ngl", NGL]
SERVE_GPU_ARGS = ["--batch-invariant"] if NGL != "0" else []


def _build_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("KILN_BUILD", ROOT / "build"))


@pytest.fixture(scope="session")
def root() -> pathlib.Path:
    return ROOT


@pytest.fixture(scope="session")
def build_dir() -> pathlib.Path:
    return _build_dir()


@pytest.fixture(scope="session")
def kiln_bin() -> pathlib.Path:
    p = pathlib.Path(os.environ.get("KILN_BIN", _build_dir() / "bin" / "kiln"))
    if not p.exists():
        pytest.fail(f"kiln binary not built: {p} (run `make build`)")
    return p


@pytest.fixture(scope="session")
def shared_data() -> pathlib.Path:
    """../shared/data next to the checkout (llama.cpp vocab files, chat templates)."""
    p = ROOT.parent / "shared" / "data"
    if not p.exists():
        pytest.skip(f"shared test data not found at {p}")
    return p


@pytest.fixture(scope="session")
def work_dir(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("kiln")
