import os
from pathlib import Path

import torch

torch.set_num_threads(1)  # tests measure behaviour, not speed; one thread keeps them predictable

import pytest  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def ray_session():
    """One embedded local Ray (2 CPUs, no dashboard) shared by every test that asks for it:
    starting one costs seconds. Tests must kill the actors they create."""
    ray = pytest.importorskip("ray")
    # Ray's workers import specdepth as installed; tests' factories ("tests.pairs:...") need the checkout.
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, paths)])
    from specdepth.adaptive.replicas.ray_local import init_ray

    started = init_ray(num_cpus=2)
    yield ray
    if started:
        ray.shutdown()
