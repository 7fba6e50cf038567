"""What host and device event names mean, decided once per distinct name.

Each predicate runs over the string table (a few thousand names at most), and the
results are lookup arrays indexed by name id, so per-event classification is one
vectorised gather. Case-insensitive facts are lowercase patterns searched in the lowercased
names: Python's ``re`` tries every alternative of an ``IGNORECASE`` pattern case by case at
every position, 3 to 8 times slower (kernel names run to hundreds of characters). For the same reason a fact
whose alternatives are anchored (``^``, ``$``) and unanchored is two patterns, either matching, and a ``\b``
pattern starts with its literal: ``re`` skips ahead to a possible first character only where every
alternative of a pattern starts with a literal, and tries a ``^`` pattern at the start only (a 26 MiB trace's
294 names: 2.5 ms instead of 7.3).
"""

from __future__ import annotations

import re

import msgspec
import numpy as np

from gpuidle.model import FILE_READ_CALLS, XLA_DISPATCH
from gpuidle.model.arrays import distinct
from gpuidle.model.name_search import JoinedNames, found_in

Fact = tuple[re.Pattern[str], ...]
"""A name has the fact where any of the patterns is found in it."""

SYNC_CALLS: Fact = (
    re.compile(r"^((cuda|hip)(Stream|Device|Event|Ctx)Synchronize|cu(Stream|Ctx|Event)Synchronize|(cuda|hip)Free"
               r"|TFE_TensorHandleResolve)$"),
    re.compile(r"BlockHostUntilReady|block_until_ready|ToLiteral"),
)
"""Calls that block the host until device work finishes (``cudaFree`` synchronizes too; XLA's
``BlockHostUntilReady``/``ToLiteral`` and JAX's ``block_until_ready``, TensorFlow's tensor reads)."""
MEMCPY_CALLS: Fact = (re.compile(r"^(cuda|hip|cu)Memcpy"),)
SYNCHRONOUS_MEMCPY: Fact = (
    re.compile(r"^(cudaMemcpy|cudaMemcpy2D|cudaMemcpy3D|hipMemcpy|hipMemcpyWithStream|cuMemcpy[A-Za-z0-9]*?)(_v2)?$"),
)
ITEM_OPS = frozenset({"aten::item", "aten::_local_scalar_dense"})
DATA_LOADING: Fact = (
    re.compile(r"dataloader|data[_ ]?load|load[_ ]?batch|get[_ ]?batch|iteratorgetnext|iterator::getnext|device_?put"),
    re.compile(r"grain(?<=\bgrain)\b"),  # \bgrain\b, led by its literal: searched as fast
)
"""(Lowercased names.) Waiting for input: PyTorch's DataLoader, tf.data's ``IteratorGetNext``, JAX's
``device_put`` of a batch, grain."""
FILE_READ: Fact = (re.compile("^(" + "|".join(sorted(FILE_READ_CALLS)) + ")$"),)
"""File reads of a thread that drives the GPU (Nsight's OS runtime trace): loading, but no step marker."""
COLLECTIVE_HOST: Fact = (
    re.compile(r"^(c10d::|nccl:|gloo:|record_param_comms$|ProcessGroup)"),
    re.compile(r"^P?MPI_(I?[sS]end|Is?send|I?[bBrR]send|Ibsend|Irsend|I?[rR]ecv|Sendrecv\w*|I?[bB]cast|I?[rR]educe\w*"
               r"|I?[aA]ll(reduce|gather\w*|toall\w*)|I?[gG]ather\w*|I?[sS]catter\w*|I?[bB]arrier|I?[nN]eighbor_\w+"
               r"|Wait\w*|Test\w*|I?[pP]robe|Put|Get|Accumulate|Win_\w+)$"),
)
"""Host calls that communicate: PyTorch's collectives (c10d, NCCL and gloo ranges, ``record_param_comms``) and MPI's
(Nsight's MPI trace: ``MPI_Send``, ``MPI_Allreduce``, ``MPI_Wait``...)."""
PROFILER_STEP: Fact = (re.compile(r"^ProfilerStep#\d+$"),)
REGION: Fact = (re.compile(
    r"^(ProfilerStep#|Optimizer\.\w+#|Torch-Compiled Region|TorchDynamo|## .* ##$|CompiledFxGraph"
    r"|DistributedDataParallel\.forward$|FullyShardedDataParallel\.|enumerate\(DataLoader\))"
),)
"""Annotations that wrap a whole phase (older traces write some as operators): they contain launches but
issue none themselves, so time under them is never launching on that account."""
ZERO_GRAD: Fact = (re.compile(r"^Optimizer\.zero_grad#"), re.compile(r"zero_grad$"))
TRAINING_OPS: Fact = (
    re.compile(r"^(autograd::engine::evaluate_function|Optimizer\.step#|aten::_foreach_(add|mul|addcmul|lerp)_"
               r"|Optimizer\.zero_grad#|optimizer\.step)"),
    re.compile(r"Backward0?$"),
)
"""Names only a training step records: the autograd engine, optimizer steps."""
COMPILED: Fact = (
    re.compile(r"^(Torch-Compiled Region|CompiledFunction|TorchDynamo|CompiledFxGraph|triton_|inductor)"),
)
GRAPH_LAUNCH: Fact = (re.compile(r"^((cuda|hip)GraphLaunch|cuGraphLaunch)"),)
ENGINE: Fact = (re.compile(r"vllm|sglang"),)
"""(Lowercased names.)"""
OPTIMIZER_STEP: Fact = (re.compile(r"^Optimizer\.step#"),)
LIBRARY_PYTHON: Fact = (
    re.compile(r"^(<built-in|<frozen|<string>|nn\.Module: |torch/|torchvision/|transformers/|lightning/|accelerate/"
               r"|deepspeed/|numpy/|jax/|flax/|keras/|tensorflow/|contextlib\.py|threading\.py|functools\.py"
               r"|abc\.py|typing\.py|enum\.py)"),
    re.compile(r"/(site|dist)-packages/|/lib/python3\.\d+/"),
)
"""Python frames (Kineto ``python_function``, ``file.py(line): name``) of the interpreter and the libraries rather
than of the user's program: built-in methods, module-call markers, torch and the frameworks, the standard library."""
LAUNCH_CALLS: Fact = (re.compile(r"Launch"), re.compile(r"^((cuda|hip)Memset|cuMemset)"), re.compile(XLA_DISPATCH))
"""Calls that launch device work: the runtime's launches and sets, and XLA's and TensorFlow's dispatch of a compiled
program (its host time is the launch path, named launch overhead, not Python)."""

