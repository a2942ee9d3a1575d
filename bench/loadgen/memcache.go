package loadgen

import (
	"bufio"
	"bytes"
	"fmt"
	"strconv"
)

// memcacheConn speaks memcached's text protocol: "set KEY 0 0 N" and its
// data block, answered "STORED"; "get KEY", answered "VALUE KEY FLAGS N",
// the data block and "END", or "END" alone for a miss.
type memcacheConn struct {
	r   *bufio.Reader
	w   *bufio.Writer
	num [20]byte
}

func (c *memcacheConn) Set(key, value []byte) error {
	c.w.WriteString("set ")
	c.w.Write(key)
	c.w.WriteString(" 0 0 ")
	c.w.Write(strconv.AppendInt(c.num[:0], int64(len(value)), 10))
	c.w.WriteString("\r\n")
	c.w.Write(value)
	c.w.WriteString("\r\n")
	if err := c.w.Flush(); err != nil {
		return err
	}
	line, err := readLine(c.r)
	if err != nil {
		return err
	}
	if string(line) != "STORED" {
		return memcacheError(line, "STORED")
	}
	return nil
}

func (c *memcacheConn) Get(key, dst []byte) ([]byte, error) {
	c.w.WriteString("get ")
	c.w.Write(key)
	c.w.WriteString("\r\n")
	if err := c.w.Flush(); err != nil {
		return nil, err
	}
	return readMemcacheValue(c.r, key, dst)
}

// memcacheError is the error for a line that is not the reply expected:
// the server's own error, or a protocol error.
func memcacheError(line []byte, want string) error {
	for _, p := range []string{"ERROR", "CLIENT_ERROR", "SERVER_ERROR"} {
		if bytes.HasPrefix(line, []byte(p)) {
			return ServerError(line)
		}
	}
	return fmt.Errorf("%w: want %s, got %q", ErrProtocol, want, line)
}

// readMemcacheValue reads the reply to "get KEY" into dst: the value of
// key (a VALUE line for another key is ErrProtocol), ErrMiss for "END"
// alone.
func readMemcacheValue(r *bufio.Reader, key, dst []byte) ([]byte, error) {
	line, err := readLine(r)
	if err != nil {
		return nil, err
	}
	if string(line) == "END" {
		return nil, ErrMiss
	}
	// VALUE <key> <flags> <bytes> [<cas unique>]
	rest, ok := bytes.CutPrefix(line, []byte("VALUE "))
	if !ok {
		return nil, memcacheError(line, "VALUE or END")
	}
	var f [4][]byte
	nf := 0
	for len(rest) > 0 && nf < len(f) {
		var field []byte
		field, rest, _ = bytes.Cut(rest, []byte(" "))
		f[nf] = field
		nf++
	}
	if len(rest) > 0 || nf < 3 {
		return nil, fmt.Errorf("%w: VALUE line %q", ErrProtocol, line)
	}
	if !bytes.Equal(f[0], key) {
		return nil, fmt.Errorf("%w: VALUE of key %q, asked for %q", ErrProtocol, f[0], key)
	}
	if _, ok := parseInt(f[1]); !ok {
		return nil, fmt.Errorf("%w: VALUE line %q: flags", ErrProtocol, line)
	}
	n, ok := parseInt(f[2])
	if !ok || n < 0 {
		return nil, fmt.Errorf("%w: VALUE line %q: length", ErrProtocol, line)
	}
	if n > int64(len(dst)) {
		return nil, fmt.Errorf("%w: a value of %d bytes, more than the %d expected", ErrProtocol, n, len(dst))
	}
	v, err := readData(r, dst, int(n))
	if err != nil {
		return nil, err
	}
	if line, err = readLine(r); err != nil {
		return nil, err
	}
	if string(line) != "END" {
		return nil, fmt.Errorf("%w: want END after the value, got %q", ErrProtocol, line)
	}
	return v, nil
}
