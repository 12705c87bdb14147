"""One DVC stage each: a run_<stage> function and a click command that only parses."""
