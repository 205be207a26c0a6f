"""The device path (every built-in processor, standardise_all, the scores copy) reads nothing
back to the host and is graph safe: under the static twin (graphs.StepGraph(capture=False)) the
same ops run at every call whatever the values (lengths, drafts, pads), no state is rebound,
and no tensor is created without an explicit device. A user processor is not graph safe, and
the twin says so."""
import pytest
import torch
from torch.overrides import TorchFunctionMode

from specdec_fast.engine.graphs import GraphSafetyError, OpTrace, StepGraph, state_tensors
from specdec_fast.kernels.sampling_params import make_sampling_tensors
from specdec_fast.processing import LogitsProcessing, copy_emitted_scores_

from ..implicit_device import ImplicitDeviceFactories
from .cases import random_case

EOS = 3
EVERYTHING = dict(sequence_bias=[[[2], 1.0], [[1, 2], 0.5], [[4, 4, 1], -1.0]], repetition_penalty=1.2,
                  frequency_penalty=0.3, presence_penalty=0.2, no_repeat_ngram_size=3, bad_words_ids=[[6], [5, 1]],
                  min_length=12, min_new_tokens=4, suppress_tokens=[7], begin_suppress_tokens=[1], eos_token_id=EOS,
                  do_sample=True, typical_p=0.9, epsilon_cutoff=1e-3, eta_cutoff=1e-3, forced_eos_token_id=[EOS, 9],
                  exponential_decay_length_penalty=(1, 1.3), forced_bos_token_id=2, max_new_tokens=5,
                  remove_invalid_values=True)


HOST_READS = {"tolist", "item", "__bool__", "__int__", "__float__", "__index__", "numpy", "cpu", "nonzero"}


class HostReads(TorchFunctionMode):
    """Tensor methods that read values on the host (on a CPU tensor tolist / item never reach
    the dispatcher, so OpTrace alone would not see them), and boolean-mask indexing."""

    def __init__(self):
        super().__init__()
        self.reads = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        index = args[1] if name in ("__getitem__", "__setitem__") and len(args) > 1 else None
        if name in HOST_READS or (isinstance(index, torch.Tensor) and index.dtype == torch.bool):
            self.reads.append(name)
        return func(*args, **(kwargs or {}))


class Step:
    """A decoding step's processing on static buffers: state updated in place between calls."""

    def __init__(self, processing, case):
        self.processing = processing
        self.seq, self.end, self.start = case.seq.clone(), case.end.clone(), case.start.clone()
        self.drafts, self.logits = case.drafts.clone(), case.logits.clone()
        self.params = make_sampling_tensors(case.seq.shape[0], "cpu", temperature=0.9, top_k=20, top_p=0.9)
        self.scores = torch.zeros(case.seq.shape[0], 32, case.logits.shape[-1])
        self.gen_len = self.end - case.prompt_width

    def load(self, case):
        for name in ("seq", "end", "start", "drafts", "logits"):
            getattr(self, name).copy_(getattr(case, name))
        self.gen_len.copy_(case.end - case.prompt_width)

    def __call__(self):
        self.processing.apply_(self.logits, self.seq, self.end, self.drafts, start=self.start)
        copy_emitted_scores_(self.scores, self.processing.standardise(self.logits, self.params), self.gen_len)


def cases(n=4, count=4):
    # different lengths, pads and drafts each call; a row at gen_len 0 (begin_suppress), short prompts
    return [random_case(seed, n=n, gen_lens=[0, seed + 1, 2 * seed]) for seed in range(count)]


def processing_for(case, **extra):
    return LogitsProcessing(vocab_size=case.logits.shape[-1], prompt_width=case.prompt_width, device="cpu",
                            fused_penalties=False, **EVERYTHING, **extra)


@pytest.mark.parametrize("n", [1, 4])
def test_device_path_never_syncs_and_creates_no_device_less_tensor(n):
    all_cases = cases(n)
    step = Step(processing_for(all_cases[0]), all_cases[0])
    assert step.processing.graph_safe and step.processing.penalties_here and step.processing.warpers_here
    with OpTrace() as trace, ImplicitDeviceFactories() as factories, HostReads() as reads:
        for case in all_cases:
            step.load(case)
            step()
    assert trace.sync_ops() == [] and factories.calls == [] and reads.reads == []


def test_host_read_detector_sees_the_user_path():
    case = random_case(0)
    processing = LogitsProcessing(vocab_size=case.logits.shape[-1], prompt_width=case.prompt_width, device="cpu",
                                  logits_processor=[lambda ids, scores: scores])
    with HostReads() as reads:
        processing.apply_(case.logits.clone(), case.seq, case.end, case.drafts)
    assert "tolist" in reads.reads


def test_static_twin_replays_the_same_ops_whatever_the_values():
    all_cases = cases()
    step = Step(processing_for(all_cases[0]), all_cases[0])
    graph = StepGraph(step, name="processing", capture=False, warmup=1,
                      state=lambda: state_tensors({"step": step, "processing": step.processing}))
    for case in all_cases:
        step.load(case)
        graph()
    assert graph.replays == len(all_cases) - 1


def test_a_user_processor_is_refused_by_the_static_twin():
    case = random_case(0)
    processing = LogitsProcessing(vocab_size=case.logits.shape[-1], prompt_width=case.prompt_width, device="cpu",
                                  logits_processor=[lambda ids, scores: scores])
    assert not processing.graph_safe
    step = Step(processing, case)
    graph = StepGraph(step, name="processing", capture=False, warmup=1,
                      state=lambda: state_tensors({"step": step, "processing": processing}))
    graph()  # warm-up
    graph()  # the capture call
    step.load(random_case(1))  # other lengths: other input_ids shapes for the user's code
    with pytest.raises(GraphSafetyError, match="op sequence differs"):
        graph()
