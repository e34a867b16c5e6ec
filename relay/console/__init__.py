"""`relay console`: a web console for what nsqadmin cannot show (dead letters, replay,
TTL, limits, dedup, order, partitions, brokers), on the store as relay-admin reads and
steers it, served by the broker's strict HTTP/1.1 front end (docs/console.md).

figures.py reads what pages show; pages.py and actions.py are the Flask views; app.py
puts them together with login, grants, CSRF and read-only mode; serve.py runs it.
"""
