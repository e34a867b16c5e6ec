"""The NSQ TCP protocol V2: the connection loop and the command handlers (the wire codec is relay.codec)."""
