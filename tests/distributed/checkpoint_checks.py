"""The check every checkpoint-reading test makes: a rank's slices read from the safetensors equal the shards
of the model they were written from (runners/sharding.py: shards_from_safetensors against shards_from_state)."""
import torch

from specdec_fast.runners.sharding import LlamaShardPlan, shards_from_safetensors, shards_from_state


def assert_reads_as_the_model(path, model, world: int, rank: int, dtype=None) -> dict:
    """Rank ``rank`` of ``world``'s shards read from the checkpoint at ``path`` (cast to ``dtype``: None as
    stored) have the names of ``model``'s shards and equal them tensor for tensor -> the shards read."""
    plan = LlamaShardPlan.for_config(model.config, world, rank)
    read = shards_from_safetensors(str(path), plan, dtype=dtype)
    expected = shards_from_state(model.state_dict(), plan)
    assert read.keys() == expected.keys()
    for name, tensor in read.items():
        assert torch.equal(tensor, expected[name]), (rank, name)
    return read
