"""relay's worker processes (installed as relay.workers): the scanner and the rq jobs worker."""
