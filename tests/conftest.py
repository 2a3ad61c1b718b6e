import torch

torch.set_num_threads(1)  # tests measure behaviour, not speed; one thread keeps them predictable
