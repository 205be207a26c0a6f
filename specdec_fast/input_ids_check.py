"""Every token id of a prompt checked against the target's vocabulary before decoding starts: an id
outside [0, vocab_size) would otherwise surface as an IndexError (or a device-side assert on CUDA)
from inside torch's embedding. One host read (min and max together), before the loop."""
import torch


def check_in_vocabulary(input_ids: torch.Tensor, vocab_size: int) -> None:
    """Raise ValueError naming input_ids, the offending id and the vocabulary size when an id of
    ``input_ids`` (every position, left padding included: the model embeds it too) is < 0 or
    >= ``vocab_size``."""
    low, high = torch.stack(torch.aminmax(input_ids)).tolist()  # the one host read
    bad = low if low < 0 else high if high >= vocab_size else None
    if bad is not None:
        raise ValueError(f"input_ids holds token id {bad}, outside the target's vocabulary of size {vocab_size} "
                         f"(ids must be in [0, {vocab_size}))")
