import torch

torch.set_num_threads(1)  # tests measure behaviour, not speed; one thread keeps them predictable

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def ray_session():
    """One embedded local Ray (2 CPUs, no dashboard) shared by every test that asks for it:
    starting one costs seconds. Tests must kill the actors they create."""
    ray = pytest.importorskip("ray")
    from adaptive.cluster import init_ray

    started = init_ray(num_cpus=2)
    yield ray
    if started:
        ray.shutdown()
