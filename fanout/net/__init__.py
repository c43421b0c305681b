"""fanout's I/O layer: the HTTP client and one stream's request, deadlines and retries."""
