"""What a trace claims about its job (world size, rank, process groups) is believed only as far as it holds
together: whatever a profiler wrote, nothing is sized from a claimed number alone, and what is set aside is
named in one note."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuidle.api import analyze
from gpuidle.model import TRACKER_FORMAT, TraceMeta, TrackerEnd, TrackerHeader, TrackerStep, ranges
from gpuidle.report.html import HtmlRenderer
from gpuidle.report.markdown import MarkdownRenderer
from gpuidle.report.terminal import TerminalRenderer
from gpuidle.sources.job_facts import MAX_WORLD, check_job_facts
from minitrace import Trace

ALLREDUCE = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
CLAIMS = st.one_of(st.integers(min_value=-(2**70), max_value=2**1100), st.text(max_size=8), st.none(),
                   st.booleans(), st.floats(allow_nan=True))


def job(tmp_path: Path, world: int | None, groups: Any, ranks: tuple[int, ...] = (0, 1)) -> list[Path]:
    """Two ranks of four 10 ms steps, each step a 6 ms kernel and a 2 ms all-reduce on group '4'."""
    out = []
    for r in ranks:
        t = Trace(rank=r, world=world, groups=groups(r) if callable(groups) else groups)
        for n in range(4):
            b = n * 10_000.0
            t.step(n + 1, b, 10_000)
            t.launch(at=b + 5, call_dur=5, start=b + 10, dur=6000)
            t.op("record_param_comms", b + 20, 10, **{"Collective name": "allreduce", "Group size": 2,
                                                    "Process Group Name": "4"})
            t.launch(at=b + 22, call_dur=5, start=b + 6100, dur=2000, stream=20, name=ALLREDUCE)
        out.append(t.write(tmp_path / f"rank{r}.json.gz"))
    return out


@settings(max_examples=300, deadline=None)
@given(world=st.one_of(st.none(), st.integers(min_value=-5, max_value=2**40)),
       rank=st.one_of(st.none(), st.integers(min_value=0, max_value=2**31)),
       groups=st.lists(st.fixed_dictionaries(
           {"pg_name": st.text(max_size=3), "pg_desc": st.sampled_from(["mesh_dp", "mesh_tp", "default_pg", ""])},
           optional={"pg_size": CLAIMS, "ranks": st.one_of(CLAIMS, st.lists(CLAIMS, max_size=6),
                                                           st.lists(st.integers(-3, 40), max_size=12))}),
           max_size=6))
def test_what_is_kept_holds_together_and_what_is_not_is_named(world: int | None, rank: int | None,
                                                              groups: list[dict[str, Any]]) -> None:
    meta = TraceMeta(path="x", format="kineto", t0_ns=0, rank=rank, world_size=world, process_groups=groups)
    check_job_facts(meta)
    kept = meta.world_size
    assert kept is None or (1 <= kept <= MAX_WORLD and (rank is None or rank < kept))
    limit = kept or MAX_WORLD
    for g in meta.process_groups:
        size = g.get("pg_size")
        assert size is None or (type(size) is int and 1 <= size <= limit)
        listed = g.get("ranks") or []
        assert all(type(r) is int and 0 <= r < limit for r in listed)
        assert len(set(listed)) == len(listed)
        assert size is None or not listed or size == len(listed)
    dropped = len(groups) - len(meta.process_groups)
    notes = [n for n in meta.notes if "set aside" in n]
    assert len(notes) == (dropped > 0) + (kept != world)
    assert all(len(n) < 400 for n in meta.notes)


def test_a_world_beyond_any_job_is_a_job_of_the_traces_given(tmp_path: Path) -> None:
    """distributedInfo.world_size 2³¹ − 1 in a folder of two ranks: no rank list the size of that world."""
    report = analyze(job(tmp_path, 2**31 - 1, None))
    assert report.job is not None
    assert report.job.world_size is None
    assert report.job.missing_ranks == []
    notes = [n for r in report.ranks for n in r.notes if "world size 2147483647" in n]
    assert len(notes) == 2
    assert "set aside" in notes[0]


def test_groups_larger_than_the_world_or_outside_it_are_set_aside(tmp_path: Path) -> None:
    """16 groups of 2¹⁰⁰⁰ ranks (digits beyond what Python prints), tp 2⁷⁰ in a world of 8, a group listing rank
    9 and a rank twice: none is believed, each reason named once, and every renderer prints the report."""
    groups = ([{"pg_name": str(i), "pg_desc": "mesh_tp", "pg_size": 2**1000} for i in range(16)]
              + [{"pg_name": "20", "pg_desc": "mesh_dp", "pg_size": 4, "ranks": [0, 9, 2, 3]},
                 {"pg_name": "21", "pg_desc": "mesh_cp", "pg_size": 2, "ranks": [1, 1]},
                 {"pg_name": "22", "pg_desc": "mesh_pp", "pg_size": 2**70}])
    report = analyze(job(tmp_path, 8, groups))
    assert MarkdownRenderer().render(report)
    assert HtmlRenderer().render(report)
    rank = report.ranks[0]
    (note,) = [n for n in rank.notes if "set aside" in n]
    assert note.startswith("19 process group(s) of 19 set aside (pg_config): 'mesh_tp': its size (a 302-digit "
                           "number) is larger than the world of 8 (16 groups); 'mesh_dp': rank 9 lies outside")
    assert all(m.size is None or m.size <= 8 for m in rank.communication.mesh)
    assert len(TerminalRenderer().render(report).splitlines()) < 200
    assert report.to_json()


def test_a_thousand_rank_mesh_with_two_ranks_traced_names_its_gap_in_one_line(tmp_path: Path) -> None:
    """tp 2 × dp 512 with ranks 0 and 1 profiled: one note for the 511 data-parallel places without a trace."""
    groups = [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 1024, "ranks": []},
              {"pg_name": "4", "pg_desc": "mesh_dp", "pg_size": 512, "ranks": None},
              {"pg_name": "7", "pg_desc": "mesh_tp", "pg_size": 2, "ranks": [0, 1]}]
    report = analyze(job(tmp_path, 1024, lambda r: [{**g, "ranks": list(range(r, 1024, 2))}
                                                   if g["pg_name"] == "4" else g for g in groups]))
    assert report.job is not None
    gaps = [n for n in report.job.notes if n.startswith("no trace of")]
    assert gaps == ["no trace of 1,022 ranks, dp 1-511 (ranks 2-1023): not in this analysis"]
    assert len(TerminalRenderer().render(report).splitlines()) < 200


def test_a_group_past_the_listed_size_is_counted_not_listed(tmp_path: Path) -> None:
    """tp 2 × dp 10,000 with ranks 0 and 1 traced: no rank's report lists 10,000 ranks of its dp group (one such list
    per rank grows with the square of the job); the job counts the ranks it misses."""
    groups = [{"pg_name": "4", "pg_desc": "mesh_dp", "pg_size": 10_000, "ranks": None},
              {"pg_name": "7", "pg_desc": "mesh_tp", "pg_size": 2, "ranks": [0, 1]}]
    report = analyze(job(tmp_path, 20_000, lambda r: [{**g, "ranks": list(range(r, 20_000, 2))}
                                                     if g["pg_name"] == "4" else g for g in groups]))
    assert report.job is not None
    assert all(m.ranks == [] for r in report.ranks for m in r.communication.mesh if m.dim == "dp")
    assert "2 of 20000 ranks present: waits are relative to the ranks present" in report.job.notes
    assert len(report.to_json()) < 300_000


def test_a_tracker_log_s_world_is_checked_as_a_trace_s(tmp_path: Path) -> None:
    """Two ranks' tracker logs claiming a world of 2³¹ − 1 and a tensor-parallel group of 2⁷⁰: no rank list the
    size of that world, the group set aside, one note each."""
    for rank in (0, 1):
        lines = [TrackerHeader(format=TRACKER_FORMAT, rank=rank, world_size=2**31 - 1, timing="host",
                               process_groups=[{"pg_name": "1", "pg_desc": "mesh_tp", "pg_size": 2**62}]),
                 *(TrackerStep(step=k, start_ns=k * 10**7, dur_ns=10**7, data_ns=10**6) for k in range(8)),
                 TrackerEnd(steps=8)]
        (tmp_path / f"rank-{rank}.jsonl").write_bytes(b"\n".join(msgspec.json.encode(x) for x in lines) + b"\n")
    report = analyze([tmp_path])
    assert report.job is not None
    assert report.job.world_size == 2
    assert report.job.missing_ranks == []
    notes = report.ranks[0].notes
    assert any("world size 2147483647 is more ranks than any job runs" in n for n in notes)
    assert any("1 process group(s) of 1 set aside (pg_config): 'mesh_tp': its size (a 19-digit number) is more ranks"
               " than any job runs" in n for n in notes)


def test_a_world_smaller_than_its_collectives_is_set_aside(tmp_path: Path) -> None:
    """Both ranks claim a world of 1 while their all-reduces name groups of 2: rank 0 alone held together
    with its world, and printed a world of 1 beside a data-parallel dimension of 2."""
    report = analyze(job(tmp_path, 1, [{"pg_name": "4", "pg_desc": "default_pg"}]))
    for r in report.ranks:
        assert r.world_size is None
        assert [(m.dim, m.size) for m in r.communication.mesh] == [("dp", 2)]
    assert "a collective of 2 ranks is larger than the trace's world of 1: the world size is set aside" in \
        report.ranks[0].notes


def test_a_large_world_lists_its_lowest_missing_ranks_and_counts_them_all(tmp_path: Path) -> None:
    """Two traces of a claimed 164,060-rank job: 164,058 missing ranks once made a 1.2 MB report."""
    from gpuidle.model import MISSING_LISTED

    report = analyze(job(tmp_path, 164_060, []))
    assert report.job is not None
    assert report.job.missing_ranks == list(range(2, 2 + MISSING_LISTED))
    assert report.job.missing_count() == 164_058
    assert len(report.to_json()) < 1 << 16
    assert f"missing ranks: 2-{MISSING_LISTED + 1} and {164_058 - MISSING_LISTED:,} more" in \
        TerminalRenderer().render(report)


GROUP = st.fixed_dictionaries(
    {"pg_name": st.sampled_from(["0", "4", "7"]),
     "pg_desc": st.sampled_from(["default_pg", "mesh_dp", "mesh_tp", "mesh_pp", "TENSOR_MODEL_PARALLEL_GROUP"])},
    optional={"pg_size": st.one_of(st.integers(-2, 2**80), st.just(2**1000)),
              "ranks": st.lists(st.integers(-3, 2**40), max_size=6)})


@settings(max_examples=15, deadline=None)
@given(world=st.one_of(st.none(), st.integers(1, 2**31 - 1)), groups=st.lists(GROUP, max_size=5))
def test_any_claims_of_two_ranks_give_a_short_report(world: int | None, groups: list[dict[str, Any]]) -> None:
    """Two ranks whatever their world and groups claim: a report in every format, within a screenful."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        report = analyze(job(Path(d), world, groups))
    assert len(TerminalRenderer().render(report).splitlines()) < 200
    assert len(report.to_json()) < 1 << 20
    assert MarkdownRenderer().render(report)
    assert HtmlRenderer().render(report)
    for r in report.ranks:
        assert all(m.size is None or m.size <= (r.world_size or MAX_WORLD) ** 5 for m in r.communication.mesh)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=-50, max_value=50), max_size=40))
def test_ranges_read_back_as_the_numbers(xs: list[int]) -> None:
    back: set[int] = set()
    for part in filter(None, ranges(xs).split(", ")):
        first, _, last = part[1:].partition("-")
        lo = int(part[0] + first)
        back |= set(range(lo, int(last) + 1)) if last else {lo}
    assert back == set(xs)
