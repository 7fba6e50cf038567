"""Where the work of an analysis runs, and on what.

:mod:`.plan` decides what each input is (one job's traces, a tracker folder, a folder of jobs) and which
reader takes it; :mod:`.rank` is the one per-rank function (open one trace, reduce it to the compact
:class:`~gpuidle.analysis.summary.RankAnalysis`); :mod:`.executors` runs that function on a local process
pool (the default) or, given a scheduler, on a Dask cluster (:mod:`.cluster`); :mod:`.merge` turns the
per-rank results into a job's report, the same code whichever executor ran them.
"""
