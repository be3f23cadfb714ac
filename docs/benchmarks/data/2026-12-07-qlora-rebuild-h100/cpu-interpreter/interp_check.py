import os
os.environ["TRITON_INTERPRET"] = "1"
import torch
from zerofit.models import nf4
from zerofit.models import nf4_kernel
torch.manual_seed(0)
for shape in [(128, 128), (256, 512), (64, 1024 * 3)]:
    w = (torch.randn(shape) * torch.logspace(-4, 1, shape[1])).to(torch.bfloat16)
    w[0, :64] = 0
    p = nf4.quantize(w)
    want = nf4.dequantize(p, shape, torch.bfloat16)
    got = nf4_kernel.rebuild_bf16(*(p[n] for n in nf4.PIECES), nf4.LEVELS).view(shape)
    diff = (got.float() != want.float())
    print(shape, "equal:", torch.equal(got, want), "differ:", int(diff.sum()), "of", got.numel())
    if diff.any():
        i = diff.nonzero()[:5]
        print(i.tolist(), got[diff][:5].tolist(), want[diff][:5].tolist())
