"""The libraries a trace shows (``analysis.stack``), checked against every trace held: TorchRec's recommenders,
the mixture-of-experts models (DeepEP under DeepSeek's own namespace, Switch Transformer's experts), and none where
a trace has neither, a recommender's embedding tables never read as experts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuidle.analysis.stack import libraries_in
from gpuidle.api import analyze
from shared_traces import every_input

EXPECTED = {
    "deepseek_dualpipe_h800_rank0.json.gz": ["moe"],
    "switch_moe_a100_cold.json.gz": ["moe"],
    "switch_moe_a100_fp32.json.gz": ["moe"],
    "switch_moe_a100_syncs.json.gz": ["moe"],
    "dlrm_8rank_v100": ["torchrec"],
    "negative_queue_length_values_check__rank0.json.gz": ["torchrec"],
    "trace_compare__test__test.json.gz": ["torchrec"],
    "trace_filter__sampled_rank-0.json.gz": ["torchrec"],
    "trace_filter__sampled_rank-1.json.gz": ["torchrec"],
}
"""The traces that show a library; every other trace held shows none."""
READABLE = [p for p in every_input() if p.suffix in (".gz", "") and not re.match(
    r"cpu_only|execution_trace|mtia|rank_non_gpu|trace_file_list", p.name)]
"""Kineto traces and folders of ranks with host operators to tell by."""


@pytest.mark.parametrize("path", READABLE, ids=lambda p: p.name[:40])
def test_the_libraries_of_every_trace(path: Path) -> None:
    report = analyze([str(path)])
    name = path.name
    for rank in report.ranks:
        assert rank.workload is not None
        assert rank.workload.libraries == EXPECTED.get(name, [])


@pytest.mark.parametrize(("name", "library"), [
    ("## KJTAllToAllTensorsAwaitable wait() ##", "torchrec"), ("## wait_sparse_data_dist ##", "torchrec"),
    ("All2All_Pooled_Req", "torchrec"), ("fbgemm::split_embedding_codegen_lookup_rowwise_adagrad_function", "torchrec"),
    ("MoELayer.forward", "moe"), ("void dpsk::ep::internode::dispatch<false, 8, true, 8>(int4*)", "moe"),
    ("fused_moe_kernel", "moe"), ("megatron/core/transformer/transformer_layer.py(400): forward", "megatron"),
    ("deepspeed/runtime/engine.py(2000): backward", "deepspeed"),
])
def test_real_names_of_each_library(name: str, library: str) -> None:
    assert libraries_in(name.lower())[:1] == [library]


@pytest.mark.parametrize("name", ["aten::embedding", "nn.Module: Embedding_0", "cub::DispatchReduceByKey",
                                  "aten::is_nonzero", "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t"])
def test_names_of_no_library(name: str) -> None:
    assert libraries_in(name.lower()) == []
