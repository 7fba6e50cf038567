"""Fixes phrased for a plain CUDA application (an Nsight Systems export of a program with no PyTorch).

The rules measure the same causes for every program; only the fix is the framework's.
Keyed on the rules' stable ids: a rule with a CUDA wording gets it, and a rule whose fix
only exists in PyTorch (DataLoader workers, DDP buckets, gradient hooks) is dropped rather
than offered to a program that has none of them. The gain is untouched: it is the
what-if model's, from the measured idle.
"""

from __future__ import annotations

import msgspec

from gpuidle.advice.frameworks import PYTORCH_LIBRARIES
from gpuidle.advice.whatif import Proposal

CUDA_APPLICATION = "cuda"

NSYS_TRACE = "nsys profile --trace=cuda,nvtx,osrt --cudabacktrace=all -o report ./app"

CUDA_FIXES: dict[str, tuple[str, str]] = {
    "dataloader_workers": (
        "Read input ahead of the GPU: a loader thread and double buffering",
        "// read batch i+1 on a loader thread while the GPU works on batch i\n"
        "cudaMallocHost(&h_buf[k], bytes);                       // two page-locked buffers, k = 0, 1\n"
        "cudaMemcpyAsync(d_buf[k], h_buf[k], bytes, cudaMemcpyHostToDevice, copy_stream);\n"
        "cudaEventRecord(ready[k], copy_stream);\n"
        "cudaStreamWaitEvent(compute_stream, ready[k], 0);       // compute waits on the GPU, not the host",
    ),
    "remove_host_sync": (
        "Stop blocking the host on the GPU every iteration (cudaDeviceSynchronize, cudaStreamSynchronize)",
        "// order work with streams and events instead of waiting on the host\n"
        "cudaEventRecord(done, stream_a);\n"
        "cudaStreamWaitEvent(stream_b, done, 0);\n"
        "// synchronize once, where the host reads a result; find every sync:\n"
        "// " + NSYS_TRACE,
    ),
    "pinned_memory_non_blocking": (
        "Copy from page-locked host memory with cudaMemcpyAsync",
        "cudaMallocHost(&h_buf, bytes);           // or cudaHostRegister(ptr, bytes, cudaHostRegisterDefault)\n"
        "cudaMemcpyAsync(d_buf, h_buf, bytes, cudaMemcpyHostToDevice, stream);\n"
        "// pageable cudaMemcpy stages through a driver buffer and blocks the host",
    ),
    "cuda_graphs": (
        "Launch-bound: capture the kernel sequence once in a CUDA graph and replay it",
        "cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal);\n"
        "run_iteration(stream);                   // the kernels of one iteration\n"
        "cudaStreamEndCapture(stream, &graph);\n"
        "cudaGraphInstantiate(&graph_exec, graph, 0);\n"
        "for (int i = 0; i < iterations; ++i) cudaGraphLaunch(graph_exec, stream);",
    ),
    "larger_batch": (
        "Tiny kernels starve the GPU: give each launch more work",
        "// fuse consecutive small kernels into one, or process several inputs per launch\n"
        "// (a larger grid over a batch) so each kernel runs well beyond its launch cost",
    ),
    "move_cpu_work": (
        "Host work between launches holds the GPU back",
        "// launch first, then do host work while the GPU runs; move hot host loops into kernels\n"
        "// or onto another thread; see where the host time goes:\n"
        "// nsys profile --trace=cuda,nvtx,osrt --sample=process-tree ./app",
    ),
    "tf32": (
        "GEMMs/convolutions run in plain fp32 on the SIMT cores: let cuBLAS and cuDNN use TF32",
        "cublasSetMathMode(handle, CUBLAS_TF32_TENSOR_OP_MATH);    // fp32 data, TF32 tensor cores (sm >= 80)\n"
        "cudnnSetConvolutionMathType(conv_desc, CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION);\n"
        "// and check that NVIDIA_TF32_OVERRIDE is not set to 0 in the job's environment: it turns TF32 off",
    ),
    "mixed_precision": (
        "GEMMs/convolutions run in fp32: use the tensor cores (TF32 or 16-bit inputs)",
        "cublasSetMathMode(handle, CUBLAS_TF32_TENSOR_OP_MATH);    // fp32 data, TF32 tensor cores (sm >= 80)\n"
        "// or 16-bit inputs with fp32 accumulation:\n"
        "cublasGemmEx(handle, opA, opB, m, n, k, &alpha, A, CUDA_R_16BF, lda, B, CUDA_R_16BF, ldb,\n"
        "             &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);",
    ),
    "cudnn_benchmark": (
        "Convolutions dominate: let cuDNN search the fastest algorithms for your shapes",
        "// once per input shape, then reuse the winner\n"
        "cudnnFindConvolutionForwardAlgorithm(handle, x_desc, w_desc, conv_desc, y_desc, n, &found, results);\n"
        "cudnnSetConvolutionMathType(conv_desc, CUDNN_TENSOR_OP_MATH);",
    ),
    "nccl_transport": (
        "Large all-reduces reach a low bus bandwidth: check the NCCL transport",
        "NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET ./app     # look for 'via NET/Socket' vs 'NET/IB'\n"
        "export NCCL_SOCKET_IFNAME=ib0     # the fast interface\n"
        "export NCCL_IB_DISABLE=0",
    ),
    "comm_bound_batch": (
        "Communication takes as long as compute: more work per collective",
        "// larger per-GPU problem, fewer and larger collectives (ncclGroupStart()/ncclGroupEnd()),\n"
        "// and run them on their own stream while independent kernels run",
    ),
}
STRAGGLER_LOADER = "its DataLoader workers"
PYTORCH_ONLY = frozenset({"ddp_no_sync", "ddp_bucket_cap", "comm_compression", "zero_grad_set_to_none",
                          "moe_all_to_all_overlap", "record_cpu_activity", *PYTORCH_LIBRARIES})
"""Fixes in PyTorch's API or its libraries' settings, and the step tracker's own recording advice (a tracker runs
inside a framework's loop): not in this stack for a CUDA program."""


def for_cuda(proposals: list[Proposal]) -> list[Proposal]:
    """The proposals with CUDA wording; PyTorch-only fixes left out."""
    out = []
    for p in proposals:
        rec = p.rec
        if rec.id in PYTORCH_ONLY:
            continue
        if rec.id in CUDA_FIXES:
            title, fix = CUDA_FIXES[rec.id]
            if rec.id == "mixed_precision" and rec.evidence.get("dtype") == "fp16":  # before sm 80: no bf16, no TF32
                fix = "\n".join(line for line in fix.splitlines()[2:]).replace("CUDA_R_16BF", "CUDA_R_16F")
                title = "GEMMs/convolutions run in fp32: use the tensor cores with fp16 inputs"
            rec = msgspec.structs.replace(rec, title=title, fix=fix)
        elif rec.id.startswith("straggler_rank_"):
            rec = msgspec.structs.replace(rec, fix=rec.fix.replace(STRAGGLER_LOADER, "its input-reading threads"))
        out.append(Proposal(rec, p.effects))
    return out
