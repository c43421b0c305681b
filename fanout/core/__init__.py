"""The sans-I/O core: bytes in, events and results out.  No trio, no httpx.

This package imports only the standard library, attrs and (optionally)
orjson and jsonschema; a test holds it to that.
"""
