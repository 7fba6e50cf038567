"""The libraries a trace's program ran on, told once from its names: a recommender's sharded embeddings
(TorchRec), a mixture-of-experts model, Megatron-Core, DeepSpeed. Each fix's preconditions read them
(``advice.preconditions``): an embedding all-to-all is never tuned as an MoE router's, a CUDA-graph capture is
never proposed around an all-to-all whose sizes are exchanged at run time. ``tests/test_stack.py`` checks the
table against every trace the project holds."""

from __future__ import annotations

import re

from gpuidle.model import Timeline

TORCHREC = re.compile(
    r"KJTAllToAll|KJTList|KJTSplits|PooledEmbeddingsAwaitable|All2All_Pooled|sparse_data_dist|## all2all_data"
    r"|torchrec|split_embedding_codegen_lookup"
)
"""TorchRec's sharded embeddings: its awaitables (``## KJTAllToAllTensorsAwaitable wait() ##``), the sparse data
distribution (``## wait_sparse_data_dist ##``, ``## all2all_data:recat_values ##``), the pooled embeddings'
all-to-all autograd functions (``All2All_Pooled_Req``) and FBGEMM's table-batched lookups."""
MIXTURE_OF_EXPERTS = re.compile(
    r"moe|expert|router|deepep|(?:\bdeep_|\b)ep::|topk_softmax|topkgating|token_dispatch|grouped_?gemm", re.I)
"""A mixture-of-experts layer, router or kernel: Megatron-Core's ``MoELayer``/``TopKRouter``, vLLM's and SGLang's
``fused_moe`` kernels and ``topkGatingSoftmax``, DeepEP under any namespace (``deep_ep::``, ``dpsk::ep::``), grouped
GEMMs."""
LIBRARIES = (
    ("torchrec", TORCHREC),
    ("moe", MIXTURE_OF_EXPERTS),
    ("megatron", re.compile(r"megatron", re.I)),
    ("deepspeed", re.compile(r"deepspeed", re.I)),
)


def libraries(tl: Timeline) -> list[str]:
    """The libraries the trace's names show, in :data:`LIBRARIES` order. A recommender's embedding tables are no
    experts: where TorchRec's names are there, ``moe`` is not said for its words alone."""
    found = [name for name, pattern in LIBRARIES if any(pattern.search(s) for s in tl.strings)]
    return [n for n in found if not (n == "moe" and "torchrec" in found)]
