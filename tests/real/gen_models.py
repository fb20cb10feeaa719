"""Make a tiny random Qwen3 target with a tokenizer and the tiny DFlash drafters of the real run.

The weights are random, the files are real (transformers writes the target, safetensors the drafters).
usage: python3 tests/real/gen_models.py OUTDIR   → OUTDIR/{target, drafter, drafter2, drafter-nomask,
drafter-missing}; prints {"mask_token_id", "eos", "vocab"} as JSON.

* drafter: 1-layer DFlashDraftModel, block_size 8, dflash_config.mask_token_id = <|mask|>, taps [0, 1, 2],
  with mask_embedding.pt (dict form);
* drafter2: the same shape, other random weights (the second drafter swap-drafter moves to);
* drafter-nomask: drafter without mask_embedding.pt (sparkserve refuses it);
* drafter-missing: drafter without layers.0.mlp.down_proj.weight (real vLLM boots it silently;
  sparkserve's completeness pre-flight refuses it).
Adapted from ../shared/realvllm/gen_models.py (ours), the generator of the first real run.
"""
import json
import os
import random
import sys

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

out = sys.argv[1]
tgt, drf, drf2, drf_nomask, drf_missing = (os.path.join(out, d) for d in (
    "target", "drafter", "drafter2", "drafter-nomask", "drafter-missing"))
for d in (tgt, drf, drf2, drf_nomask, drf_missing):
    os.makedirs(d, exist_ok=True)

random.seed(0)
torch.manual_seed(0)
syll = ["ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "ve", "da", "xi", "zo", "an", "el", "or"]
corpus = [" ".join("".join(random.choice(syll) for _ in range(random.randint(1, 4))) for _ in range(30))
          for _ in range(4000)]
specials = ["<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>", "<think>", "</think>"]
tok = Tokenizer(models.BPE(unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=1000, special_tokens=specials,
                                                     initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<|endoftext|>",
                               pad_token="<|endoftext|>")
fast.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                      "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                      "{% if enable_thinking is defined and enable_thinking %}<think>\n{% endif %}{% endif %}")
fast.save_pretrained(tgt)
eos = fast.convert_tokens_to_ids("<|endoftext|>")
mask_id = fast.convert_tokens_to_ids("<|mask|>")

H, FF, NH, KVH, HD, V = 256, 512, 4, 2, 64, 1024
cfg = Qwen3Config(vocab_size=V, hidden_size=H, intermediate_size=FF, num_hidden_layers=4,
                  num_attention_heads=NH, num_key_value_heads=KVH, head_dim=HD,
                  max_position_embeddings=8192, rope_theta=1_000_000.0, tie_word_embeddings=False,
                  eos_token_id=eos, bos_token_id=None, pad_token_id=eos)
model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
model.save_pretrained(tgt, safe_serialization=True)

taps = [0, 1, 2]
dcfg = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": H,
        "intermediate_size": FF, "num_hidden_layers": 1, "num_attention_heads": NH,
        "num_key_value_heads": KVH, "head_dim": HD, "vocab_size": V, "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0, "max_position_embeddings": 8192, "hidden_act": "silu",
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "block_size": 8,
        "target_hidden_size": H, "num_target_layers": 4,
        "dflash_config": {"mask_token_id": mask_id, "target_layer_ids": taps}}


def g(*s):
    return (torch.randn(*s) * 0.02).to(torch.bfloat16)


def ones(n):
    return torch.ones(n, dtype=torch.bfloat16)


def drafter_weights(seed):
    torch.manual_seed(seed)
    p = "layers.0."
    return {p + "self_attn.q_proj.weight": g(NH * HD, H), p + "self_attn.k_proj.weight": g(KVH * HD, H),
            p + "self_attn.v_proj.weight": g(KVH * HD, H), p + "self_attn.o_proj.weight": g(H, NH * HD),
            p + "self_attn.q_norm.weight": ones(HD), p + "self_attn.k_norm.weight": ones(HD),
            p + "input_layernorm.weight": ones(H), p + "post_attention_layernorm.weight": ones(H),
            p + "mlp.gate_proj.weight": g(FF, H), p + "mlp.up_proj.weight": g(FF, H),
            p + "mlp.down_proj.weight": g(H, FF), "fc.weight": g(H, H * len(taps)),
            "hidden_norm.weight": ones(H), "norm.weight": ones(H)}


missing = drafter_weights(100)
del missing["layers.0.mlp.down_proj.weight"]
for d, w in ((drf, drafter_weights(100)), (drf2, drafter_weights(200)), (drf_nomask, drafter_weights(100)),
             (drf_missing, missing)):
    save_file(w, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(dcfg, f, indent=2)
    if d != drf_nomask:
        torch.save({"embedding": g(H), "mask_token_id": mask_id}, os.path.join(d, "mask_embedding.pt"))
print(json.dumps({"mask_token_id": mask_id, "eos": eos, "vocab": len(fast)}))
