"""The XSpace reader (JAX/TensorFlow profiles) against references decoded in the test."""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import reference as ref
import xspace_profiles as prof
import xspace_reference as xref
from conftest import DATA
from gpuidle.analysis.idle import attribute_idle
from gpuidle.analysis.links import launcher_rows
from gpuidle.analysis.names import NameClasses
from gpuidle.analysis.steps import step_window
from gpuidle.api import analyze, find_trace_files, read_timelines
from gpuidle.errors import CorruptInput, NoGpuActivity, NotATrace
from gpuidle.model import CAUSES, CopyKind, DeviceOpKind, HostKind, Timeline
from gpuidle.sources import xplanes, xspace
from gpuidle.sources.formats import is_xspace
from xspace_steps import add_stat

pytest.importorskip("google.protobuf")
MI300X = DATA / "jax08_conv_mi300x8__tw003.xplane.pb"


def read_trace(path: str) -> Timeline:
    (tl,) = read_timelines(path)
    return tl


@pytest.fixture(scope="module")
def mi300x() -> tuple[ref.RefTrace, list[tuple[str, int, int]]]:
    t, everything = xref.parse(MI300X)
    t.steps = xref.program_steps(everything, "forward_3d_conv")
    return t, everything


def test_real_profile_busy_idle_match_reference(mi300x: tuple[ref.RefTrace, list[tuple[str, int, int]]]) -> None:
    t, _ = mi300x
    lo, hi = ref.window(t)
    report = analyze([MI300X])
    (rank,) = report.ranks
    assert report.source.format == "xspace"
    assert report.source.framework == "jax"
    assert rank.step_source == "inferred:xla_program"
    assert len(rank.steps) == 5
    assert any("steps inferred from the 5 calls of forward_3d_conv" in n for n in rank.notes)
    assert [d.device for d in rank.devices] == list(range(8))
    assert rank.window.dur_s == pytest.approx((hi - lo) / 1e9, abs=1e-9)
    for d in rank.devices:
        busy = ref.busy(t, d.device)
        assert busy > 0
        assert d.busy_s == pytest.approx(busy / 1e9, abs=1e-9)
        assert d.idle_s == pytest.approx((hi - lo - busy) / 1e9, abs=1e-9)
        assert d.compute_capability == "9.4"
        assert d.name == "AMD GPU"
        assert sum(d.idle_by_cause_s.values()) == pytest.approx(d.idle_s, abs=1e-9)


