"""gdr: the gated delta rule (Gated DeltaNet / Qwen3-Next / Kimi Linear) for PyTorch.

    import gdr
    o, final_state = gdr.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0,
                                                output_final_state=True)
    o, final_state = gdr.fused_recurrent_gated_delta_rule(q, k, v, g, beta=beta, ...)
    o = gdr.decode_step(q, k, v, g, beta, state_pool, state_indices)   # state updated in place

The same computations are registered as torch.ops.gdr.forward / backward / decode_ (autograd
and torch.compile(fullgraph=True) work through them). Arguments and layouts follow
flash-linear-attention; see gdr._api for what gdr adds (per-key gates, mask, state layout, gate
and beta sigmoid in kernel, path selection).
"""

import torch  # noqa: F401  (loads the CUDA runtime torch was built with before gdr._C)

from . import _C
from ._api import chunk_gated_delta_rule, decode_step, fused_recurrent_gated_delta_rule
from ._ops import backward as backward_op
from ._ops import decode_ as decode_op
from ._ops import forward as forward_op

__version__ = _C.__version__


def cuda_available() -> bool:
    """True when this build of gdr has its CUDA paths compiled in."""
    return bool(_C.cuda_available())


__all__ = [
    "chunk_gated_delta_rule",
    "fused_recurrent_gated_delta_rule",
    "decode_step",
    "forward_op",
    "backward_op",
    "decode_op",
    "cuda_available",
    "__version__",
]
