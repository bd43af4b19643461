"""What the bench scripts share: the two benchmark settings, the model directory every run loads, the probe that
records which dtype the matmuls really ran in, and loading a grpo.py from any path."""

import importlib.util
import inspect
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(1, ROOT)  # grpo.py and testing_utils.py; index 0 stays the running script's folder

PRESETS = {  # the two benchmark settings
    "tiny": {"batch_prompts": 1, "G": 8, "new_tokens": 32},
    "smollm2": {"batch_prompts": 2, "G": 8, "new_tokens": 64},
}


def prepare_model(name, cache):
    """A directory all implementations load with from_pretrained: the same fp32 weights everywhere."""
    path = os.path.join(cache, name)
    if os.path.isfile(os.path.join(path, "config.json")):
        return path
    import torch
    import grpo
    if name == "tiny":
        from testing_utils import make_tiny_model
        return make_tiny_model(path, seed=0, n_layer=2, n_embd=64)  # GPT-2, 2 layers, width 64, char tokenizer
    # SmolLM2 ships as GGUF; TRL builds its reference model with from_pretrained(path), so save plain weights once
    model, tokenizer = grpo.load_model("smollm2", torch.device("cpu"))[:2]  # [:2]: older ones also return eos_ids
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def probe_compute_dtype(model, seen, label="policy", copy_label="ref"):
    """Record, per call, the output dtype of the model's first weight matrix (q_proj, c_attn, ...) into
    seen['<label> <phase>'], phase 'decode' (one new token per row) or 'forward' (longer inputs): the dtype the
    matmuls really ran in. A deepcopy of the model (a reference model) keeps the hook and records as copy_label."""
    layer = next(m for m in model.modules() if getattr(m, "weight", None) is not None and m.weight.dim() == 2
                 and "Embedding" not in type(m).__name__)

    def hook(module, inputs, output):
        x = inputs[0] if inputs else None
        phase = "decode" if x is not None and x.dim() == 3 and x.shape[1] == 1 else "forward"
        seen.setdefault(f"{label if module is layer else copy_label} {phase}", set()).add(str(output.dtype)[6:])
    return layer.register_forward_hook(hook)


def as_lists(seen):
    return {k: sorted(v) for k, v in seen.items()}


def load_grpo(path):
    """The grpo.py at `path` as a module, registered as `grpo` (a checkout's, or an older one to compare with)."""
    spec = importlib.util.spec_from_file_location("grpo", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["grpo"] = module
    spec.loader.exec_module(module)
    return module


def group_size(grpo, G):
    """generate's keyword for G answers per prompt: G in this grpo.py, repeat in older ones."""
    return {"G": G} if "G" in inspect.signature(grpo.generate).parameters else {"repeat": G}


def generate_fixed_length(grpo, model, tokenizer, prompts, N, G, temperature, dtype):
    """grpo.generate of G answers per prompt that never end early (no EOS ids: every answer has N tokens), with the
    matmuls in `dtype`, for this grpo.py and older ones. This one reads the EOS ids from the model's generation config
    (emptied for the call) and leaves autocast to its caller; older ones took eos_ids, and once they had --dtype, a
    dtype; before that, generate ran fp32 on CPU unless autocast was already on."""
    import contextlib
    import torch
    params = inspect.signature(grpo.generate).parameters
    region = torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16")  # grpo.autocast, on CPU
    if "eos_ids" not in params:
        eos = model.generation_config.eos_token_id
        model.generation_config.eos_token_id = []
        try:
            with region:
                return grpo.generate(model, tokenizer, prompts, N, temperature=temperature, G=G)
        finally:
            model.generation_config.eos_token_id = eos
    kwargs = {"dtype": dtype} if "dtype" in params else {}
    with contextlib.nullcontext() if kwargs else region:
        return grpo.generate(model, tokenizer, prompts, [], N, temperature=temperature, **group_size(grpo, G), **kwargs)
