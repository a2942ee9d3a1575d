package loadgen

import (
	"bufio"
	"errors"
	"fmt"
	"io"
)

// Errors of a reply. A reply that does not parse leaves the connection at
// an unknown point of the stream: the run stops using it.
var (
	// ErrMiss: the server has no value for the key.
	ErrMiss = errors.New("loadgen: key not found")
	// ErrProtocol: a reply that is not what the protocol allows here.
	ErrProtocol = errors.New("loadgen: protocol error")
)

// ServerError is an error the server replied with (Redis "-ERR ...",
// memcached "SERVER_ERROR ..." and the like).
type ServerError string

func (e ServerError) Error() string { return "loadgen: server said " + string(e) }

// Protocol names a server's protocol.
type Protocol string

const (
	Redis     Protocol = "redis"     // RESP2
	Memcached Protocol = "memcached" // the text protocol
)

// Conn is a client connection speaking one protocol, one request at a
// time. Neither method allocates when the reply is what it should be.
type Conn interface {
	// Set stores value under key.
	Set(key, value []byte) error
	// Get reads key's value into dst and returns it (a prefix of dst). A
	// value longer than dst is ErrProtocol; an absent key ErrMiss.
	Get(key, dst []byte) ([]byte, error)
}

// NewConn returns a client of protocol p over rw (a net.Conn).
func NewConn(p Protocol, rw io.ReadWriter) (Conn, error) {
	switch p {
	case Redis:
		return &redisConn{r: bufio.NewReaderSize(rw, 16<<10), w: bufio.NewWriterSize(rw, 16<<10)}, nil
	case Memcached:
		return &memcacheConn{r: bufio.NewReaderSize(rw, 16<<10), w: bufio.NewWriterSize(rw, 16<<10)}, nil
	}
	return nil, fmt.Errorf("loadgen: unknown protocol %q (want redis or memcached)", p)
}

// readLine returns the next line with its "\r\n" cut, valid until the
// next read; a line longer than r's buffer is ErrProtocol.
func readLine(r *bufio.Reader) ([]byte, error) {
	line, err := r.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		return nil, fmt.Errorf("%w: a reply line longer than %d bytes", ErrProtocol, r.Size())
	}
	if err != nil {
		return nil, noEOF(err)
	}
	if len(line) < 2 || line[len(line)-2] != '\r' {
		return nil, fmt.Errorf("%w: a line not ended by CRLF", ErrProtocol)
	}
	return line[:len(line)-2], nil
}

// readData reads n bytes into dst and the "\r\n" after them.
func readData(r *bufio.Reader, dst []byte, n int) ([]byte, error) {
	if n > len(dst) {
		return nil, fmt.Errorf("%w: a value of %d bytes, more than the %d expected", ErrProtocol, n, len(dst))
	}
	if _, err := io.ReadFull(r, dst[:n]); err != nil {
		return nil, noEOF(err)
	}
	for _, want := range "\r\n" {
		c, err := r.ReadByte()
		if err != nil {
			return nil, noEOF(err)
		}
		if c != byte(want) {
			return nil, fmt.Errorf("%w: data not followed by CRLF", ErrProtocol)
		}
	}
	return dst[:n], nil
}

// noEOF turns the end of the stream in the middle of a reply into
// io.ErrUnexpectedEOF: the server closed the connection (or died).
func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// parseInt parses a decimal integer of at most 18 digits, with an
// optional minus sign, without allocating.
func parseInt(b []byte) (int64, bool) {
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	if len(b) == 0 || len(b) > 18 {
		return 0, false
	}
	var v int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int64(c-'0')
	}
	if neg {
		v = -v
	}
	return v, true
}
