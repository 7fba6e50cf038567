"""Communication kernels by family, on a table of real names: each with its family and what it does. The names
come from the traces the project holds (``../shared/corpus``, ``../shared/traces``, ``tests/data``) and from the
libraries' own kernels; none of them is compute. A walk over every trace checks that no kernel of theirs that the
table would call compute is communication, and the reverse."""

from __future__ import annotations

import pytest

from gpuidle.analysis.names import NameClasses
from gpuidle.model.comm_kernels import COLLECTIVE_KERNEL, comm_family, kernel_collective
from gpuidle.model.name_search import found_any
from shared_traces import kineto_traces

COMMUNICATION = [
    # ../shared/corpus/deepseek_dualpipe_h800_rank0: DeepSeek's own DeepEP build, namespace dpsk::ep
    ("void dpsk::ep::internode::combine<false, 8, __nv_bfloat16, 8, 2, 16, 24>(int4*, float*, bool const*, int4 "
     "const*, float const*, int4 const*, int const*, int const*, void*, int*, int*, int, int, int, int, int, int, int, "
     "int, int, int, int, int, int)", "deepep", "all_to_all"),
    ("void dpsk::ep::internode::dispatch<false, 8, true, 8>(int4*, float*, long*, float*, "
     "dpsk::ep::internode::SourceMeta*, int4 const*, float const*, long const*, float const*, int*, int*, int*, int*, "
     "int, int, int, int, int, int, int, void*, int, void**, int, int, int)", "deepep", "all_to_all"),
    ("void dpsk::ep::internode::dispatch<false, 8, false, 8>(int4*, float*, long*, float*, ...)", "deepep",
     "all_to_all"),
    ("void dpsk::ep::internode::notify_dispatch<false, 8>(int const*, long*, int, int const*, int*, int const*, "
     "int*, int, bool const*, ...)", "deepep", "all_to_all"),
    ("void dpsk::ep::internode::cached_notify<false>(int, int, int, int, int*, int, int, int const*, int const*, "
     "int*, void*, int, void**, int, bool, int, int)", "deepep", "all_to_all"),
    ("void dpsk::ep::cuda::get_dispatch_layout<256, 32, 8>(long const*, int*, int*, int*, bool*, int, int, int, int)",
     "deepep", "all_to_all"),
    # the public DeepEP build
    ("void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*, ...)", "deepep", "all_to_all"),
    ("void deep_ep::internode_ll::combine<false, 7168>(void*, void*, int*, ...)", "deepep", "all_to_all"),
    ("void deep_ep::intranode::notify_dispatch<8>(int const*, int*, int, int const*, int*, int, int, int)",
     "deepep", "all_to_all"),
    # NCCL in ../shared/corpus/dlrm_8rank_v100, ../shared/traces (negative_queue_length, trace_filter, nccl_parser)
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "nccl", "send_recv"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "nccl", "all_reduce"),
    ("ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "nccl", "broadcast"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", "nccl", "all_reduce"),
    ("ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)", "nccl", "send_recv"),
    ("ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "nccl", "all_gather"),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", "nccl", "reduce_scatter"),
    ("rcclGenericKernel<1, false>(ncclDevComm*, unsigned long, ncclWork*)", "nccl", None),
    # the other libraries' kernels
    ("void pplx::dispatchKernel<unsigned int>(...)", "pplx", "all_to_all"),
    ("void pplx::combineKernel<__nv_bfloat16>(...)", "pplx", "all_to_all"),
    ("void nvshmemi_transfer_rma_kernel<nvshmemi_op_t>(...)", "nvshmem", None),
    ("void mscclpp::allreduce6<__nv_bfloat16>(...)", "msccl", "all_reduce"),
    ("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*, ...)", "custom_all_reduce",
     "all_reduce"),
    ("void c10d::symmetric_memory::one_shot_all_reduce_kernel<float, 8>(...)", "custom_all_reduce", "all_reduce"),
    ("void c10d::symmetric_memory::multimem_all_reduce_kernel<__nv_bfloat16, 8>(...)", "custom_all_reduce",
     "all_reduce"),
]

COMPUTE = [
    # dispatch and reduce in compute kernels' names: ../shared/corpus/dlrm_8rank_v100 (CUB), deepseek (grouped GEMMs)
    "void cub::DeviceReduceByKeyKernel<cub::DispatchReduceByKey<long*, long*, cub::ConstantInputIterator<int, int>, "
    "long*, int*, cub::Equality, cub::Sum, int>::PtxReduceByKeyPolicy>(...)",
    "void cutlass::device_kernel<dpsk::grouped_gemm::cuda::fp8_dptp128c_acc::GemmKernel>(...)",
    "void dpsk::grouped_gemm::cuda::utils::transpose<512, 128, 4, 4>(unsigned char const*, unsigned char*, int, int)",
    "ampere_sgemm_128x64_tn", "void at::native::vectorized_elementwise_kernel<4, float>(...)",
    "triton_poi_fused_add_0", "void Eigen::internal::EigenMetaKernel<...>(...)", "broadcast_fusion",
    "nccl_stream_sync", "void vllm::moe::topkGatingSoftmax<4, 128, 4, 16, int>(...)",
    "void at::native::(anonymous namespace)::indexSelectLargeIndex<float, long, unsigned int, 2, 2, -2, true>(...)",
]


@pytest.mark.parametrize(("name", "family", "collective"), COMMUNICATION, ids=[k[0][:48] for k in COMMUNICATION])
def test_communication_kernel_family(name: str, family: str, collective: str | None) -> None:
    assert comm_family(name) == family
    if collective is not None:
        assert kernel_collective(name) == collective
    c = NameClasses.of([name])
    assert not c.gemm[0]
    assert not c.conv[0]


@pytest.mark.parametrize("name", COMPUTE, ids=[n[:40] for n in COMPUTE])
def test_compute_kernels_are_not_communication(name: str) -> None:
    assert comm_family(name) is None


def test_every_trace_communication_kernel_is_in_the_table() -> None:
    """Every kernel of the traces held that the families call communication is in the table with its family, and
    every kernel the table calls compute that a trace holds is compute: the table is the traces' own names."""
    import gzip

    import orjson

    known = {name.split("(")[0]: family for name, family, _ in COMMUNICATION}  # names up to their arguments
    for path in kineto_traces():
        with gzip.open(path) as f:
            events = orjson.loads(f.read())
        events = events.get("traceEvents", []) if isinstance(events, dict) else events
        kernels = {e["name"] for e in events if isinstance(e, dict) and e.get("cat") == "kernel" and "name" in e}
        for name in kernels:
            family = comm_family(name)
            if family is not None:
                assert known.get(name.split("(")[0]) == family, f"{path.name}: {name[:100]} ({family}) not in the table"


def test_the_one_pattern_agrees_with_the_families() -> None:
    """The readers search a trace's kernel names with one pattern of every family at once (joined names): it finds
    exactly the names some family recognises, compute kernels none."""
    names = [name for name, _, _ in COMMUNICATION] + COMPUTE
    assert found_any(names, COLLECTIVE_KERNEL).tolist() == [comm_family(n) is not None for n in names]
    assert found_any(names, COLLECTIVE_KERNEL).sum() == len(COMMUNICATION)
