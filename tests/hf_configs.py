"""Small Hugging Face config.json contents for tests (nothing comes from a hub): a Llama-3.2-style model
(llama3 rope scaling, tied embeddings) and a Qwen2-style one (bias on q/k/v, untied), 2 layers, float32;
and the same as transformers saves them, with the fields H2 reads past (dtype, token ids, version). A
model folder is written with `write_config`, and its weights by transformers itself (`transformers_model`)."""

import json
import os

import torch
import transformers

LLAMA_32 = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 256, "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "rope_scaling": {
        "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16
    }, "tie_word_embeddings": True, "hidden_act": "silu", "torch_dtype": "float32"
}
QWEN2 = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 256, "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": False,
    "use_sliding_window": False, "hidden_act": "silu", "torch_dtype": "float32"
}
LLAMA_32_SAVED = LLAMA_32 | {
    "torch_dtype": "bfloat16", "bos_token_id": 128000, "eos_token_id": 128001, "transformers_version": "4.45.0",
    "use_cache": True, "attention_bias": False, "mlp_bias": False, "pretraining_tp": 1, "initializer_range": 0.02
}
QWEN2_SAVED = QWEN2 | {
    "sliding_window": 4096, "max_window_layers": 2, "torch_dtype": "bfloat16", "bos_token_id": 151643,
    "eos_token_id": 151645, "attention_dropout": 0.0
}


def write_config(folder, data: dict) -> str:
    """`data` as FOLDER/config.json; its path."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "config.json")
    with open(path, "w") as handle:
        json.dump(data, handle)
    return path


def transformers_model(folder, data: dict, seed: int, bias_std: float) -> torch.nn.Module:
    """FOLDER/config.json of `data` and the model transformers initialises from it (seeded, fp32), its
    biases drawn with `bias_std` (transformers initialises them to zero, where they would not count);
    the caller saves it."""
    write_config(folder, data)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(folder),
                                                          dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(std=bias_std)
    return model