# Kernel-name facts, of lowercased names (tests/test_kernel_classes.py: a table of real kernel names from cuBLAS,
# cuDNN, CUTLASS, Triton, Eigen, rocBLAS/hipBLASLt, MIOpen and XLA, each with its class)
GEMM: Fact = (re.compile(r"gemm|gemv|cutlass|cijk_|matmul|_mma|wgmma|cublas|xmma|nvjet|_tem_fused_\w*mm"),)
"""Matrix multiplies: cuBLAS (``ampere_sgemm_*``, ``sm90_xmma_gemm_*``, ``nvjet_*``), CUTLASS, rocBLAS/hipBLASLt
(``Cijk_*``), Triton's matmul templates (``triton_tem_fused_mm``, ``_addmm``, ``_bmm``)."""
CONV: Fact = (re.compile(r"conv(?!er)|implicit_gemm|implicit_convolve|winograd|dgrad|wgrad|fprop|scudnn|hcudnn"
                         r"|\dcudnn|igemm_(fwd|bwd|wrw)"),)
"""Convolutions: cuDNN's (``implicit_convolve_sgemm``, ``*_fprop_*``, ``*dgrad*``, ``volta_scudnn_*``,
``s884cudnn``), MIOpen's (``MIOpenConv*``, ``naive_conv_*``, ``igemm_fwd_*``); never a conversion (``convert``,
``TensorConversionOp``) or cuDNN's other kernels (batch norm, layout changes)."""
NOT_MATRIX_MATH: Fact = (
    re.compile(r"eigenmetakernel|tensorconversionop|elementwise|reduce_kernel|(?<!broad)cast|(?:^|[_:])convert|transpose"
               r"|nchwtonhwc|nhwctonchw|\bbn_|batchnorm|_norm_|softmax|memcpy|memset|fill"),
)
"""Kernels whose names mention a matrix library or a convolution but that are elementwise, a cast, a reduction, a
layout change or a normalisation (Eigen's ``EigenMetaKernel<... TensorConversionOp<Eigen::half ...>>``, cuDNN's
``bn_fw_tr_*`` and ``nchwToNhwcKernel``, XLA's ``convert`` fusions): never GEMM or convolution time."""
REDUCED_PRECISION: Fact = (
    re.compile(r"884|1688|16816|16832|s16|h16|bf16|fp16|f16|half|bfloat|tensorop|_hmma|hgemm|e4m3|e5m2|fp8|hhs|bbs|_hb_"
               r"|_bb_|_hh_|tf32|nvjet|triton_tem"),
    re.compile(r"h(?<=\bh)\w*gemm"),  # \bh\w*gemm, led by its literal
)
"""(Of a GEMM or convolution.) Runs in 16 or 8 bits or on the matrix units (TF32 included: ``s1688gemm``,
``tf32``); the rest is plain fp32 on the SIMT cores (``sgemm``). Triton's matmuls and cuBLAS's ``nvjet`` kernels
run ``dot`` on the matrix units."""
FOLDED = frozenset({DATA_LOADING, ENGINE, GEMM, CONV, NOT_MATRIX_MATH, REDUCED_PRECISION})
"""The patterns written in lowercase, for lowercased names."""


