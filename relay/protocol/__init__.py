"""The NSQ TCP protocol V2: the wire codec and the command handlers."""
