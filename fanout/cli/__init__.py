"""fanout's command line.  The library never imports this package."""
