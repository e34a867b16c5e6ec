"""A clock a test sets by hand, for code that takes a `clock` callable."""


class Clock:
    """Returns `now` (seconds) until the test moves it."""

    def __init__(self, now=1000.0):
        self.now = now

    def __call__(self):
        return self.now
