"""Moved: the record shapes are public as ``fanout.records`` (front ends share them)."""

from ..records import event_record, metrics, result_record, tokens_per_second

__all__ = ["event_record", "metrics", "result_record", "tokens_per_second"]
