"""The HTTP APIs of a broker: nsqd's and nsqlookupd's."""
