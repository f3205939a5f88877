"""PEFT LoRA adapters made for the tests: random factors (peft starts lora_B at zero, which would test nothing),
saved with save_pretrained; and transformers + peft references."""

import torch


def randomise_lora(model, seed: int, scale: float = 0.5) -> None:
    """Every lora_A / lora_B of a peft model drawn from a seeded generator, sized so the delta matters."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ("lora_A" in name or "lora_B" in name) and p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=generator) * scale / p.shape[1] ** 0.5)


def make_adapter(base_model, folder: str, seed: int, r: int = 8, alpha: int = 16, targets=("q_proj", "v_proj"),
                 **config) -> str:
    """An adapter over the transformers model `base_model` (left as it was) saved in `folder`."""
    from peft import LoraConfig, get_peft_model

    lora_config = LoraConfig(r=r, lora_alpha=alpha, target_modules=list(targets), lora_dropout=0.0, **config)
    peft_model = get_peft_model(base_model, lora_config)
    try:
        randomise_lora(peft_model, seed)
        peft_model.save_pretrained(folder)
    finally:
        peft_model.unload()  # the base model's modules back, without the adapter
    return folder


def peft_logprobs(base_model, adapter: str | None, tokens: list[int]) -> torch.Tensor:
    """Log-softmax [len(tokens), vocab] of the base model with the adapter applied (None: without), float32."""
    model = base_model
    if adapter is not None:
        from peft import PeftModel
        model = PeftModel.from_pretrained(base_model, adapter)
    try:
        with torch.no_grad():
            return torch.log_softmax(model(torch.tensor([tokens])).logits[0].float(), dim=-1)
    finally:
        if adapter is not None:
            model.unload()


def peft_greedy(base_model, adapter: str | None, prompt: list[int], max_tokens: int) -> tuple[list[int], list[float]]:
    """Greedy tokens and their logprobs, one forward per token (no cache: the plain reference)."""
    tokens, logprobs = list(prompt), []
    for _ in range(max_tokens):
        row = peft_logprobs(base_model, adapter, tokens)[-1]
        token = int(row.argmax())
        tokens.append(token)
        logprobs.append(float(row[token]))
    return tokens[len(prompt):], logprobs
