"""Helpers the benchmark scripts share."""
import torch


def tensors(tree) -> list:
    """The tensors in a nest of tuples and lists, in order."""
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, (tuple, list)):
        return [t for x in tree for t in tensors(x)]
    return []
