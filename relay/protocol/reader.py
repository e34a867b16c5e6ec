"""Reading a client's commands: lines and sized bodies off its transport."""

from relay import codec
from relay.client import Client
from relay.errors import Disconnect

MAX_LINE = 16 * 1024


class Reader:
    """Reads lines and sized bodies from a client's transport (which IDENTIFY may upgrade
    mid-connection) without ever allocating an announced size before it is checked."""

    CHUNK = 64 * 1024

    def __init__(self, client: Client):
        self.client = client
        self.buf = bytearray()
        self.pos = 0

    @property
    def buffered(self) -> int:
        """Bytes read from the transport and not yet consumed."""
        return len(self.buf) - self.pos

    def _fill(self) -> None:
        chunk = self.client.transport.recv(self.CHUNK)
        if not chunk:
            raise EOFError
        if self.pos:
            del self.buf[:self.pos]
            self.pos = 0
        self.buf += chunk

    def line(self) -> bytes:
        while True:
            end = self.buf.find(b"\n", self.pos)
            if end >= 0:
                break
            if self.buffered > MAX_LINE:
                raise Disconnect("command line too long")
            try:
                self._fill()
            except EOFError:
                raise Disconnect("eof") from None
        if end - self.pos > MAX_LINE:
            raise Disconnect("command line too long")
        line = bytes(self.buf[self.pos:end])
        self.pos = end + 1
        return line[:-1] if line.endswith(b"\r") else line

    def buffered_argument(self, command: bytes, size: int) -> bytes | None:
        """The argument of the next command line if it is already read, is `command`
        with one argument of `size` bytes (e.g. b"FIN " and a message id), and nothing
        else; it is then consumed. Lets a handler take the same commands that follow
        it in one go, without reading from the socket."""
        start = self.pos + len(command)
        end = start + size
        if len(self.buf) <= end or not self.buf.startswith(command, self.pos):
            return None
        argument = bytes(self.buf[start:end])
        if b" " in argument or b"\r" in argument or b"\n" in argument:
            return None     # the line reader splits or strips these: let it
        if self.buf[end] == 10:
            self.pos = end + 1
        elif self.buf[end:end + 2] == b"\r\n":
            self.pos = end + 2
        else:
            return None
        return argument

    def exact(self, n: int) -> bytes:
        while self.buffered < n:
            self._fill()
        data = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return data

    def size(self) -> int:
        return codec.read_size(self.exact(4))
