"""The HTTP APIs of a broker: nsqd's (nsqd.py) and nsqlookupd's (lookupd.py), each an
HttpServer of its own routes (server.py: WSGI, routing, nsqd's v1 responses, TLS and auth)."""
