"""Runs of an offline LLM to compare the C decoder loop with the torch modules: the model it runs, random prompts
(one repeating two others, for the prefix cache) and their greedy tokens with logprobs."""

import torch

from common.sampling_params import SamplingParams


def runner_model(llm):
    return llm.client.core.executor.runner.model


def random_prompts(n: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 90, (n,), generator=g).tolist()
    prompts = [torch.randint(200, 40000, (k,), generator=g).tolist() for k in lengths]
    return prompts + [prompts[0] + prompts[1]]  # its first blocks come from the prefix cache


def greedy_run(llm, prompts):
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=3)
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in llm.generate(prompts, params, use_tqdm=False)]