NUMBERED = re.compile(r"#\d+$")
"""A name's trailing ``#N`` (``ProfilerStep#41``, ``Optimizer.step#Adam.step``'s kin): no pattern tells one number
from another, so the names are classified once per shape, not once per step."""


def shapes(strings: list[str]) -> tuple[list[str], np.ndarray]:
    """The distinct shapes of ``strings`` (a trailing ``#N`` read as ``#0``) and each string's index among them:
    100,000 profiler steps are one name to classify."""
    index: dict[str, int] = {}
    inverse = np.fromiter((index.setdefault(NUMBERED.sub("#0", s) if s[-1:].isdigit() and "#" in s else s, len(index))
                           for s in strings),
                          dtype=np.int64, count=len(strings))
    return list(index), inverse


def _mask(names: JoinedNames, test: Fact) -> np.ndarray:
    mask = np.zeros(len(names.names), dtype=bool)
    for pattern in test:
        mask |= names.found(pattern)
    return mask


class NameClasses(msgspec.Struct, frozen=True):
    """Boolean lookup arrays over a timeline's string table."""

    sync_call: np.ndarray
    memcpy_call: np.ndarray
    synchronous_memcpy: np.ndarray
    launch_call: np.ndarray
    item_op: np.ndarray
    data_loading: np.ndarray
    file_read: np.ndarray
    collective_host: np.ndarray
    profiler_step: np.ndarray
    optimizer_step: np.ndarray
    library_python: np.ndarray
    region: np.ndarray
    zero_grad: np.ndarray
    training_op: np.ndarray
    compiled: np.ndarray
    graph_launch: np.ndarray
    engine: np.ndarray
    gemm: np.ndarray
    conv: np.ndarray
    reduced_precision: np.ndarray
    """Of the names :data:`GEMM` or :data:`CONV` finds (elementwise ones among them too); False for every other."""
    shaped: list[str]
    """The distinct shapes of the names (:func:`shapes`), for a pattern tested once per shape..."""
    shape: np.ndarray
    """...and each name's index among them."""
    searchable: JoinedNames
    """The shapes joined once, for :meth:`matching` over all names."""

    def matching(self, pattern: re.Pattern[str], rows: np.ndarray | None = None) -> np.ndarray:
        """Which names (of string ids ``rows``, all where None) ``pattern`` finds, searched once per shape."""
        if rows is None:
            every: np.ndarray = self.searchable.found(pattern)[self.shape]
            return every
        ids = self.shape[rows]
        tested = distinct(ids)
        hit = np.zeros(len(self.shaped), dtype=bool)
        hit[tested] = found_in([self.shaped[i] for i in tested.tolist()], pattern)
        found: np.ndarray = hit[ids]
        return found

    @classmethod
    def of(cls, strings: list[str]) -> NameClasses:
        shaped, of_shape = shapes(strings)
        joined, lowered = JoinedNames(shaped), JoinedNames([s.lower() for s in shaped])

        def mask(test: Fact | frozenset[str]) -> np.ndarray:
            if isinstance(test, frozenset):
                return np.fromiter((s in test for s in strings), dtype=bool, count=len(strings))
            found: np.ndarray = _mask(lowered if test in FOLDED else joined, test)[of_shape]
            return found

        gemm, conv = mask(GEMM), mask(CONV)
        matrix_like = np.flatnonzero(gemm | conv)  # the other facts of kernels are of these names only
        matrix_names = JoinedNames([strings[i].lower() for i in matrix_like.tolist()])

        def of_matrix_like(test: Fact) -> np.ndarray:
            found = np.zeros(len(strings), dtype=bool)
            found[matrix_like] = _mask(matrix_names, test)
            return found

        matrix_math = ~of_matrix_like(NOT_MATRIX_MATH)
        return cls(
            sync_call=mask(SYNC_CALLS),
            memcpy_call=mask(MEMCPY_CALLS),
            synchronous_memcpy=mask(SYNCHRONOUS_MEMCPY),
            launch_call=mask(LAUNCH_CALLS),
            item_op=mask(ITEM_OPS),
            data_loading=mask(DATA_LOADING),
            file_read=mask(FILE_READ),
            collective_host=mask(COLLECTIVE_HOST),
            profiler_step=mask(PROFILER_STEP),
            optimizer_step=mask(OPTIMIZER_STEP),
            library_python=mask(LIBRARY_PYTHON),
            region=mask(REGION),
            zero_grad=mask(ZERO_GRAD),
            training_op=mask(TRAINING_OPS),
            compiled=mask(COMPILED),
            graph_launch=mask(GRAPH_LAUNCH),
            engine=mask(ENGINE),
            gemm=gemm & matrix_math,
            conv=conv & matrix_math,
            reduced_precision=of_matrix_like(REDUCED_PRECISION),
            shaped=shaped, shape=of_shape, searchable=joined,
        )
