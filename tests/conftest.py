import os

import pytest
import torch

if not torch.cuda.is_available():
    # Triton's CPU interpreter for the kernel tests. @triton.jit reads the variable when a kernel module is imported,
    # and any earlier test may import one (the layer test walks every module), so it is set before any test runs.
    os.environ.setdefault("TRITON_INTERPRET", "1")

if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    # pytest-xdist runs one worker per core: each takes its share of the cores' threads, so that the workers' OpenMP
    # threads do not outnumber the cores (on shared cores spinning threads can slow a step 10x).
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models gain nothing from threads, and on shared cores spinning OpenMP threads can slow steps 10x: a
    training test module uses one (``pytestmark = pytest.mark.usefixtures("one_thread")``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """One data cache (tokens, tokenizer, matmul peak) shared by the tests of a module."""
    return str(tmp_path_factory.mktemp("cache"))
