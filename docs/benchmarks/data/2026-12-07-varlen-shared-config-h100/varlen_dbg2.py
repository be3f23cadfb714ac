import importlib.util, sys
print("find_spec", importlib.util.find_spec("torchao"))
import torch, transformers
from zerofit.models import hf_attention as va
from zerofit.models.hf_head import HFCausalLM
cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8,
    num_key_value_heads=2, vocab_size=512, max_position_embeddings=1024)
va.register()
gen = torch.Generator().manual_seed(1)
tokens = torch.randint(0, 512, (4, 384), generator=gen).cuda()
targets = torch.randint(0, 512, (4, 384), generator=gen).cuda()
positions = torch.cat([torch.arange(n) for n in [200, 120, 64]]).repeat(4, 1).cuda()
out = {}
models = {}
for impl, dt in ((va.NAME, torch.bfloat16), ("sdpa", torch.bfloat16), ("sdpa", torch.float32)):
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=impl)
    models[(impl, dt)] = (hf, HFCausalLM(hf.to("cuda", dt), loss_chunk=128, fused=True))
for (impl, dt), (hf, m) in models.items():
    print(impl, "embed ptr", hf.model.embed_tokens.weight.data_ptr(), m.hf.get_input_embeddings().weight.data_ptr())
    loss = m(tokens, targets, positions); loss.backward()
    out[(impl, str(dt))] = (loss.item(), {n: p.grad.float() for n, p in m.named_parameters()})
    print(impl, dt, loss.item(), "tied", hf.config.tie_word_embeddings)
ref = out[("sdpa", "torch.float32")][1]
for key, (l, g) in out.items():
    worst = sorted(((((g[n] - ref[n]).norm() / ref[n].norm()).item(), n) for n in ref), reverse=True)[:4]
    print(key, l, [(round(a, 4), n) for a, n in worst])
