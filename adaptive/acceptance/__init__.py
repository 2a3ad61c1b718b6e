"""The acceptance model: per-position, per-sequence probabilities that a draft token is
accepted, learned online from verify outcomes, with the numba kernels that compute them."""
