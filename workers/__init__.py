"""relay's worker processes: the scanner (workers.scanner) and the rq jobs worker (workers.jobs)."""
