"""Kernel classes from names, checked against the names each vendor's and library's kernels really carry:
matrix multiplies, convolutions, what runs on the matrix units, and communication kernels beyond NCCL."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuidle.analysis.names import NameClasses
from gpuidle.api import analyze
from minitrace import Trace

GEMM, CONV, OTHER = "gemm", "conv", "other"
SIMT, MATRIX = "fp32 SIMT", "matrix units"

KERNELS = [
    # cuBLAS
    ("volta_sgemm_128x64_nn", GEMM, SIMT),
    ("ampere_sgemm_128x64_tn", GEMM, SIMT),
    ("ampere_sgemm_32x32_sliced1x4_nn", GEMM, SIMT),
    ("void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, false>(...)", GEMM, SIMT),
    ("sm80_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x16_stage4_warpsize2x2x1_tensor16x8x8_kernel", GEMM,
     MATRIX),
    ("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_64x3_tn", GEMM, MATRIX),
    ("volta_h884gemm_64x128_ldg8_nn", GEMM, MATRIX),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel",
     GEMM, MATRIX),
    ("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NTT", GEMM, MATRIX),
    # CUTLASS
    ("cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4", GEMM, MATRIX),
    ("cutlass_80_simt_sgemm_128x128_8x4_nn_align1", GEMM, SIMT),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>(...)", GEMM,
     MATRIX),
    # Triton (torch.compile's Inductor)
    ("triton_tem_fused_addmm_relu_0", GEMM, MATRIX),
    ("triton_tem_fused_mm_3", GEMM, MATRIX),
    ("triton_poi_fused_add_relu_1", OTHER, None),
    ("triton_per_fused__softmax_2", OTHER, None),
    # cuDNN
    ("void cudnn::detail::implicit_convolve_sgemm<float, float, 128, 5, 5, 3, 3, 3, 1, false, false, true>(...)",
     CONV, SIMT),
    ("sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4", CONV,
     MATRIX),
    ("sm86_xmma_dgrad_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize64x64x64_stage4_warpsize2x2x1", CONV,
     MATRIX),
    ("volta_scudnn_128x64_relu_interior_nn_v1", CONV, SIMT),
    ("volta_fp16_s884cudnn_fp16_256x128_ldg8_relu_f2f_exp_small_nhwc_tn_v1", CONV, MATRIX),
    ("void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>(...)", CONV, SIMT),
    ("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1>(...)", OTHER, None),
    ("void cudnn::ops::nchwToNhwcKernel<__half, __half, float, false, true>(...)", OTHER, None),
    # Eigen (TensorFlow): a cast is no convolution, and an fp16 cast no fp16 GEMM
    ("void Eigen::internal::EigenMetaKernel<Eigen::TensorEvaluator<Eigen::TensorAssignOp<Eigen::TensorMap<"
     "Eigen::Tensor<Eigen::half, 1, 1, long>, 16, Eigen::MakePointer>, Eigen::TensorConversionOp<Eigen::half, "
     "Eigen::TensorMap<Eigen::Tensor<float const, 1, 1, long>, 16, Eigen::MakePointer> const> const> const, "
     "Eigen::GpuDevice>, long>(...)", OTHER, None),
    # XLA
    ("loop_convert_fusion", OTHER, None),
    ("input_reduce_fusion_3", OTHER, None),
    # rocBLAS / hipBLASLt, MIOpen
    ("Cijk_Ailk_Bljk_SB_MT128x128x16_SN_1LDSB0_APM1_ABV0_ACED0_AF0EM1_AF1EM1_AMAS3", GEMM, SIMT),
    ("Cijk_Ailk_Bljk_BBS_BH_MT128x128x32_MI32x32x8x1_SN_1LDSB0_APM1", GEMM, MATRIX),
    ("Cijk_Alik_Bljk_HHS_BH_MT64x64x16_MI16x16x16x1_SN_1LDSB0", GEMM, MATRIX),
    ("MIOpenConvUni", CONV, SIMT),
    ("naive_conv_fwd_nchw_float_double_float", CONV, SIMT),
    ("igemm_fwd_gtcx_nhwc_fp16_bx0_ex1_bt128x128x32_wt32x32x8_ws1x1_wr2x2_ta1x8x2x1_1x4x1x64_tb1x8x2x1_1x4x1x64",
     CONV, MATRIX),
    # PyTorch's own
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::Half>, "
     "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<c10::Half>, at::detail::Array<char*, 3>)",
     OTHER, None),
    ("void at::native::(anonymous namespace)::conv_depthwise2d_forward_kernel<1, float, int>(...)", CONV, SIMT),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float>, "
     "unsigned int, float, 4> >(...)", OTHER, None),
]


@pytest.mark.parametrize(("name", "kind", "precision"), KERNELS, ids=[k[0][:48] for k in KERNELS])
def test_kernel_class_of_a_real_name(name: str, kind: str, precision: str | None) -> None:
    c = NameClasses.of([name])
    got = GEMM if c.gemm[0] and not c.conv[0] else CONV if c.conv[0] else OTHER
    assert got == kind
    if precision is not None:
        assert (MATRIX if c.reduced_precision[0] else SIMT) == precision


def test_mpi_calls_are_host_communication() -> None:
    names = ["MPI_Send", "MPI_Irecv", "MPI_Allreduce", "MPI_Waitall", "MPI_Init", "MPI_Comm_rank", "PMPI_Bcast"]
    assert NameClasses.of(names).collective_host.tolist() == [True, True, True, True, False, False, True]


def test_deepep_dispatch_and_combine_are_exposed_all_to_all(tmp_path: Path) -> None:
    """A DeepSeek-style MoE step: DeepEP's dispatch and combine kernels on their own stream, half of each beside the
    experts' GEMMs. They are communication, not compute: busy is the GEMMs alone, the uncovered halves are exposed
    all-to-all, and the expert-parallel fix is named."""
    t = Trace()
    for i in range(4):
        base = i * 10_000.0
        t.step(i, base, 10_000)
        t.launch(at=base, call_dur=5, start=base + 100, dur=2000, stream=20,
                 name="void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*)")
        t.launch(at=base + 10, call_dur=5, start=base + 1100, dur=4000,
                 name="sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_kernel")
        t.launch(at=base + 20, call_dur=5, start=base + 4100, dur=2000, stream=20,
                 name="void deep_ep::intranode::combine<__nv_bfloat16, 8, 768>(int4*, float*, int*)")
        t.launch(at=base + 30, call_dur=5, start=base + 6200, dur=3700,
                 name="void at::native::vectorized_elementwise_kernel<4, float>(int)")
    report = analyze([t.write(tmp_path / "moe.json.gz")])
    (rank,) = report.ranks
    device = rank.primary()
    assert device.busy_s * 1e6 == pytest.approx(4 * (4000 + 3700))
    assert {c.collective for c in rank.communication.collectives} == {"all_to_all"}
    assert sum(c.count for c in rank.communication.collectives) == 8
    # exposed: dispatch [100, 1100) and combine [5100, 6100) of each step: 2,000 µs a step
    exposed = sum(sec for s in rank.steps for key, sec in s.exposed_comm_s.items() if key.startswith("all_to_all"))
    assert exposed * 1e6 == pytest.approx(4 * 2000)
    assert "moe_all_to_all_overlap" in {r.id for r in report.recommendations}
