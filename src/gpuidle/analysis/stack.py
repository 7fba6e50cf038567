"""The libraries a trace's program ran on, told once from its names: a recommender's sharded embeddings
(TorchRec), a mixture-of-experts model, Megatron-Core, DeepSpeed. Each fix's preconditions read them
(``advice.preconditions``): an embedding all-to-all is never tuned as an MoE router's, a CUDA-graph capture is
never proposed around an all-to-all whose sizes are exchanged at run time. ``tests/test_stack.py`` checks the
table against every trace the project holds."""

from __future__ import annotations

from gpuidle.model import Timeline

TORCHREC = ("kjtalltoall", "kjtlist", "kjtsplits", "pooledembeddingsawaitable", "all2all_pooled", "sparse_data_dist",
            "## all2all_data", "torchrec", "split_embedding_codegen_lookup")
"""TorchRec's sharded embeddings: its awaitables (``## KJTAllToAllTensorsAwaitable wait() ##``), the sparse data
distribution (``## wait_sparse_data_dist ##``, ``## all2all_data:recat_values ##``), the pooled embeddings'
all-to-all autograd functions (``All2All_Pooled_Req``) and FBGEMM's table-batched lookups."""
MIXTURE_OF_EXPERTS = ("moe", "expert", "router", "deepep", "deep_ep::", "::ep::", "topk_softmax", "topkgating",
                      "token_dispatch", "grouped_gemm", "groupedgemm")
"""A mixture-of-experts layer, router or kernel: Megatron-Core's ``MoELayer``/``TopKRouter``, vLLM's and SGLang's
``fused_moe`` kernels and ``topkGatingSoftmax``, DeepEP under any namespace (``deep_ep::``, ``dpsk::ep::``), grouped
GEMMs."""
LIBRARIES = (
    ("torchrec", TORCHREC),
    ("moe", MIXTURE_OF_EXPERTS),
    ("megatron", ("megatron",)),
    ("deepspeed", ("deepspeed",)),
)
"""Each library with the lowercase words its names hold, found as substrings of the trace's lowercased names
joined by newlines (a thousand names of hundreds of characters: a substring search each, no pattern per name)."""


def libraries_in(text: str) -> list[str]:
    """The libraries whose words ``text`` (lowercase) holds, in :data:`LIBRARIES` order. A recommender's embedding
    tables are no experts: where TorchRec's names are there, ``moe`` is not said for its words alone."""
    found = [name for name, words in LIBRARIES if any(w in text for w in words)]
    return [n for n in found if not (n == "moe" and "torchrec" in found)]


def libraries(tl: Timeline) -> list[str]:
    """The libraries the trace's names show."""
    return libraries_in("\n".join(tl.strings).lower())
