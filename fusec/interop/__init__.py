"""fusec with other libraries' arrays: torch tensors in and out (`torch_arrays`),
pipelines as torch.library custom ops (`torch_op`). Nothing here imports torch
until a tensor or an op asks for it."""
