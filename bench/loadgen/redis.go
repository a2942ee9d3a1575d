package loadgen

import (
	"bufio"
	"fmt"
	"strconv"
)

// redisConn speaks RESP2: requests are arrays of bulk strings; SET answers
// "+OK", GET a bulk string or the null bulk "$-1".
type redisConn struct {
	r   *bufio.Reader
	w   *bufio.Writer
	num [20]byte
}

func (c *redisConn) bulk(b []byte) {
	c.w.WriteByte('$')
	c.w.Write(strconv.AppendInt(c.num[:0], int64(len(b)), 10))
	c.w.WriteString("\r\n")
	c.w.Write(b)
	c.w.WriteString("\r\n")
}

func (c *redisConn) Set(key, value []byte) error {
	c.w.WriteString("*3\r\n$3\r\nSET\r\n")
	c.bulk(key)
	c.bulk(value)
	if err := c.w.Flush(); err != nil {
		return err
	}
	return readRedisStatus(c.r, "OK")
}

func (c *redisConn) Get(key, dst []byte) ([]byte, error) {
	c.w.WriteString("*2\r\n$3\r\nGET\r\n")
	c.bulk(key)
	if err := c.w.Flush(); err != nil {
		return nil, err
	}
	return readRedisBulk(c.r, dst)
}

// readRedisStatus reads a simple-string reply and checks it is want.
func readRedisStatus(r *bufio.Reader, want string) error {
	line, err := readLine(r)
	if err != nil {
		return err
	}
	switch {
	case len(line) > 0 && line[0] == '-':
		return ServerError(line[1:])
	case len(line) == 0 || line[0] != '+' || string(line[1:]) != want:
		return fmt.Errorf("%w: want +%s, got %q", ErrProtocol, want, line)
	}
	return nil
}

// readRedisBulk reads a bulk-string reply into dst: the value, ErrMiss for
// the null bulk, a ServerError for an error reply.
func readRedisBulk(r *bufio.Reader, dst []byte) ([]byte, error) {
	line, err := readLine(r)
	if err != nil {
		return nil, err
	}
	if len(line) == 0 {
		return nil, fmt.Errorf("%w: an empty reply line", ErrProtocol)
	}
	switch line[0] {
	case '$':
		n, ok := parseInt(line[1:])
		switch {
		case ok && n == -1:
			return nil, ErrMiss
		case !ok || n < 0:
			return nil, fmt.Errorf("%w: bulk length %q", ErrProtocol, line[1:])
		case n > int64(len(dst)):
			return nil, fmt.Errorf("%w: a value of %d bytes, more than the %d expected", ErrProtocol, n, len(dst))
		}
		return readData(r, dst, int(n))
	case '-':
		return nil, ServerError(line[1:])
	}
	return nil, fmt.Errorf("%w: want a bulk string, got %q", ErrProtocol, line)
}
