"""``bench storage`` on a generated dataset folder: many small files and two large ones."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from gpuidle.cli import main
from gpuidle.errors import GpuidleError, InputNotFound
from gpuidle.probes import storage
from gpuidle.report.bench import render

SMALL, SMALL_BYTES = 1200, 1024
BIG, BIG_BYTES = 2, 4 << 20


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("imagenet")
    for shard in range(3):
        (root / f"class{shard}").mkdir()
    for i in range(SMALL):
        (root / f"class{i % 3}" / f"{i:05d}.jpg").write_bytes(os.urandom(SMALL_BYTES))
    (root / "big").mkdir()
    for i in range(BIG):
        (root / "big" / f"part{i}.bin").write_bytes(os.urandom(BIG_BYTES))
    (root / "empty.txt").write_bytes(b"")
    return root


@pytest.fixture(scope="module")
def result(dataset: Path) -> storage.StorageResult:
    return storage.bench_storage(dataset, budget_s=1.0)


def test_listing(result: storage.StorageResult) -> None:
    ls = result.listing
    assert result.schema == "gpuidle.bench.storage/1"
    assert ls.files == SMALL + BIG  # the empty file is left out
    assert ls.complete
    assert ls.total_bytes == SMALL * SMALL_BYTES + BIG * BIG_BYTES
    assert ls.median_bytes == SMALL_BYTES
    assert ls.largest_bytes == BIG_BYTES


def test_three_phases_with_consistent_figures(result: storage.StorageResult) -> None:
    by = {p.name: p for p in result.phases}
    assert set(by) == {"files", "sequential", "random"}
    for p in result.phases:
        assert p.bytes > 0
        assert p.reads > 0
        assert p.seconds > 0
        assert p.mb_per_s == pytest.approx(p.bytes / p.seconds / 1e6)
    assert by["files"].files_per_s == pytest.approx(by["files"].files / by["files"].seconds)
    assert by["random"].iops == pytest.approx(by["random"].reads / by["random"].seconds)
    assert by["random"].block_bytes == 64 << 10
    assert by["sequential"].block_bytes == 4 << 20
    for p in result.phases:
        assert p.mean_read_bytes == p.bytes // p.reads
    # the small files are read whole, the 4 MiB files in 4 MiB reads: never the one for the other
    assert by["files"].mean_read_bytes == SMALL_BYTES
    assert by["sequential"].mean_read_bytes == BIG_BYTES
    assert by["sequential"].files == 1
    assert by["random"].files == 1


def test_many_small_files_get_the_sharding_advice(result: storage.StorageResult) -> None:
    assert len(result.advice) == 1
    assert "WebDataset" in result.advice[0]
    assert "TFRecord" in result.advice[0]
    assert "1,202 files with a median of 1 KiB" in result.advice[0]
    by = {p.name: p for p in result.phases}
    f, sq = by["files"], by["sequential"]
    # the comparison says what the table says, in the table's own figures and direction
    assert f"{f.mb_per_s:,.1f} MB/s" in result.advice[0]
    assert f"{sq.mb_per_s:,.1f} MB/s" in result.advice[0]
    if f.mb_per_s is not None and sq.mb_per_s is not None and f.mb_per_s < sq.mb_per_s:
        assert f"({sq.mb_per_s / f.mb_per_s:.1f}× faster)" in result.advice[0]
    else:
        assert "no slower than" in result.advice[0]


def test_freshly_written_files_are_called_optimistic(result: storage.StorageResult) -> None:
    # the files were just written: their pages are in the page cache
    assert result.cached_share is not None
    assert result.cached_share > 0.5
    assert any("page cache" in n and "optimistic" in n for n in result.notes)
    assert any("fits in RAM" in n for n in result.notes)


def test_drop_cache_evicts_what_the_kernel_lets_go(dataset: Path) -> None:
    for f in (dataset / "big").iterdir():  # written back, so clean pages the kernel may drop
        fd = os.open(f, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    warm = storage.bench_storage(dataset / "big", budget_s=0.3)
    cold = storage.bench_storage(dataset / "big", budget_s=0.3, drop_cache=True)
    assert cold.drop_cache
    seq_warm = next(p for p in warm.phases if p.name == "sequential")
    seq_cold = next(p for p in cold.phases if p.name == "sequential")
    assert seq_warm.cached_share == 1.0
    if _fs_type(dataset) in ("tmpfs", "ramfs", None):
        pytest.skip("a memory filesystem keeps every page: nothing to evict")
    assert seq_cold.cached_share is not None
    assert seq_cold.cached_share < 0.5


def _fs_type(path: Path) -> str | None:
    """The filesystem holding ``path``, from /proc/mounts (longest mount point that contains it)."""
    try:
        mounts = [line.split()[1:3] for line in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return None
    real = str(path.resolve())
    best = max((m for m in mounts if real == m[0] or real.startswith(m[0].rstrip("/") + "/")),
               key=lambda m: len(m[0]), default=None)
    return best[1] if best else None


def test_few_large_files_need_no_shards(dataset: Path) -> None:
    r = storage.bench_storage(dataset / "big", budget_s=0.3)
    assert r.listing.files == BIG
    assert r.advice == []


def test_advice_rule_by_hand() -> None:
    listing = storage.Listing(files=5000, complete=True, total_bytes=5000 * 100_000, median_bytes=100_000,
                              mean_bytes=100_000.0, largest_bytes=200_000)
    advice, notes = storage.storage_advice(listing, [], 0.1, 64 << 30, drop=False, complete=True)
    assert len(advice) == 1
    assert "5,000 files" in advice[0]
    assert not any("optimistic" in n for n in notes)
    big = storage.Listing(files=5000, complete=True, total_bytes=100 << 30, median_bytes=20 << 20,
                          mean_bytes=float(20 << 20), largest_bytes=30 << 20)
    advice, notes = storage.storage_advice(big, [], None, 64 << 30, drop=False, complete=True)
    assert advice == []
    assert any("does not fit" in n for n in notes)
    assert any("unknown" in n for n in notes)


def test_a_single_file(dataset: Path) -> None:
    r = storage.bench_storage(dataset / "big" / "part0.bin", budget_s=0.3)
    assert r.listing.files == 1


def test_bad_paths(tmp_path: Path) -> None:
    with pytest.raises(InputNotFound, match="no such file"):
        storage.bench_storage(tmp_path / "missing")
    (tmp_path / "e").mkdir()
    with pytest.raises(InputNotFound, match="no non-empty files"):
        storage.bench_storage(tmp_path / "e")
    with pytest.raises(GpuidleError, match="positive"):
        storage.bench_storage(tmp_path, budget_s=0)


def test_inputs_are_only_read(dataset: Path) -> None:
    before = {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in (dataset / "class0").iterdir()}
    storage.bench_storage(dataset / "class0", budget_s=0.2)
    assert {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in (dataset / "class0").iterdir()} == before


def test_cli(dataset: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "storage", str(dataset), "--budget-s", "0.5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["schema"] == "gpuidle.bench.storage/1"
    assert main(["bench", "storage", str(dataset / "big"), "--budget-s", "0.3"]) == 0
    text = capsys.readouterr().out
    assert "sequential" in text
    assert "from cache" in text
    assert main(["bench", "storage", str(dataset / "nope")]) == 2
    assert capsys.readouterr().err.startswith("gpuidle: error: ")


def test_render(result: storage.StorageResult) -> None:
    text = render(result)
    assert "advice:" in text
    assert "files/s" in text


# ------------------------------------------------------------------ which phase reads which file

SEQ, BLOCK = 4 << 20, 64 << 10


def _folder(root: Path, sizes: list[int]) -> dict[str, int]:
    root.mkdir()
    out = {}
    for i, n in enumerate(sizes):
        p = root / f"f{i:04d}.bin"
        p.write_bytes(os.urandom(n))
        out[str(p)] = n
    return out


def _run_logged(root: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[storage.StorageResult, dict[str, set[str]]]:
    """The result, and the files each phase opened (phases told apart by the progress calls between them)."""
    opened: list[str] = []
    by_phase: dict[str, set[str]] = {}
    real_open = os.open

    def logging_open(path: str, flags: int, *args: int) -> int:
        if str(path).startswith(str(root)):
            opened.append(str(path))
        return real_open(path, flags, *args)

    def progress(name: str, done: int, total: int) -> None:
        by_phase[name] = set(opened)
        opened.clear()

    monkeypatch.setattr(os, "open", logging_open)
    result = storage.bench_storage(root, budget_s=30.0, progress=progress)
    monkeypatch.undo()
    return result, by_phase


def _expect(sizes: dict[str, int], result: storage.StorageResult, by_phase: dict[str, set[str]]) -> None:
    """Disjoint phases, each on files of its kind, every file read in full, read sizes from the file sizes."""
    names = list(by_phase)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not by_phase[a] & by_phase[b], (a, b)
    large = [p for p, n in sizes.items() if n >= SEQ]
    medium = [p for p, n in sizes.items() if 2 * BLOCK < n < SEQ]
    by = {p.name: p for p in result.phases}
    assert set(by) == set(by_phase)
    if "sequential" in by:
        seq = by_phase["sequential"]
        assert seq <= set(large)
        reads = sum(-(-sizes[p] // SEQ) for p in seq)
        assert by["sequential"].reads == reads
        assert by["sequential"].bytes == sum(sizes[p] for p in seq)
        assert by["sequential"].mean_read_bytes == sum(sizes[p] for p in seq) // reads
    if "random" in by:
        rnd = by_phase["random"]
        assert rnd <= set(large if len(large) >= 2 else medium)
        assert by["random"].files == len(rnd)
        assert by["random"].mean_read_bytes == BLOCK  # offsets leave room for a whole block
    if "files" in by:
        whole = by_phase["files"]
        assert by["files"].files == len(whole)
        assert by["files"].reads == len(whole)
        assert by["files"].mean_read_bytes == sum(min(sizes[p], 8 << 20) for p in whole) // len(whole)
    assert set().union(*by_phase.values()) == set(sizes)  # a budget long enough for every file


def test_many_small_files_have_only_whole_file_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sizes = _folder(tmp_path / "small", [4096] * 300)
    result, by_phase = _run_logged(tmp_path / "small", monkeypatch)
    assert list(by_phase) == ["files"]
    _expect(sizes, result, by_phase)
    assert by_phase["files"] == set(sizes)
    assert result.phases[0].mean_read_bytes == 4096
    assert any(n.startswith("sequential phase skipped: no file of 4 MiB or more") for n in result.notes)
    assert any(n.startswith("random phase skipped: no file of over 128 KiB") for n in result.notes)
    assert "streaming" not in " ".join(result.advice)


def test_few_large_files_are_streamed_and_read_at_random(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sizes = _folder(tmp_path / "large", [SEQ + SEQ // 2, SEQ * 2, SEQ])
    result, by_phase = _run_logged(tmp_path / "large", monkeypatch)
    assert list(by_phase) == ["sequential", "random"]
    _expect(sizes, result, by_phase)
    # largest first, alternately: the 8 MiB and 4 MiB files streamed, the 6 MiB one read at random
    order = sorted(sizes, key=lambda p: -sizes[p])
    assert by_phase["sequential"] == {order[0], order[2]}
    assert by_phase["random"] == {order[1]}
    seq = next(p for p in result.phases if p.name == "sequential")
    assert seq.reads == 3  # 8 MiB in two 4 MiB reads, 4 MiB in one
    assert seq.mean_read_bytes == SEQ
    assert any(n.startswith("whole-file phase skipped") for n in result.notes)


def test_a_mixed_folder_splits_without_overlap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sizes = _folder(tmp_path / "mixed", [SEQ + 12345] + [300 << 10] * 9 + [2048] * 40)
    result, by_phase = _run_logged(tmp_path / "mixed", monkeypatch)
    assert list(by_phase) == ["files", "sequential", "random"]
    _expect(sizes, result, by_phase)
    # one large file: streamed; the 9 medium files alternate, random first, the rest read whole
    assert by_phase["sequential"] == {p for p, n in sizes.items() if n >= SEQ}
    assert len(by_phase["random"]) == 5
    assert by_phase["files"] == set(sizes) - by_phase["sequential"] - by_phase["random"]
    seq = next(p for p in result.phases if p.name == "sequential")
    assert (seq.reads, seq.mean_read_bytes) == (2, (SEQ + 12345) // 2)


def test_assign_files_caps_the_random_pool() -> None:
    files = [(f"m{i}", 1 << 20) for i in range(200)]
    out = storage.assign_files(files, BLOCK, random.Random(1))
    assert len(out["random"]) == storage.RANDOM_FILES
    assert len(out["files"]) == 200 - storage.RANDOM_FILES
    assert out["sequential"] == []


def test_one_small_file_gives_no_rate(tmp_path: Path) -> None:
    """One 458-byte read is no files/s nor MB/s: the table shows none and the note says why."""
    (tmp_path / "one.txt").write_bytes(b"x" * 458)
    result = storage.bench_storage(tmp_path, budget_s=0.2)
    (files,) = result.phases
    assert (files.name, files.reads, files.bytes) == ("files", 1, 458)
    assert (files.files_per_s, files.mb_per_s, files.iops) == (None, None, None)
    assert any("too few reads for a rate in files" in n for n in result.notes)
