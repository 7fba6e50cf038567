"""The CUDA-worded fixes name real CUDA API: every ``cuda*``/``nvtx*`` identifier is declared in the headers.

The headers come from NVIDIA's own wheels (``nvidia-cuda-runtime-cu12``, ``nvidia-nvtx-cu12``, in the
dev extra: headers and a runtime library, no GPU needed). cuBLAS and cuDNN names are not checked here:
their wheels are hundreds of MB.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from gpuidle.advice.cuda import CUDA_FIXES, NSYS_TRACE, STRAGGLER_LOADER, for_cuda
from gpuidle.advice.whatif import Effect, Proposal, placeholder
from gpuidle.analysis.trace_quality import HOST_ACTIVITY
from gpuidle.model import Recommendation


def _include(package: str) -> Path:
    try:
        spec = importlib.util.find_spec(package)
    except ModuleNotFoundError:  # no nvidia namespace at all
        spec = None
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{package} is not installed (pip install '.[dev]')")
    return Path(next(iter(spec.submodule_search_locations))) / "include"


def _declared(folder: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in folder.rglob("*.h"))


def test_cuda_runtime_and_nvtx_names_exist() -> None:
    runtime = _declared(_include("nvidia.cuda_runtime"))
    nvtx = _declared(_include("nvidia.nvtx"))
    text = "\n".join([*(title + "\n" + fix for title, fix in CUDA_FIXES.values()), *HOST_ACTIVITY.values()])
    cuda_names = set(re.findall(r"\b(cuda[A-Z]\w*|CUDA_R_\w+)\b", text)) | {"CUDA_R_16F"}  # the fp16 variant
    nvtx_names = set(re.findall(r"\b(nvtx[A-Z]\w*)\b", text))
    assert {"cudaMallocHost", "cudaMemcpyAsync", "cudaStreamBeginCapture", "cudaGraphLaunch"} <= cuda_names
    assert nvtx_names == {"nvtxRangePushA", "nvtxRangePop"}
    for name in sorted(cuda_names):
        assert re.search(rf"\b{name}\b", runtime), f"{name} is not declared in the CUDA runtime headers"
    for name in sorted(nvtx_names):
        assert re.search(rf"\b{name}\b", nvtx), f"{name} is not declared in the NVTX headers"
    assert "nvtx3/nvToolsExt.h" in text
    assert (_include("nvidia.nvtx") / "nvtx3" / "nvToolsExt.h").exists()


def test_cuda_graph_instantiate_takes_three_arguments() -> None:
    """CUDA 12 changed cudaGraphInstantiate to (exec, graph, flags): the fix calls it so."""
    runtime = (_include("nvidia.cuda_runtime") / "cuda_runtime_api.h").read_text(errors="replace")
    decl = re.search(r"cudaGraphInstantiate\(([^;]*?)\);", runtime)
    assert decl is not None
    assert decl.group(1).count(",") == 2
    assert "cudaGraphInstantiate(&graph_exec, graph, 0)" in CUDA_FIXES["cuda_graphs"][1]
    assert NSYS_TRACE.startswith("nsys profile --trace=cuda,nvtx,osrt")


def _proposal(rec_id: str, evidence: dict[str, object] | None = None, fix: str = "torch.something()") -> Proposal:
    rec = Recommendation(id=rec_id, cause="compute", title="PyTorch title", evidence=evidence or {}, fix=fix,
                         gain=placeholder(), confidence="medium", rank=0)
    return Proposal(rec, {0: Effect()})


def test_for_cuda_rewords_drops_and_follows_the_device() -> None:
    props = [_proposal("ddp_bucket_cap"), _proposal("comm_compression"), _proposal("ddp_no_sync"),
             _proposal("mixed_precision", {"dtype": "bf16"}), _proposal("mixed_precision", {"dtype": "fp16"}),
             _proposal("straggler_rank_3", fix=f"# check {STRAGGLER_LOADER} (CPU count per rank)")]
    out = for_cuda(props)
    assert [p.rec.id for p in out] == ["mixed_precision", "mixed_precision", "straggler_rank_3"]
    bf16, fp16, straggler = (p.rec for p in out)
    assert "CUDA_R_16BF" in bf16.fix
    assert "CUBLAS_TF32_TENSOR_OP_MATH" in bf16.fix
    assert "CUDA_R_16F," in fp16.fix  # sm < 80: no bf16 and no TF32
    assert "16BF" not in fp16.fix
    assert "TF32" not in fp16.fix
    assert straggler.fix == "# check its input-reading threads (CPU count per rank)"
    assert all(p.effects == {0: Effect()} for p in out)  # the gain's inputs are untouched
