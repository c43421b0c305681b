"""The results and scores files as data: records, locks, torn tails.

Below ``fanout.eval`` and ``fanout.batch`` (both read and write through it); it
imports neither.  ``results`` is the results file of a batch, ``scores`` the
scores file beside it, ``prompts`` the prompts file.
"""