def _segments(path: Path) -> list[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
    tl = read_trace(str(path))
    names = NameClasses.of(tl.strings)
    win = step_window(tl, names)
    return [(d.device, d.segments[0] + tl.meta.t0_ns, d.segments[1] + tl.meta.t0_ns, d.segments[2])
            for d in attribute_idle(tl, names, win, launcher_rows(tl))]


def test_real_profile_idle_causes_match_reference(mi300x: tuple[ref.RefTrace, list[tuple[str, int, int]]]) -> None:
    """At the first, last and a random instant of every idle segment of every device, the cause is
    what the plain rules say."""
    t, _ = mi300x
    rng = random.Random(11)
    seen: set[str] = set()
    for device, s, e, cause in _segments(MI300X):
        at = ref.cause_at(t, device)
        for i in range(len(s)):
            for instant in {int(s[i]), int(e[i]) - 1, rng.randrange(int(s[i]), int(e[i]))}:
                assert at(instant) == CAUSES[int(cause[i])].value, (device, instant)
            seen.add(CAUSES[int(cause[i])].value)
    assert {"host_sync", "launch_overhead"} <= seen


def test_real_profile_links_launches_and_merges_api_threads() -> None:
    tl = read_trace(str(MI300X))
    rows = launcher_rows(tl)
    assert (rows >= 0).mean() > 0.9
    launch_threads = {tl.threads[int(i)][1] for i in np.unique(tl.host.thread[rows[rows >= 0]])}
    # the HIP API lines ("Host Threads/583") are merged into the threads that made the calls:
    # kernels from XLA's execute threads, device_put's copies from the Python thread
    assert any(n.startswith("py_xla_execute/") for n in launch_threads)
    assert "python" in launch_threads
    assert not any(n.startswith("Host Threads/") for n in launch_threads)
    python = next(i for i, (_, n) in enumerate(tl.threads) if n == "python")
    assert {dst for src, dst in tl.handoffs if src == python} >= {i for i, (_, n) in enumerate(tl.threads)
                                                                 if n.startswith("py_xla_execute/")}
    assert not (tl.device_ops.kind == DeviceOpKind.COLLECTIVE).any()


def test_notes_speak_of_the_framework_s_step_markers() -> None:
    # the reader names JAX's and TensorFlow's step annotations; nothing speaks of PyTorch's ProfilerStep
    notes = analyze([str(MI300X)]).ranks[0].notes
    assert [n for n in notes if "steps inferred" in n] == [n for n in notes if "StepTraceAnnotation" in n]
    assert len([n for n in notes if "steps inferred" in n]) == 1
    assert not [n for n in notes if "ProfilerStep" in n or "record_shapes" in n]


def test_format_detection_and_folders(tmp_path: Path) -> None:
    assert is_xspace(str(MI300X))
    assert not is_xspace(str(DATA / "nccl_parser_config__nccl_data.json.gz"))
    renamed = tmp_path / "profile.bin"  # no telling extension: the content says
    renamed.write_bytes(MI300X.read_bytes())
    assert is_xspace(str(renamed))
    text = tmp_path / "notes.txt"
    text.write_bytes(b"\nnot a profile\n")
    assert not is_xspace(str(text))
    run = tmp_path / "logs" / "plugins" / "profile" / "2026_01_01_00_00_00"
    run.mkdir(parents=True)
    shutil.copy(MI300X, run / "host-a.xplane.pb")
    shutil.copy(MI300X, run / "host-b.xplane.pb")
    (run / "host-a.trace.json.gz").write_bytes(b"")  # the same profile as JSON: left out
    assert [Path(f).name for f in find_trace_files(tmp_path / "logs")] == ["host-a.xplane.pb", "host-b.xplane.pb"]
    report = analyze([tmp_path / "logs"], workers=1)
    assert [r.rank for r in report.ranks] == [0, 1]
    assert report.job is not None
    assert report.ranks[0].world_size == 2
    assert "one rank per host: host-b.xplane.pb is rank 1 of the 2 host profile(s) given" in report.ranks[1].notes
    # one profile given alone is that one host, whatever lies beside it: rank 0 of 1, with the others counted
    (alone,) = analyze([run / "host-b.xplane.pb"], workers=1).ranks
    assert (alone.rank, alone.world_size) == (0, 1)
    assert [n for n in alone.notes if n.startswith("one rank per host")] == [
        "one rank per host: host-b.xplane.pb is rank 0 of the 1 host profile(s) given; 1 more in its folder not given"]


def _unchanged(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _other_message(_: bytes) -> bytes:
    """A real protobuf message of another schema."""
    from google.protobuf import descriptor_pb2

    fd = descriptor_pb2.FileDescriptorProto(name="model.proto", package="acme", dependency=["a.proto"])
    fd.message_type.append(descriptor_pb2.DescriptorProto(name="Thing"))
    return fd.SerializeToString()


def _planes_of_nothing(_: bytes) -> bytes:
    """Parses as an XSpace (field 1 holding messages), but names no host or device plane."""
    from gpuidle.sources.xplane import xplane_pb2

    return xplane_pb2.XSpace(planes=[xplane_pb2.XPlane(name="weights", id=3)]).SerializeToString()


@pytest.mark.parametrize(("content", "error"), [
    (lambda real: real[: len(real) // 2], CorruptInput),
    (lambda real: b"\x00\x01not a protobuf at all\xff" * 10, CorruptInput),
    (_other_message, CorruptInput),
    (_planes_of_nothing, NotATrace),
])
def test_bad_pb_one_line_exit_2(tmp_path: Path, content: Callable[[bytes], bytes], error: type) -> None:
    bad = tmp_path / "bad.xplane.pb"
    bad.write_bytes(content(MI300X.read_bytes()))
    before = _unchanged(bad)
    with pytest.raises(error):
        read_trace(str(bad))
    out = subprocess.run([sys.executable, "-m", "gpuidle", "analyze", str(bad), "--no-ledger"],
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr.count("\n") == 1
    assert out.stderr.startswith("gpuidle: error: ")
    assert _unchanged(bad) == before


def test_tpu_profile_is_named_unsupported(tmp_path: Path) -> None:
    from gpuidle.sources.xplane import xplane_pb2

    space = xplane_pb2.XSpace()
    space.ParseFromString(MI300X.read_bytes())
    for p in space.planes:
        if p.name.startswith("/device:GPU:"):
            p.name = p.name.replace("GPU", "TPU")
    tpu = tmp_path / "tpu.xplane.pb"
    tpu.write_bytes(space.SerializeToString())
    with pytest.raises(NotATrace, match=r"non-GPU accelerator.*TPU"):
        read_trace(str(tpu))


# ----------------------------------------------------------------------------------
# Real profiles recorded here on the CPU: host planes, step markers, tf.data
# ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def jax_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not prof.have("jax"):
        pytest.skip("jax is not installed (pip install -e '.[profilers]')")
    return prof.record(prof.JAX_SCRIPT, tmp_path_factory.mktemp("jax"))


@pytest.fixture(scope="module")
def tf_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not prof.have("tensorflow"):
        pytest.skip("tensorflow is not installed (pip install -e '.[profilers]')")
    return prof.record(prof.TF_SCRIPT, tmp_path_factory.mktemp("tf"))


@pytest.mark.parametrize("which", ["jax_run", "tf_run"])
def test_cpu_only_profile_is_refused(which: str, request: pytest.FixtureRequest) -> None:
    run: Path = request.getfixturevalue(which)
    (pb,) = run.glob("*.xplane.pb")
    before = _unchanged(pb)
    with pytest.raises(NoGpuActivity, match="CPU-only"):
        read_trace(str(pb))
    out = subprocess.run([sys.executable, "-m", "gpuidle", "analyze", str(run), "--no-ledger"],
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1
    assert "CPU-only" in out.stderr
    assert _unchanged(pb) == before


def test_jax_trace_json_holds_the_same_events(jax_run: Path) -> None:
    (pb,) = jax_run.glob("*.xplane.pb")
    json_files = sorted(jax_run.glob("*.trace.json.gz"))
    assert json_files
    assert is_xspace(str(json_files[0]))
    a, b = xplanes.read_pb(str(pb)), xplanes.read_json(str(json_files[0]))
    steps_a = sorted(int(s) for p in a.planes for ln in p.lines for s in ln.step[ln.step >= 0])
    steps_b = sorted(int(s) for p in b.planes for ln in p.lines for s in ln.step[ln.step >= 0])
    assert steps_a == steps_b == [0, 1, 2, 3, 4]
    host_a = {p.name: sum(ln.start.size for ln in p.lines) for p in a.planes if p.lines}
    host_b = {p.name: sum(ln.start.size for ln in p.lines) for p in b.planes if p.lines}
    assert host_a == host_b


@pytest.mark.parametrize(("which", "framework"), [("jax_run", "jax"), ("tf_run", "tensorflow")])
def test_recorded_profile_with_a_gpu_plane(which: str, framework: str, request: pytest.FixtureRequest,
                                           tmp_path: Path) -> None:
    """A real host plane plus a GPU plane with one kernel at the end of each step: the steps are the
    markers, the framework is named, and data-loading idle is the GetNext/device_put time in idle."""
    run: Path = request.getfixturevalue(which)
    (pb,) = run.glob("*.xplane.pb")
    _, everything = xref.parse(pb)
    marks = sorted((s, e) for n, s, e in everything if n == "train")
    assert len(marks) == 5
    kernels = [(e - max(1, (e - s) // 10), e) for s, e in marks]
    gpu = tmp_path / "gpu.xplane.pb"
    prof.add_gpu_plane(pb, gpu, kernels)
    report = analyze([gpu])
    (rank,) = report.ranks
    assert report.source.framework == framework
    assert rank.step_source == "profiler_step"
    assert [s.step for s in rank.steps] == [0, 1, 2, 3, 4]
    t, _ = xref.parse(gpu)
    t.steps = [(i, s, e) for i, (s, e) in enumerate(marks)]
    lo, hi = ref.window(t)
    busy = [(s, e) for s, e in kernels]
    loading = [(s, e) for n, s, e in everything if ref.DATA.search(n)]
    idle_loading = ref.union_length(loading, lo, hi) - _overlap(loading, busy, lo, hi)
    d = rank.primary()
    assert d.busy_s == pytest.approx(ref.busy(t, 0) / 1e9, abs=1e-9)
    assert d.idle_by_cause_s["data_loading"] == pytest.approx(idle_loading / 1e9, abs=1e-9)
    assert d.idle_by_cause_s["data_loading"] > 0
    at = ref.cause_at(t, 0)
    for _, s, _e, cause in _segments(gpu):
        for i in range(len(s)):
            assert at(int(s[i])) == CAUSES[int(cause[i])].value


def _overlap(a: list[tuple[int, int]], b: list[tuple[int, int]], lo: int, hi: int) -> int:
    """Length of (union of a) ∩ (union of b) inside [lo, hi), by inclusion-exclusion of unions."""
    return ref.union_length(a, lo, hi) + ref.union_length(b, lo, hi) - ref.union_length(a + b, lo, hi)


def test_host_kinds_of_xla_names() -> None:
    names = ["cuLaunchKernel", "PjitFunction(train_step)", "$api.py:3154 block_until_ready",
             "EagerLocalExecute: IteratorGetNext", "$builtins len", "Thunks::Prepare"]
    kinds = xspace._name_kinds(names).tolist()
    assert kinds == [HostKind.RUNTIME, HostKind.RUNTIME, HostKind.RUNTIME, HostKind.OP, -1, HostKind.OP]
    classes = NameClasses.of(names)
    assert classes.sync_call.tolist() == [False, False, True, False, False, False]
    assert classes.data_loading.tolist() == [False, False, False, True, False, False]


def test_without_protobuf_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import gpuidle.sources.xplane as schema

    monkeypatch.delattr(schema, "xplane_pb2", raising=False)
    monkeypatch.setitem(sys.modules, "gpuidle.sources.xplane.xplane_pb2", None)  # the import fails
    with pytest.raises(xplanes.ProtobufMissing, match=r"pip install 'gpuidle\[xspace\]'"):
        read_trace(str(MI300X))


def test_annotating_a_protobuf_writes_its_timeline_with_the_idle_track(tmp_path: Path) -> None:
    out = tmp_path / "a.json.gz"
    done = subprocess.run([sys.executable, "-m", "gpuidle", "analyze", str(MI300X), "--no-ledger",
                           "--annotate", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    import gzip
    import json

    events = json.loads(gzip.decompress(out.read_bytes()))["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    idle = [e for e in events if e.get("ph") == "X" and str(e.get("pid", "")).startswith("gpuidle")]
    assert len(kernels) == len(read_trace(str(MI300X)).device_ops)
    assert idle
def test_hand_built_copies_sets_and_collectives(tmp_path: Path) -> None:
    """Copies from their CUPTI names and ``memcpy_details`` bytes; NCCL kernels and XLA collective
    ``hlo_op``s are communication; a launch links by correlation id."""
    from gpuidle.sources.xplane import xplane_pb2

    space = xplane_pb2.XSpace(hostnames=["node-a"])
    gpu = space.planes.add(id=1, name="/device:GPU:3")
    names = ["MemcpyH2D", "Memset", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "fusion_kernel", "loop_add"]
    for i, n in enumerate(names, 1):
        gpu.event_metadata[i].id, gpu.event_metadata[i].name = i, n
    line = gpu.lines.add(id=5, name="Stream #5(Kernel,MemcpyH2D)", timestamp_ns=1_000)
    for i, (start, end) in enumerate([(0, 10), (20, 25), (30, 60), (70, 90), (100, 130)], 1):
        e = line.events.add(metadata_id=i, offset_ps=start * 1000, duration_ps=(end - start) * 1000)
        add_stat(gpu, e, "correlation_id", uint64_value=40 + i)
        if i == 1:
            add_stat(gpu, e, "memcpy_details", str_value="kind_src:pinned kind_dst:device size:4096 async:1")
        if i == 4:
            add_stat(gpu, e, "hlo_op", str_value="all-reduce-start.2")
    host = space.planes.add(id=2, name="/host:CPU")
    host.event_metadata[1].id, host.event_metadata[1].name = 1, "cuLaunchKernel"
    host.event_metadata[2].id, host.event_metadata[2].name = 2, "PjitFunction(train_step)"
    api = host.lines.add(id=77, name="77", timestamp_ns=0)
    py = host.lines.add(id=78, name="python", timestamp_ns=0)
    py.events.add(metadata_id=2, offset_ps=900 * 1000, duration_ps=300 * 1000)
    launch = api.events.add(metadata_id=1, offset_ps=1_095 * 1000, duration_ps=3 * 1000)
    add_stat(host, launch, "correlation_id", uint64_value=45)
    pb = tmp_path / "node-a.xplane.pb"
    pb.write_bytes(space.SerializeToString())
    tl = read_trace(str(pb))
    ops = tl.device_ops
    assert ops.kind.tolist() == [DeviceOpKind.MEMCPY, DeviceOpKind.MEMSET, DeviceOpKind.COLLECTIVE,
                                 DeviceOpKind.COLLECTIVE, DeviceOpKind.KERNEL]
    assert ops.nbytes[0] == 4096
    assert int(ops.copy_kind[0]) == int(CopyKind.HTOD)
    assert set(ops.device.tolist()) == {3}
    assert set(ops.stream.tolist()) == {5}
    assert (ops.end - ops.start).tolist() == [10, 5, 30, 20, 30]
    rows = launcher_rows(tl)
    assert rows.tolist()[:4] == [-1, -1, -1, -1]
    assert tl.strings[tl.host.name[rows[4]]] == "cuLaunchKernel"
    assert tl.threads[tl.host.thread[rows[4]]] == ("node-a", "python")  # the API line joins its thread
    assert tl.meta.framework == "jax"


def test_jax_json_of_the_gpu_profile_gives_the_same_report(tmp_path: Path) -> None:
    """jaxlib writes the real MI300X profile as its trace JSON: read from either file, every figure agrees."""
    if not prof.have("jax"):
        pytest.skip("jax is not installed (pip install -e '.[profilers]')")
    run = prof.export_with_jax(MI300X, tmp_path / "logs")
    (json_trace,) = run.glob("*.trace.json.gz")
    assert is_xspace(str(json_trace))
    a, b = analyze([MI300X]), analyze([json_trace])
    assert b.source.framework == a.source.framework == "jax"
    (ra,), (rb,) = a.ranks, b.ranks
    assert rb.step_source == ra.step_source
    assert rb.window.dur_s == pytest.approx(ra.window.dur_s, abs=1e-9)
    for da, db in zip(ra.devices, rb.devices, strict=True):
        assert db.busy_s == pytest.approx(da.busy_s, abs=1e-9)
        for cause, seconds in da.idle_by_cause_s.items():
            assert db.idle_by_cause_s[cause] == pytest.approx(seconds, abs=1e-9), cause
    assert [r.id for r in b.recommendations] == [r.id for r in a.recommendations]


def test_a_bad_profile_among_kineto_ranks_is_skipped_like_any_bad_file(tmp_path: Path) -> None:
    """A folder of PyTorch ranks with a damaged .xplane.pb beside them: the ranks are analysed, the profile is
    skipped with one warning naming it once (exit 1), as a damaged .json or .sqlite there would be."""
    for name in ("trace_filter__sampled_rank-0.json.gz", "trace_filter__sampled_rank-1.json.gz"):
        shutil.copy(DATA / name, tmp_path / name)
    (tmp_path / "worker.xplane.pb").write_bytes(b"not a protobuf at all")
    proc = subprocess.run([sys.executable, "-m", "gpuidle", "analyze", str(tmp_path), "--no-ledger", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"gpuidle: warning: skipped {tmp_path / 'worker.xplane.pb'}: not a readable XSpace")
    assert [r["rank"] for r in json.loads(proc.stdout)["ranks"]] == [0, 1]


def test_xla_dispatch_is_launch_overhead_not_python(tmp_path: Path) -> None:
    """The device idles while the host is inside ``PjitFunction(train_step)``, dispatching the next program: that is
    the framework's launch path (launch overhead: compile more of the loop into one program), not host Python."""
    from gpuidle.api import analyze
    from gpuidle.sources.xplane import xplane_pb2

    space = xplane_pb2.XSpace(hostnames=["node-a"])
    gpu = space.planes.add(id=1, name="/device:GPU:0")
    gpu.event_metadata[1].id, gpu.event_metadata[1].name = 1, "fusion_kernel"
    line = gpu.lines.add(id=5, name="Stream #5(Kernel)", timestamp_ns=0)
    host = space.planes.add(id=2, name="/host:CPU")
    host.event_metadata[1].id, host.event_metadata[1].name = 1, "PjitFunction(train_step)"
    py = host.lines.add(id=78, name="python", timestamp_ns=0)
    for i in range(4):  # kernel [i ms, i ms + 600 µs); dispatch of the next over the 400 µs gap
        at = i * 1_000_000
        line.events.add(metadata_id=1, offset_ps=at * 1000, duration_ps=600_000 * 1000)
        py.events.add(metadata_id=1, offset_ps=(at + 600_000) * 1000, duration_ps=400_000 * 1000)
    pb = tmp_path / "node-a.xplane.pb"
    pb.write_bytes(space.SerializeToString())
    report = analyze([pb])
    causes = {k: v for k, v in report.ranks[0].primary().idle_by_cause_s.items() if v}
    assert set(causes) == {"launch_overhead"}
    assert "cpu_compute" not in {r.cause for r in report.recommendations}
