"""Evaluation: scorers, statistics and cost as pure functions over records.

Everything here is sans-I/O except ``fanout.eval.run``, which sends the judge's
requests through ``open_fanout``.  The scorers' public face is
``fanout.eval.scorers``; the judge's pure half is ``fanout.eval.judge``.
"""
