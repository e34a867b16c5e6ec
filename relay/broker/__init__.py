"""The broker process (`relay broker`): NSQ's TCP protocol V2 (protocol/) and nsqd's and
nsqlookupd's HTTP APIs (http/) over the Store, with each client's state (client.py),
one delivery loop per channel (channel.py) and wake-ups from Redis (wakeups.py)."""
